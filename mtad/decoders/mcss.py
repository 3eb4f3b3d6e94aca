"""MCSS (Yang et al., arXiv 2401.06706): SpecInfer's tree with siblings drawn without replacement. Lossless.

Drafting: ``mtad.propose.tree.Tree`` with the ``without_replacement`` sampler (the proposer
``tree_without_replacement``); after
top-k/top-p a node may have fewer nonzero draft tokens than k: it then gets fewer children,
never duplicates. Verification updates Q after each rejected sibling
(``mtad.verify.multidraft.MultiDraft("mcss")``).
"""

from __future__ import annotations

from mtad.decoders.compose import Composition


class MCSS(Composition):
    """Fields: the pieces' knobs (``k_config``; gamma = its length)."""

    name = "mcss"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    proposer, verifier = "tree_without_replacement", "mcss"

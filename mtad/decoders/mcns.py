"""MCNS: multi-candidate naive sampling, the trivial lossless multi-candidate baseline.

Same i.i.d. tree as SpecInfer (``mtad.propose.tree.Tree``); at each node draw y ~ p and keep
the child carrying y if there is one, else emit y and stop
(``mtad.verify.multidraft.MultiDraft("mcns")``).
"""

from __future__ import annotations

from mtad.decoders.compose import Composition


class MCNS(Composition):
    """Fields: the pieces' knobs (``k_config``; gamma = its length)."""

    name = "mcns"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    proposer, verifier = "tree", "mcns"

"""SpecTr (Sun et al., NeurIPS 2023): k i.i.d. chain drafts, k-sequential selection per depth. Lossless.

k chains of length gamma drawn from the warped draft (one draft pass per depth for
all chains: ``mtad.propose.tree.Chains``), one target pass over the k branches, then K-SEQ
verification with rho* found by bisection, drafts pruned as they disagree with the accepted
prefix (``mtad.verify.multidraft.MultiDraft("spectr")``).
"""

from __future__ import annotations

from mtad.decoders.compose import Composition


class SpecTr(Composition):
    """i.i.d. chains, SpecTr's rule. Fields: the pieces' knobs (``gamma``, ``num_drafts``)."""

    name = "spectr"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    proposer, verifier = "chains", "spectr"

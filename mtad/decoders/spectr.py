"""SpecTr (Sun et al., NeurIPS 2023): k i.i.d. chain drafts, k-sequential selection per depth. Lossless.

k chains of length gamma drawn from the warped draft (one draft pass per depth for
all chains: ``mtad.propose.tree.Chains``), one target pass over the k branches, then K-SEQ
verification with rho* found by bisection, drafts pruned as they disagree with the accepted
prefix (``mtad.verify.multidraft.MultiDraft("spectr")``).
"""

from __future__ import annotations

from mtad.core.decoder import check_positive_int
from mtad.decoders.compose import Composition
from mtad.propose.tree import Chains
from mtad.verify.multidraft import MultiDraft


class SpecTr(Composition):
    name = "spectr"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    shape_knobs = ("gamma",)

    def __init__(self, gamma: int = 4, num_drafts: int = 4, name: str | None = None):
        super().__init__(name)
        self.gamma = check_positive_int("gamma", gamma)
        self.num_drafts = check_positive_int("num_drafts", num_drafts)
        self.compose(Chains(self.num_drafts), MultiDraft("spectr"))

"""MCNS: multi-candidate naive sampling, the trivial lossless multi-candidate baseline.

Same i.i.d. tree as SpecInfer (``mtad.propose.tree.Tree``); at each node draw y ~ p and keep
the child carrying y if there is one, else emit y and stop
(``mtad.verify.multidraft.MultiDraft("mcns")``).
"""

from __future__ import annotations

from mtad.decoders.compose import Composition
from mtad.propose.tree import Tree, check_branching
from mtad.verify.multidraft import MultiDraft


class MCNS(Composition):
    name = "mcns"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    shape_knobs = ("gamma",)

    def __init__(self, k_config=(4, 2, 2), name: str | None = None):
        super().__init__(name)
        self.k_config = check_branching("k_config", k_config)
        self.compose(Tree(self.k_config, "iid"), MultiDraft("mcns"))

    @property
    def gamma(self) -> int:
        return len(self.k_config)

"""SpecInfer (Miao et al., ASPLOS 2024): i.i.d. token tree + multi-step speculative sampling. Lossless.

A tree with branching ``k_config`` (e.g. [4, 2, 2]: 4 children of the root, 2
per depth-1 node, 2 per depth-2 node; gamma = its length) drawn i.i.d. from the
warped draft (``mtad.propose.tree.Tree``), verified by one target pass
(``mtad.verify.multidraft.MultiDraft("specinfer")``). Near the end the tree keeps its first
levels.
"""

from __future__ import annotations

from mtad.decoders.compose import Composition
from mtad.propose.tree import Tree, check_branching
from mtad.verify.multidraft import MultiDraft


class SpecInfer(Composition):
    name = "specinfer"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    shape_knobs = ("gamma",)

    def __init__(self, k_config=(4, 2, 2), name: str | None = None):
        super().__init__(name)
        self.k_config = check_branching("k_config", k_config)
        self.compose(Tree(self.k_config, "iid"), MultiDraft("specinfer"))

    @property
    def gamma(self) -> int:
        return len(self.k_config)

"""MCSS (Yang et al., arXiv 2401.06706): SpecInfer's tree with siblings drawn without replacement. Lossless.

Drafting: ``mtad.propose.tree.Tree`` with the ``without_replacement`` sampler; after
top-k/top-p a node may have fewer nonzero draft tokens than k: it then gets fewer children,
never duplicates. Verification updates Q after each rejected sibling
(``mtad.verify.multidraft.MultiDraft("mcss")``).
"""

from __future__ import annotations

from mtad.decoders.compose import Composition
from mtad.propose.tree import Tree, check_branching
from mtad.verify.multidraft import MultiDraft


class MCSS(Composition):
    name = "mcss"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    shape_knobs = ("gamma",)

    def __init__(self, k_config=(4, 2, 2), name: str | None = None):
        super().__init__(name)
        self.k_config = check_branching("k_config", k_config)
        self.compose(Tree(self.k_config, "without_replacement"), MultiDraft("mcss"))

    @property
    def gamma(self) -> int:
        return len(self.k_config)

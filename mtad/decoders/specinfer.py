"""SpecInfer (Miao et al., ASPLOS 2024): i.i.d. token tree + multi-step speculative sampling. Lossless.

A tree with branching ``k_config`` (e.g. [4, 2, 2]: 4 children of the root, 2
per depth-1 node, 2 per depth-2 node; gamma = its length) drawn i.i.d. from the
warped draft, verified by one target pass (``mtad.verify.multidraft.verify_specinfer``).
"""

from __future__ import annotations

from mtad.core.decoder import Decoder, StepContext, StepOutput, target_only
from mtad.propose.tree import check_branching, draft_tree, iid_children, score_tree
from mtad.verify.multidraft import verify_specinfer


class SpecInfer(Decoder):
    name = "specinfer"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    sampler = staticmethod(iid_children)
    verify = staticmethod(verify_specinfer)

    def __init__(self, k_config=(4, 2, 2), name: str | None = None):
        super().__init__(name)
        self.k_config = check_branching("k_config", k_config)

    @property
    def gamma(self) -> int:
        return len(self.k_config)

    def step(self, ctx: StepContext) -> StepOutput:
        ks = self.k_config[: max(ctx.remaining - 1, 0)]
        if not ks:
            return target_only(ctx)
        tree = draft_tree(ctx, ks, self.sampler)
        p = score_tree(ctx, tree)
        path, y = self.verify(tree.parents, tree.tokens, p, tree.q, ctx.generator)
        return StepOutput(tokens=tree.path_tokens(path) + [y], drafted=len(ks), accepted=len(path),
                          tree_size=len(tree.unique_rows))

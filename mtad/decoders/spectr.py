"""SpecTr (Sun et al., NeurIPS 2023): k i.i.d. chain drafts, k-sequential selection per depth. Lossless.

k chains of length gamma drawn from the warped draft (one draft pass per depth for
all chains), one target pass over the k branches, then K-SEQ verification with
rho* found by bisection, drafts pruned as they disagree with the accepted prefix
(``mtad.verify.multidraft.verify_spectr``).
"""

from __future__ import annotations

from mtad.core.decoder import Decoder, StepContext, StepOutput, check_positive_int, target_only
from mtad.propose.tree import draft_chains, score_tree
from mtad.verify.multidraft import verify_spectr


class SpecTr(Decoder):
    name = "spectr"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)

    def __init__(self, gamma: int = 4, num_drafts: int = 4, name: str | None = None):
        super().__init__(name)
        self.gamma = check_positive_int("gamma", gamma)
        self.num_drafts = check_positive_int("num_drafts", num_drafts)

    def step(self, ctx: StepContext) -> StepOutput:
        g = min(self.gamma, max(ctx.remaining - 1, 0))
        if g == 0:
            return target_only(ctx)
        tree = draft_chains(ctx, self.num_drafts, g)
        p = score_tree(ctx, tree)
        path, y = verify_spectr(tree.parents, tree.tokens, p, tree.q, ctx.generator)
        return StepOutput(tokens=tree.path_tokens(path) + [y], drafted=g, accepted=len(path),
                          tree_size=len(tree.unique_rows))

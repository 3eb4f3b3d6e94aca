"""BiLD's rollback (Kim et al., "Speculative Decoding with Big Little Decoder", NeurIPS 2023).
Not lossless.

Not an acceptance rule over draft and target distributions like the others: it reads a
different signal, the target's own negative log-likelihood of each draft token, and may
run the target twice in a step. It checks a chain drafted by BiLD's little-model run
(``mtad.propose.chain.ConfidenceRun``, whose ``tree.info["fallback"]`` says how the run
ended); ``mtad.decoders.bild`` documents the reading of the published code in full:

    target   one pass over the unchecked draft tokens x_1..x_n (``mtad.verify.score``): p_1..p_(n+1)
    rollback first i with -log p_i(x_i) > alpha_rb; the target's token y at i is drawn from
             p_i. If y != x_i: keep x_1..x_(i-1), y, then run the target once more and emit
             its token z ~ p(. | ..., x_<i, y) (two target passes in this step).
             If y == x_i nothing is rolled back.
    else     keep x_1..x_n and emit the target's token from p_(n+1)
    length   a run that fills the generation's remaining length ends it unverified

``greedy`` mode: the target's tokens are argmaxes and ``-log p(x)`` uses the plain softmax;
``sampling`` mode: both use the warped ``p``.
"""

from __future__ import annotations

import math

import torch

from mtad.core.decoder import StepContext, StepOutput, plain_probs, sample
from mtad.core.knobs import MODE, Knob, Rule
from mtad.core.sampling import (
    candidate_support,
    candidate_supports,
    device_drawn,
    device_draws,
    inverse_cdf,
    read_supports,
)
from mtad.core.topk import argmax_rows
from mtad.core.tree import TokenTree
from mtad.verify.score import Scores, chain_masses, chain_tokens, score


def rollback_position(
    draft_tokens: list[int],  # [n]
    p: torch.Tensor | list[float],  # [n+1, V] target distributions (row i scores draft_tokens[i]),
    alpha_rb: float,  # or the masses p_i(x_i) [n] already on the host
) -> int | None:
    """First i (0-based) with -log p_i(x_i) > alpha_rb, or None."""
    pxs = chain_masses(draft_tokens, p)[0] if isinstance(p, torch.Tensor) else p
    for i in range(len(draft_tokens)):
        px = pxs[i]
        nll = math.inf if px <= 0 else -math.log(px)  # p = 0 rolls back unless alpha_rb = inf
        if nll > alpha_rb:
            return i
    return None


class Rollback:
    """BiLD's check of a little-model run (a chain tree with ``info["fallback"]``)."""

    target_pass = "chain"
    lossless = False
    knobs = (MODE, Knob("alpha_rb", Rule("number", 0, means="rollback threshold; .inf allowed", example="5.0"), 5.0))
    needs = ("chain",)

    def __init__(self, mode: str, alpha_rb: float):
        self.mode, self.alpha_rb = mode, alpha_rb

    def probs(self, ctx: StepContext, logits: torch.Tensor) -> torch.Tensor:  # [..., V]
        return plain_probs(logits) if self.mode == "greedy" else ctx.warping(logits)

    def pick(self, ctx: StepContext, probs: torch.Tensor) -> int:  # probs [V]
        if self.mode == "greedy":
            return int(argmax_rows(probs))  # torch.argmax's (first maximum)
        return sample(probs, ctx.generator, ctx.warping.support_bound)

    def _pick_logits(self, ctx: StepContext, logits: torch.Tensor) -> int:  # logits [V]
        """``pick(probs(logits))``; in ``sampling`` mode on the CPU with a sparse warping, drawn
        from the warping's candidates (the same host support, so the same draw) without the
        dense row."""
        s = candidate_support(ctx.warping, logits) if self.mode != "greedy" else None
        return sample(s, ctx.generator) if s is not None else self.pick(ctx, self.probs(ctx, logits))

    def verify(self, ctx: StepContext, tree: TokenTree) -> StepOutput:
        draft, fallback = chain_tokens(tree, "BiLD's rollback"), tree.info.get("fallback", False)
        n = len(draft)
        info = {"fallback": fallback, "rollback": None, "target_tokens": 0}
        if n == ctx.remaining and not fallback:  # the run ends the generation, unverified
            return StepOutput(tokens=draft, drafted=n, accepted=n, tree_size=0, info=info)
        scores = score(ctx, tree)  # chain rows 1..n
        pxs, pick = self._verify_rows(ctx, draft, scores)  # one transfer
        rb = rollback_position(draft, pxs, self.alpha_rb)
        if rb is not None:
            y = pick(rb)
            if y != draft[rb]:  # roll back to i = rb, then one more target iteration
                tokens = draft[:rb] + [y]
                if len(tokens) < ctx.remaining:
                    again = scores.then(rb, y)  # [V], y under row rb
                    tokens.append(self._pick_logits(ctx, again))
                info.update(rollback=rb, target_tokens=len(tokens) - rb)
                return StepOutput(tokens=tokens, drafted=n, accepted=rb, tree_size=n + 1, info=info)
        info["target_tokens"] = 1
        return StepOutput(tokens=draft + [pick(n)], drafted=n, accepted=n, tree_size=n, info=info)

    def _verify_rows(self, ctx: StepContext, draft: list[int], scores: Scores):
        """p_i(x_i) for the run and a picker of the target's token at any row: one transfer.

        ``sampling`` on the CPU with a sparse warping (temperature 0, top-k): the rows' host
        supports from the target's candidates (``Scores.candidates``: the supports
        ``read_supports`` finds in the dense rows, so the same masses and draws)."""
        n = len(draft)
        if self.mode == "greedy":
            p = self.probs(ctx, scores.logits)  # [n+1, V]
            rows = torch.arange(n, device=p.device)
            x, _ = scores.fed()  # the target pass's own copy
            host = torch.cat([p[rows, x], argmax_rows(p).to(p.dtype)]).cpu().tolist()
            return host[:n], lambda i: int(host[n + i])
        cand, length = scores.candidates(), None
        supports = candidate_supports(*cand, scores.root.shape[-1]) if cand is not None else None
        if supports is None:
            p = self.probs(ctx, scores.logits)  # [n+1, V]
            if not device_drawn(p, ctx.warping.support_bound) and not inverse_cdf(ctx.generator):
                got, length = read_supports(p, ctx.warping.support_bound)
                supports = [s for s, _ in got] if got is not None else None  # on the host (the CPU: in place)
        if supports is not None:
            return [supports[i].mass(x) for i, x in enumerate(draft)], (
                lambda i: sample(supports[i], ctx.generator))
        # plain temperature on an accelerator, or a support past the bound: no row read back
        x, _ = scores.fed()
        pending = device_draws(p, ctx.generator, extra=[p[torch.arange(n, device=p.device), x]], length=length)
        picked: list[int] = []

        def pick(i: int) -> int:
            # the first pick commits a pending draw; a second one (the rolled-back token equalled
            # the draft's, so the last row is drawn too) takes fresh random numbers, as the host
            # path's sequential draws do: committing a second row of the same pending draws would
            # reuse the first draw's random numbers (one uniform under the inverse CDF), and the
            # second token would depend on the first. No version bump: on the CPU this branch runs
            # only under the inverse CDF (new, no committed record, fingerprints unchanged); the host
            # path (every committed BiLD record) draws sequentially as before
            if not picked:
                picked.append(i)
                return pending.commit(i, ctx.generator)
            return device_draws(p[i : i + 1], ctx.generator).commit(0, ctx.generator)

        return pending.extra, pick

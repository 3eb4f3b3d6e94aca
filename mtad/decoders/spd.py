"""SpD: speculative sampling (Leviathan et al., ICML 2023; Chen et al., 2023). Lossless.

draft x1..xg ~ q autoregressively; one target pass gives p1..p(g+1);
accept xi while U <= min(1, pi(xi)/qi(xi)); after the first rejection emit a
correction y ~ norm(max(0, p - q)); if all g were accepted emit a bonus y ~ p(g+1).
At temperature 0 (one-hot p and q) this is exactly greedy decoding.

Devices: drafting crosses to the host once per draft token (the draw); verification
gathers every p_i(x_i), q_i(x_i) on the target's device and crosses once, draws the
uniforms on the host, then crosses once more with the correction's (or bonus's) support.
"""

from __future__ import annotations

import torch

from mtad.autotune.autoshape import auto_shape, check_shape_knob
from mtad.core.decoder import (
    Decoder,
    StepContext,
    StepOutput,
    residual,
    sample,
    target_only,
)


def chain_masses(
    draft_tokens: list[int],  # [g]
    *dists: torch.Tensor,  # each [>= g, V]: row i scores draft_tokens[i]
) -> list[list[float]]:  # per dist: [g] masses p_i(x_i)
    """Every dist's mass at the chain's tokens, gathered on the first dist's device: one transfer."""
    g = len(draft_tokens)
    if g == 0:
        return [[] for _ in dists]
    dev = dists[0].device
    dtype = dists[0].dtype
    for d in dists[1:]:
        dtype = torch.promote_types(dtype, d.dtype)
    rows = torch.arange(g, device=dev)
    x = torch.tensor(draft_tokens, dtype=torch.long, device=dev)
    gathered = torch.stack([d.to(dev)[rows, x].to(dtype) for d in dists])  # [len(dists), g]
    return gathered.cpu().tolist()


def verify_chain(
    draft_tokens: list[int],  # [g]
    p: torch.Tensor,  # [g+1, V] warped target distributions (row i scores draft_tokens[i])
    q: torch.Tensor,  # [g, V] warped draft distributions the tokens were drawn from
    generator: torch.Generator,
    bound: int | None = None,  # Warping.support_bound of p and q (a transfer hint)
) -> tuple[int, int]:
    """Speculative-sampling verification of one chain: (number accepted, correction/bonus token)."""
    g = len(draft_tokens)
    q = q.to(p.device)
    pxs, qxs = chain_masses(draft_tokens, p, q)
    for i in range(g):
        px, qx = pxs[i], qxs[i]
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if qx > 0 and u * qx <= px:  # U <= min(1, px / qx) without dividing
            continue
        return i, sample(residual(p[i], q[i]), generator, bound)
    return g, sample(p[g], generator, bound)


def draft_chain(ctx: StepContext, gamma: int) -> tuple[list[int], torch.Tensor]:
    """Draw gamma tokens autoregressively from the warped draft; returns tokens and q [gamma, V]."""
    tokens: list[int] = []
    qs = []
    logits = ctx.draft.root_logits
    for i in range(gamma):
        q = ctx.warping(logits)
        x = sample(q, ctx.generator, ctx.warping.support_bound)
        tokens.append(x)
        qs.append(q)
        if i < gamma - 1:
            logits = ctx.draft.forward([x], [i])[0]
    return tokens, torch.stack(qs) if qs else torch.empty(0)


def target_chain(ctx: StepContext, tokens: list[int]) -> torch.Tensor:
    """One target pass over the endpoint and a chain; warped p [len(tokens) + 1, V]."""
    logits = ctx.target.forward(tokens, list(range(len(tokens))))  # rows: chain node i+1 under row i
    return ctx.warping(torch.cat([ctx.target.root_logits[None], logits]))


class SpD(Decoder):
    name = "spd"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)

    def __init__(self, gamma: int | str = 4, name: str | None = None):
        super().__init__(name)
        self.gamma = check_shape_knob("gamma", gamma)
        self._auto = auto_shape("spd", self.gamma)  # gamma=auto: chosen before each step (mtad.autotune.autoshape)

    def step(self, ctx: StepContext) -> StepOutput:
        gamma = self._auto.choose(ctx)[0] if self._auto else self.gamma  # from past steps only
        g = min(gamma, max(ctx.remaining - 1, 0))
        if g == 0:
            return target_only(ctx)
        tokens, q = draft_chain(ctx, g)
        p = target_chain(ctx, tokens)
        n, y = verify_chain(tokens, p, q, ctx.generator, ctx.warping.support_bound)
        out = StepOutput(tokens=tokens[:n] + [y], drafted=g, accepted=n, tree_size=g)
        return self._auto.record(ctx, out) if self._auto else out

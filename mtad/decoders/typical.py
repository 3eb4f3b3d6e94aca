"""Typical acceptance (Cai et al., "Medusa", 2024; from eta-sampling, Hewitt et al., 2022).
Not lossless.

A draft chain is checked against the target with an entropy-dependent threshold
instead of speculative sampling:

    draft   x_1..x_g ~ q (warped), autoregressively
    target  one pass: p_1..p_(g+1) (warped)
    accept  x_i while p_i(x_i) > min(eps, delta * exp(-H(p_i)))   (longest run from x_1)
    emit    x_1..x_a, then y ~ p_(a+1)   (correction, or bonus when a = g)

``H(p) = -sum p log p`` in nats (0 log 0 = 0). Defaults eps = 0.09, delta = 0.3.
At temperature 0 (one-hot p) the threshold is min(eps, delta) and only the target's
argmax passes, so the decoder equals greedy decoding.
"""

from __future__ import annotations

import math

import torch

from mtad.core.decoder import (
    Decoder,
    StepContext,
    StepOutput,
    check_positive_int,
    sample,
    target_only,
)
from mtad.decoders.spd import draft_chain, target_chain


def check_probability(field_name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value <= 1):
        raise ValueError(f"{field_name} must be a number in (0, 1], got {value!r}")
    return float(value)


def entropy(p: torch.Tensor) -> torch.Tensor:  # [..., V] -> [...]
    return -torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(-1)


def typical_accept_length(
    draft_tokens: list[int],  # [g]
    p: torch.Tensor,  # [>= g, V] target distributions (row i scores draft_tokens[i])
    eps: float,
    delta: float,
) -> int:
    """Longest prefix with p_i(x_i) > min(eps, delta * exp(-H(p_i))) at every position."""
    g = len(draft_tokens)
    if g == 0:
        return 0
    thresh = torch.clamp(delta * torch.exp(-entropy(p[:g])), max=eps)  # [g]
    px = p[torch.arange(g, device=p.device), torch.tensor(draft_tokens, device=p.device)]  # [g]
    ok = (px > thresh).tolist()  # one transfer
    return next((i for i, v in enumerate(ok) if not v), g)


class Typical(Decoder):
    name = "typical"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    lossless = False

    def __init__(
        self, gamma: int = 4, eps: float = 0.09, delta: float = 0.3, name: str | None = None
    ):
        super().__init__(name)
        self.gamma = check_positive_int("gamma", gamma)
        self.eps = check_probability("eps", eps)
        if (
            isinstance(delta, bool)
            or not isinstance(delta, (int, float))
            or not (delta > 0 and math.isfinite(delta))
        ):
            raise ValueError(f"delta must be a finite number > 0, got {delta!r}")
        self.delta = float(delta)

    def step(self, ctx: StepContext) -> StepOutput:
        g = min(self.gamma, max(ctx.remaining - 1, 0))
        if g == 0:
            return target_only(ctx)
        tokens, _ = draft_chain(ctx, g)
        p = target_chain(ctx, tokens)  # [g+1, V]
        a = typical_accept_length(tokens, p, self.eps, self.delta)
        return StepOutput(
            tokens=tokens[:a] + [sample(p[a], ctx.generator, ctx.warping.support_bound)],
            drafted=g, accepted=a, tree_size=g,
        )

"""MTAD: multi-token assisted decoding (Qin et al., "Optimized Multi-Token Joint Decoding
with Auxiliary Model for LLM Inference", ICLR 2025). Not lossless, by design.

MTAD approximates multi-token joint decoding (sampling the next gamma tokens from
the target's joint distribution) with a draft model:

    draft   x_1..x_g = the best beam of beam sampling on the draft (``mtad.propose.beam``)
    target  one pass over the draft: p_1..p_(g+1) (warped)
    verify  R_d = sum_{i<=d} [log p_i(x_i) - log q_i(x_i)],  d = 1..g
            a = max{d : R_d > log tau}  (0 if none)  -- deterministic, no uniform draw;
            a failing shorter prefix does not block a longer passing one
    emit    x_1..x_a, then y ~ p_(a+1)  (the plain target distribution, not a residual)

Glossary (as in the paper and ``mtad.core.decoder``):

* *accepted*: draft tokens kept (``a``); *correction*: ``y`` after a rejection;
  *bonus*: ``y`` when every draft token was accepted (here both come from plain p);
* ``P(x_1..x_d)`` / ``Q(x_1..x_d)``: target / draft joint likelihoods of a prefix;
  ``R_d = log P - log Q``; acceptance means ``P > tau * Q``;
* ``tau``: the acceptance threshold; ``tau = inf`` accepts nothing (plain target
  sampling), small ``tau`` accepts more.

Numerics: ``log 0 = -inf``; a prefix with ``P = 0`` fails whatever ``Q`` is (no NaN).
At temperature 0 the draft is an ordinary top-W beam search scored with the
draft's plain softmax (see ``mtad.propose.beam``) and ``p`` is one-hot, so a prefix passes
only if it is the target's greedy continuation: MTAD then equals greedy decoding.

Devices: the draft's cumulative log Q moves to the target's device; R crosses to the
host once, then the correction's support once. Caches are pruned by the runners' ``end``
(the engine commits the tokens).
This module knows the acceptance rule and nothing about models beyond the runners.
"""

from __future__ import annotations

import math

import torch

from mtad.autotune.autoshape import auto_shape, check_shape_knob
from mtad.core.decoder import Decoder, StepContext, StepOutput, sample, target_only
from mtad.decoders.spd import target_chain
from mtad.propose.beam import beam_sample


def check_tau(value) -> float:
    """tau must be a number > 0; ``inf`` is allowed (accept nothing)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or value <= 0
    ):
        raise ValueError(f"tau must be a number > 0 (inf allowed: accept nothing), got {value!r}")
    return float(value)


def check_bool(field_name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{field_name} must be true or false, got {value!r}")
    return value


def cumulative_log_ratio(
    log_p: torch.Tensor,  # [g] log p_i(x_i), -inf where p = 0
    cum_logq: torch.Tensor,  # [g] log Q(x_1..x_i), raw cumulative draft log-likelihood
) -> torch.Tensor:  # [g] R_d = log P(x_1..x_d) - log Q(x_1..x_d)
    """R_d with ``P = 0`` mapped to ``-inf`` (never NaN, even if ``Q = 0`` too)."""
    cum_logp = torch.cumsum(log_p, 0)
    r = cum_logp - cum_logq
    return torch.where(torch.isneginf(cum_logp), torch.full_like(r, -math.inf), r)


def accept_length(
    log_ratio: torch.Tensor | list[float],  # [g]
    tau: float,
) -> tuple[int, list[bool]]:
    """MTAD acceptance: (a, per-prefix pass flags) with a = max{d : R_d > log tau}, 0 if none."""
    values = log_ratio.tolist() if isinstance(log_ratio, torch.Tensor) else log_ratio
    passes = [bool(r > math.log(tau)) for r in values]
    a = max((d + 1 for d, ok in enumerate(passes) if ok), default=0)
    return a, passes


class MTAD(Decoder):
    """Chain MTAD: beam-sampled draft, one target pass over its best beam, threshold acceptance."""

    name = "mtad"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    lossless = False

    def __init__(
        self,
        gamma: int | str = 4,
        width: int | str = 4,
        tau: float = 0.5,
        replacement: bool = True,
        name: str | None = None,
    ):
        super().__init__(name)
        self.gamma = check_shape_knob("gamma", gamma)
        self.width = check_shape_knob("width", width)
        self.tau = check_tau(tau)
        self.replacement = check_bool("replacement", replacement)
        self._auto = auto_shape(type(self).name, self.gamma, self.width)  # auto knobs: mtad.autotune.autoshape

    def shape(self, ctx: StepContext) -> tuple[int, int]:
        """(gamma, W) of this step: the knobs, or AutoShape's choice from past steps."""
        return self._auto.choose(ctx) if self._auto else (self.gamma, self.width)

    def step(self, ctx: StepContext) -> StepOutput:
        gamma, width = self.shape(ctx)
        g = min(gamma, max(ctx.remaining - 1, 0))
        if g == 0:
            return target_only(ctx)
        beams = beam_sample(ctx, g, width, self.replacement)
        best = beams.best()
        draft = beams.path_tokens(best)  # [g]
        p = target_chain(ctx, draft)  # [g+1, V] warped target distributions
        dev = p.device
        log_p = p[torch.arange(g, device=dev), torch.tensor(draft, device=dev)].log()  # [g]
        cum_logq = beams.path_cum_logq(best).to(device=dev, dtype=log_p.dtype)  # draft -> target
        r = cumulative_log_ratio(log_p, cum_logq).cpu()  # one transfer
        a, passes = accept_length(r, self.tau)
        y = sample(p[a], ctx.generator, ctx.warping.support_bound)
        out = StepOutput(
            tokens=draft[:a] + [y],
            drafted=g,
            accepted=a,
            tree_size=g,
            info={"pass": passes, "log_ratio": r.tolist()},
        )
        return self._auto.record(ctx, out) if self._auto else out

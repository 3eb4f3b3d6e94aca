"""Autoregressive baselines: multinomial sampling and greedy decoding on the target alone.

The references every lossless decoder must match: ``y ~ p(.|ctx)`` (warped) or
``y = argmax p``. Not proposer + verifier compositions: there is no draft (one target token
per step, no shape knobs).
"""

from __future__ import annotations

from mtad.core.decoder import Decoder, StepContext, StepOutput, sample
from mtad.core.topk import argmax_rows


class Multinomial(Decoder):
    """One target pass per token, ``y ~ warp(p)`` (temperature 0 gives greedy)."""

    name = "multinomial"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    uses_draft = False

    def decode(self, ctx: StepContext) -> StepOutput:
        p = ctx.warping(ctx.target.root_logits)
        return StepOutput(tokens=[sample(p, ctx.generator, ctx.warping.support_bound)])


class Greedy(Decoder):
    """One target pass per token, ``y = argmax p`` whatever the sampling settings."""

    name = "greedy"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    uses_draft = False
    stochastic = False  # ignores the warping: equals the others only at temperature 0

    def decode(self, ctx: StepContext) -> StepOutput:
        return StepOutput(tokens=[int(argmax_rows(ctx.target.root_logits))])  # torch.argmax's

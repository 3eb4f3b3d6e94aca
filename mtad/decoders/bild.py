"""BiLD: Big Little Decoder (Kim et al., "Speculative Decoding with Big Little Decoder",
NeurIPS 2023). Not lossless.

The draft (little) model decodes on its own while it is confident; the target (big)
model checks its run and takes over when it is not:

    draft   x_1, x_2, ... up to max_run tokens; before drawing x_i, if max q_i < alpha_fb,
            stop (*fallback*): the target must produce the token at position i
    target  one pass over the unchecked draft tokens x_1..x_n: p_1..p_(n+1)
    rollback: first i with -log p_i(x_i) > alpha_rb -> keep x_1..x_(i-1), emit the
            target's token from p_i
    else    keep x_1..x_n; after a fallback also emit the target's token from p_(n+1);
            after a full run of max_run confident tokens emit only the draft's tokens

Modes:

* ``greedy`` (the original; alpha_fb = 0.6, alpha_rb = 5.0): draft and target tokens
  are argmaxes; confidence ``max q`` and ``-log p(x)`` use the models' plain softmax
  (temperature 1, no top-k/top-p), whatever the sampling settings;
* ``sampling`` (the MTAD authors' port; e.g. (alpha_fb, alpha_rb) = (0.9, 2)): draft
  tokens are drawn from the warped ``q`` and the target's token from the warped ``p``;
  the thresholds apply to those warped distributions.

Glossary: *accepted* = draft tokens kept; the target's token (after a fallback or a
rollback) plays the role of the correction token. A step that ends with a full
confident run emits draft tokens only (``info["target_token"] = False``): for BiLD,
tokens per target pass is ``emitted / steps``, which ``(accepted + steps) / steps``
overstates for such steps.
"""

from __future__ import annotations

import math

import torch

from mtad.decoders.base import Decoder, StepContext, StepOutput, check_positive_int, sample
from mtad.runner import ROOT

MODES = ("greedy", "sampling")


def check_threshold(field_name: str, value, allow_inf: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if not ok or value < 0 or (math.isinf(value) and not allow_inf):
        raise ValueError(
            f"{field_name} must be a number >= 0{' (inf allowed)' if allow_inf else ''}, "
            f"got {value!r}"
        )
    return float(value)


def rollback_position(
    draft_tokens: list[int],  # [n]
    p: torch.Tensor,  # [n+1, V] target distributions (row i scores draft_tokens[i])
    alpha_rb: float,
) -> int | None:
    """First i (0-based) with -log p_i(x_i) > alpha_rb, or None."""
    for i, x in enumerate(draft_tokens):
        px = float(p[i, x])
        nll = math.inf if px <= 0 else -math.log(px)  # p = 0 rolls back unless alpha_rb = inf
        if nll > alpha_rb:
            return i
    return None


class BiLD(Decoder):
    name = "bild"
    lossless = False

    def __init__(
        self,
        mode: str = "greedy",
        alpha_fb: float = 0.6,
        alpha_rb: float = 5.0,
        max_run: int = 10,
        name: str | None = None,
    ):
        super().__init__(name)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.alpha_fb = check_threshold("alpha_fb", alpha_fb)
        self.alpha_rb = check_threshold("alpha_rb", alpha_rb, allow_inf=True)
        self.max_run = check_positive_int("max_run", max_run)

    def _probs(self, ctx: StepContext, logits: torch.Tensor) -> torch.Tensor:  # [..., V]
        if self.mode == "greedy":
            return logits.to(
                torch.float64 if logits.dtype == torch.float64 else torch.float32
            ).softmax(-1)
        return ctx.warping(logits)

    def _pick(self, ctx: StepContext, probs: torch.Tensor) -> int:  # probs [V]
        return int(torch.argmax(probs)) if self.mode == "greedy" else sample(probs, ctx.generator)

    def step(self, ctx: StepContext) -> StepOutput:
        limit = min(self.max_run, ctx.remaining)
        draft: list[int] = []
        fallback = False
        logits = ctx.draft.root_logits
        while len(draft) < limit:
            q = self._probs(ctx, logits)  # [V]
            if float(q.max()) < self.alpha_fb:
                fallback = True
                break
            draft.append(self._pick(ctx, q))
            if len(draft) < limit:
                logits = ctx.draft.forward(
                    [draft[-1]], [ROOT if len(draft) == 1 else len(draft) - 2]
                )[0]
        fallback = fallback or len(draft) == 0
        n = len(draft)
        logits = ctx.target.forward(draft, ([ROOT] + list(range(n - 1)))[:n])  # [n, V]
        p = self._probs(ctx, torch.cat([ctx.target.root_logits[None], logits]))  # [n+1, V]
        rb = rollback_position(draft, p, self.alpha_rb)
        if rb is not None:
            tokens, accepted, target_token = draft[:rb] + [self._pick(ctx, p[rb])], rb, True
        elif fallback:
            tokens, accepted, target_token = draft + [self._pick(ctx, p[n])], n, True
        else:
            tokens, accepted, target_token = list(draft), n, False
        return StepOutput(
            tokens=tokens,
            drafted=n,
            accepted=accepted,
            tree_size=n,
            info={"fallback": fallback, "rollback": rb, "target_token": target_token},
        )

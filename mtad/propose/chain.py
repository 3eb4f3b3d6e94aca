"""Chain drafts: ``gamma`` tokens drawn autoregressively from the warped draft (SpD, typical
acceptance), and BiLD's confidence-stopped run of the little model.

Both return a chain ``mtad.core.tree.TokenTree`` (token ``i`` is row ``i + 1`` under row
``i``). A drafted chain keeps its warped draft rows ``q`` [g, V] on the draft's device (row
``i``: the distribution token ``i`` was drawn from); the verifier gathers what it needs there.
On the CPU, where the warping is sparse (temperature 0, top-k), ``q`` is instead the rows'
host supports read from the warping's candidates (``Warping.candidates``: no dense row, no
scan; ``mtad.core.sampling.Rows`` of ``Support``, the supports ``sample`` would read, so the
same draws).

Devices: drafting crosses to the host once per draft token (the draw).
"""

from __future__ import annotations

import torch

from mtad.core.decoder import StepContext, plain_probs, sample
from mtad.core.knobs import GAMMA, MODE, Knob, Rule
from mtad.core.sampling import (
    Rows,
    Support,
    candidate_support,
    device_drawn,
    device_draws,
    inverse_cdf,
    read_supports,
)
from mtad.core.topk import argmax_rows
from mtad.core.tree import TokenTree

MODES = MODE.rule.choices


def draft_chain(ctx: StepContext, gamma: int) -> tuple[list[int], torch.Tensor | Rows]:
    """Draw gamma tokens autoregressively from the warped draft; returns tokens and q [gamma, V]
    (on the CPU with a sparse warping: the rows' host supports, see the module docstring)."""
    tokens: list[int] = []
    qs = []
    logits = ctx.draft.root_logits
    for i in range(gamma):
        q = candidate_support(ctx.warping, logits)
        q = ctx.warping(logits) if q is None else q
        x = sample(q, ctx.generator, ctx.warping.support_bound)
        tokens.append(x)
        qs.append(q)
        if i < gamma - 1:
            logits = ctx.draft.forward([x], [i])[0]
    if qs and isinstance(qs[0], Support):
        return tokens, Rows(len(qs), qs.__getitem__)
    return tokens, torch.stack(qs) if qs else torch.empty(0)


class Chain:
    """``depth`` tokens drawn autoregressively from the warped draft (``draft_chain``)."""

    kind = "chain"
    knobs = (GAMMA,)
    provides = ("chain", "chain_q")

    def propose(self, ctx: StepContext, depth: int, width: int = 1) -> TokenTree:
        tokens, q = draft_chain(ctx, depth)
        return TokenTree.chain(tokens, q)


def mode_probs(mode: str, ctx: StepContext, logits: torch.Tensor) -> torch.Tensor:  # [..., V]
    """BiLD's distributions: plain softmax in ``greedy`` mode, the warped ones in ``sampling``."""
    return plain_probs(logits) if mode == "greedy" else ctx.warping(logits)


class ConfidenceRun:
    """BiLD's little-model run (Kim et al., NeurIPS 2023): draft while confident.

    Up to ``depth`` tokens (``max_run``, clipped to the remaining length); before keeping
    x_i, if max q_i < alpha_fb the token is discarded and the run ends (*fallback*:
    ``tree.info["fallback"]``). ``greedy`` mode takes argmaxes of the plain softmax,
    ``sampling`` mode draws from the warped q (see ``mtad.decoders.bild``).
    """

    kind = "chain"
    knobs = (
        Knob("max_run", Rule("integer", 1, means="little-model tokens per run", example="10"), 10, shape=True),
        MODE,
        Knob("alpha_fb", Rule("number", 0, high_open=True, means="fallback threshold", example="0.6"), 0.6),
    )
    provides = ("chain",)

    def __init__(self, mode: str, alpha_fb: float):
        self.mode, self.alpha_fb = mode, alpha_fb

    def _confidence_and_pick(self, ctx: StepContext, logits: torch.Tensor) -> tuple[float, int | None]:
        """(max q, the token drawn from q or None when max q < alpha_fb) for the draft's
        ``logits`` [V]; one transfer.

        ``greedy``: q is the plain softmax, its maximum read at its argmax (``argmax_rows``:
        ``torch.argmax``'s first maximum or first NaN, whose value is ``q.max()``'s).
        ``sampling`` on the CPU with a sparse warping (temperature 0, top-k): q's host support
        from the warping's candidates (``candidate_supports``, the support ``read_supports``
        finds in the dense row, so the same maximum and the same draw), no dense row."""
        if self.mode == "greedy":
            q = plain_probs(logits)  # [V]
            arg = argmax_rows(q).reshape(1)
            top, arg = torch.cat([q.gather(0, arg), arg.to(q.dtype)]).cpu().tolist()
            return top, int(arg)
        s, length = candidate_support(ctx.warping, logits), None
        if s is None:
            q = mode_probs(self.mode, ctx, logits)  # [V]
            if not device_drawn(q, ctx.warping.support_bound) and not inverse_cdf(ctx.generator):
                got, length = read_supports(q[None], ctx.warping.support_bound)
                s = got[0][0] if got is not None else None  # the support on the host (the CPU: in place)
        if s is not None:
            top = float(s.vals.max())
            return top, (sample(s, ctx.generator) if top >= self.alpha_fb else None)
        # plain temperature on an accelerator, or a support past the bound: no row read back
        pending = device_draws(q[None], ctx.generator, extra=[q.max()], length=length)
        top = pending.extra[0]
        if top >= self.alpha_fb:
            return top, pending.commit(0, ctx.generator)
        pending.cancel(ctx.generator)  # a fallback draws nothing
        return top, None

    def run(self, ctx: StepContext, limit: int) -> tuple[list[int], bool]:
        """Little-model run: (tokens kept, whether it ended by a fallback)."""
        draft: list[int] = []
        logits = ctx.draft.root_logits
        while len(draft) < limit:
            top, x = self._confidence_and_pick(ctx, logits)
            if top < self.alpha_fb:
                return draft, True
            draft.append(x)
            if len(draft) < limit:
                logits = ctx.draft.forward([draft[-1]], [len(draft) - 1])[0]  # chain rows
        return draft, False

    def propose(self, ctx: StepContext, depth: int, width: int = 1) -> TokenTree:
        draft, fallback = self.run(ctx, depth)
        tree = TokenTree.chain(draft)
        tree.info["fallback"] = fallback
        return tree

"""BiLD: Big Little Decoder (Kim et al., "Speculative Decoding with Big Little Decoder",
NeurIPS 2023). Not lossless.

Follows the authors' published code (``kssteven418/BigLittleDecoder``, class
``T5BiLDModel`` in ``src/transformers/models/t5/modeling_t5.py``, its
``_greedy_search_body`` and ``schedule_iters``). The little (draft) model decodes on its
own while it is confident; the big (target) model then checks its run and always adds
a token of its own. One step here is one such round:

    draft    x_1, x_2, ... up to max_run tokens; before keeping x_i, if max q_i < alpha_fb,
             discard it (*fallback*) and hand over to the target
    target   one pass over the unchecked draft tokens x_1..x_n: p_1..p_(n+1)
    rollback first i with -log p_i(x_i) > alpha_rb; the target's token y at i is drawn from
             p_i. If y != x_i: keep x_1..x_(i-1), y, then run the target once more and emit
             its token z ~ p(. | ..., x_<i, y) (two target passes in this step).
             If y == x_i the published code does not roll back at all (see below).
    else     keep x_1..x_n and emit the target's token from p_(n+1), whether the run ended
             by a fallback or by reaching max_run tokens
    length   a run that fills the generation's remaining length ends it unverified (the
             published loop checks its stopping criteria before handing over)

Where ``docs/algorithms.md`` reads the published code differently, the code wins:

* *Rollback when the target agrees.* algorithms.md says the target's token at i is
  "appended (skipped when it equals the small token)". In the published code, when the
  target's token at the first position over the threshold equals the draft token there,
  nothing is rolled back: every draft token of the run is kept, later positions over the
  threshold included, and the target's token after the run is emitted as usual.
* *The extra target iteration after a rollback* is the same loop iteration, still on the
  big model: the rollback ``continue``s before ``schedule_iters``, so the big model keeps
  its one iteration and runs on the corrected sequence; that pass emits one token and is
  not itself checked for rollback (it scores no draft tokens).
* *Runs cut by the length limit are not verified*, so not every run of small tokens ends
  with a big-model pass (algorithms.md: "every run ... ends with a large-model pass").

Known differences from the published code (engine boundaries, not rules): its first
token of a generation comes from the big model (``init_iters(init_with='large')``), here
the first step starts with the little model; and a little-model EOS ends its generation
unverified, while here the decoder does not know the EOS ids, so an EOS inside a run is
verified like any other token (the engine stops at the first EOS committed).

Modes:

* ``greedy`` (the original; alpha_fb = 0.6, alpha_rb = 5.0): draft and target tokens
  are argmaxes; confidence ``max q`` and ``-log p(x)`` use the models' plain softmax
  (temperature 1, no top-k/top-p), whatever the sampling settings;
* ``sampling`` (the MTAD authors' port; e.g. (alpha_fb, alpha_rb) = (0.9, 2)): draft
  tokens are drawn from the warped ``q`` and the target's tokens from the warped ``p``;
  the thresholds apply to those warped distributions.

Glossary: *accepted* = draft tokens kept; the target's token after a run (or at a
rollback) plays the role of the correction/bonus token. A rollback step emits two
target tokens from two target passes, and a step cut by the length limit emits draft
tokens only (no target pass): for BiLD, tokens per target pass is ``emitted /
target_passes``, which ``(accepted + steps) / steps`` does not count exactly.
"""

from __future__ import annotations

import math

import torch

from mtad.core.decoder import Decoder, StepContext, StepOutput, check_positive_int, sample
from mtad.core.sampling import host_support, host_supports
from mtad.decoders.spd import chain_masses

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


class BiLD(Decoder):
    name = "bild"
    version = "2"  # bump when the behaviour changes (a point's identity includes it); 2: behaviour changed since the first records
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
        if self.mode == "greedy":
            return int(torch.argmax(probs))
        return sample(probs, ctx.generator, ctx.warping.support_bound)

    def _confidence_and_pick(self, ctx: StepContext, q: torch.Tensor) -> tuple[float, int | None]:
        """(max q, the token drawn from q or None when max q < alpha_fb); one transfer."""
        if self.mode == "greedy":
            top, arg = torch.stack([q.max(), torch.argmax(q).to(q.dtype)]).cpu().tolist()
            return top, int(arg)
        s = host_support(q, ctx.warping.support_bound)
        top = float(s.vals.max())
        return top, (sample(s, ctx.generator) if top >= self.alpha_fb else None)

    def _draft_run(self, ctx: StepContext) -> tuple[list[int], bool]:
        """Little-model run: (tokens kept, whether it ended by a fallback)."""
        limit = min(self.max_run, ctx.remaining)
        draft: list[int] = []
        logits = ctx.draft.root_logits
        while len(draft) < limit:
            q = self._probs(ctx, logits)  # [V]
            top, x = self._confidence_and_pick(ctx, q)
            if top < self.alpha_fb:
                return draft, True
            draft.append(x)
            if len(draft) < limit:
                logits = ctx.draft.forward([draft[-1]], [len(draft) - 1])[0]  # chain rows
        return draft, False

    def step(self, ctx: StepContext) -> StepOutput:
        draft, fallback = self._draft_run(ctx)
        n = len(draft)
        info = {"fallback": fallback, "rollback": None, "target_tokens": 0}
        if n == ctx.remaining and not fallback:  # the run ends the generation, unverified
            return StepOutput(tokens=draft, drafted=n, accepted=n, tree_size=0, info=info)
        logits = ctx.target.forward(draft, list(range(n)))  # [n, V], chain rows 1..n
        p = self._probs(ctx, torch.cat([ctx.target.root_logits[None], logits]))  # [n+1, V]
        pxs, pick = self._verify_rows(ctx, draft, p)  # one transfer
        rb = rollback_position(draft, pxs, self.alpha_rb)
        if rb is not None:
            y = pick(rb)
            if y != draft[rb]:  # roll back to i = rb, then one more target iteration
                tokens = draft[:rb] + [y]
                if len(tokens) < ctx.remaining:
                    again = ctx.target.forward([y], [rb])[0]  # [V], y under row rb
                    tokens.append(self._pick(ctx, self._probs(ctx, again)))
                info.update(rollback=rb, target_tokens=len(tokens) - rb)
                return StepOutput(tokens=tokens, drafted=n, accepted=rb, tree_size=n + 1, info=info)
        info["target_tokens"] = 1
        return StepOutput(tokens=draft + [pick(n)], drafted=n, accepted=n, tree_size=n, info=info)

    def _verify_rows(self, ctx: StepContext, draft: list[int], p: torch.Tensor):
        """p_i(x_i) for the run and a picker of the target's token at any row: one transfer."""
        n = len(draft)
        if self.mode == "greedy":
            rows = torch.arange(n, device=p.device)
            x = torch.tensor(draft, dtype=torch.long, device=p.device)
            host = torch.cat([p[rows, x], torch.argmax(p, -1).to(p.dtype)]).cpu().tolist()
            return host[:n], lambda i: int(host[n + i])
        supports = host_supports(p, ctx.warping.support_bound)
        return [supports[i].mass(x) for i, x in enumerate(draft)], (
            lambda i: sample(supports[i], ctx.generator))

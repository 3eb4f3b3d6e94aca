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

Composition: the little-model run is ``mtad.propose.chain.ConfidenceRun`` and the check is
``mtad.verify.rollback.Rollback`` (a rule on the target's own likelihood of the draft tokens,
not an acceptance rule over draft and target distributions); the run's length is the step's
depth knob ``max_run``, clipped to the remaining length (the whole of it: a run may end the
generation).

Glossary: *accepted* = draft tokens kept; the target's token after a run (or at a
rollback) plays the role of the correction/bonus token. A rollback step emits two
target tokens from two target passes, and a step cut by the length limit emits draft
tokens only (no target pass): for BiLD, tokens per target pass is ``emitted /
target_passes``, which ``(accepted + steps) / steps`` does not count exactly.
"""

from __future__ import annotations

import torch

from mtad.core.decoder import StepContext
from mtad.decoders.compose import Composition
from mtad.propose.chain import MODES
from mtad.verify.rollback import rollback_position

__all__ = ["MODES", "BiLD", "rollback_position"]


class BiLD(Composition):
    """A confidence-stopped little-model run, BiLD's rollback check. Fields: the pieces' knobs
    (``max_run``, ``mode``, ``alpha_fb``, ``alpha_rb``)."""

    name = "bild"
    version = "2"  # bump when the behaviour changes (a point's identity includes it); 2: behaviour changed since the first records
    proposer, verifier = "confidence_run", "rollback"
    reserve = 0  # a run may fill the remaining length (then it ends the generation unverified)

    # the pieces' steps, for studies that rearrange them
    def _draft_run(self, ctx: StepContext) -> tuple[list[int], bool]:
        """Little-model run: (tokens kept, whether it ended by a fallback)."""
        return self._proposer.run(ctx, min(self.max_run, ctx.remaining))

    def _probs(self, ctx: StepContext, logits: torch.Tensor) -> torch.Tensor:  # [..., V]
        return self._verifier.probs(ctx, logits)

    def _pick(self, ctx: StepContext, probs: torch.Tensor) -> int:  # probs [V]
        return self._verifier.pick(ctx, probs)

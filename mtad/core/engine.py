"""The one generation loop shared by every decoder.

prefill both models, then repeat until ``max_new_tokens``, an EOS id or a stop sequence
(``mtad.core.stopping``; a block is cut after the token that ends the generation):
    begin step (both runners) -> decoder.step (shape and near-end clip, then draft, one
    target pass, verify: ``mtad.core.decoder.Decoder.step``)
    -> commit accepted + correction/bonus tokens -> prune both caches to the committed path.

The engine knows nothing about tokenization or acceptance rules: token ids in,
token ids and per-step records out. Randomness comes from one explicit
``torch.Generator`` on the CPU, seeded per call: every draw happens on the host
(``mtad.core.sampling``), whatever device the models are on. The loop synchronises the
devices once per step (the runners time their passes with events, ``mtad.core.devices``). It drives the models through the
``mtad.core.protocols.TreeRunner`` interface: given a model it wraps it in a
``mtad.core.runner.ModelRunner``; given an object that already is a ``TreeRunner`` (e.g. a
study's table of precomputed logits) it uses that object as is.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from mtad.core import sampling
from mtad.core.decoder import Decoder
from mtad.core.devices import synchronize
from mtad.core.metrics import block_efficiency
from mtad.core.protocols import StepContext, TreeRunner
from mtad.core.runner import ModelRunner
from mtad.core.stopping import Stopping, StopSequences
from mtad.core.warping import Warping


@dataclass
class StepRecord:
    drafted: int  # draft tokens on the verified chain (gamma for chain decoders)
    accepted: int  # draft tokens kept
    emitted: int  # tokens committed this step (accepted + correction/bonus, after truncation)
    tree_size: int  # nodes in the target's verification pass
    target_passes: int  # target forward passes this step (0 for a BiLD step that never called it)
    target_time: float  # seconds in target forward passes
    draft_time: float  # seconds in draft forward passes
    wall_time: float  # seconds for the whole step
    shape: dict | None = None  # gamma=auto / width=auto: the shape chosen for this step (mtad.autotune.autoshape)


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    output_ids: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    wall_time: float = 0.0  # decoding only (prefill excluded), seconds
    prefill_time: float = 0.0
    stop_reason: str = "length"

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def block_efficiency(self) -> float:
        """Emitted tokens / steps (``mtad.core.metrics.block_efficiency``): a cut-short last step
        counts what it kept."""
        return block_efficiency(sum(s.emitted for s in self.steps), self.num_steps)

    @property
    def forward_time(self) -> float:
        return sum(s.target_time + s.draft_time for s in self.steps)

    def to_record(self) -> dict:
        """The generation's fields of a ``samples.jsonl`` record: ``mtad.core.records.ENGINE_FIELDS``
        (and the optional ``shape_per_step`` when a knob is ``auto``)."""
        return {
            "prompt_tokens": len(self.prompt_ids),
            "output_ids": self.output_ids,
            "new_tokens": self.new_tokens,
            "steps": self.num_steps,
            "accepted_per_step": [s.accepted for s in self.steps],
            "drafted_per_step": [s.drafted for s in self.steps],
            "emitted_per_step": [s.emitted for s in self.steps],
            "tree_size_per_step": [s.tree_size for s in self.steps],
            "target_passes": sum(s.target_passes for s in self.steps),
            "target_forward_time": sum(s.target_time for s in self.steps),
            "draft_forward_time": sum(s.draft_time for s in self.steps),
            "wall_time": self.wall_time,
            "prefill_time": self.prefill_time,
            "block_efficiency": self.block_efficiency,
            "stop_reason": self.stop_reason,
            **({"shape_per_step": [s.shape for s in self.steps]} if any(s.shape for s in self.steps) else {}),
        }


_RUNNER_METHODS = ("prefill", "begin", "end", "forward", "root_logits", "num_nodes", "depth")


def as_runner(model_or_runner, vocab_size: int | None, name: str) -> TreeRunner:
    """A model wrapped in a ``ModelRunner``, or a ``TreeRunner`` object as is."""
    if isinstance(model_or_runner, torch.nn.Module):
        return ModelRunner(model_or_runner, vocab_size, name=name)
    # checked on the type: reading ``root_logits`` on an instance would run a forward pass
    missing = [m for m in _RUNNER_METHODS if not hasattr(type(model_or_runner), m)]
    if missing:
        raise TypeError(
            f"{name}: expected a torch model or a mtad.core.protocols.TreeRunner, got "
            f"{type(model_or_runner).__name__} without {', '.join(missing)}"
        )
    return model_or_runner


class Engine:
    """Runs a decoder on a (target, draft) pair. ``draft`` may be None for decoders without one.

    ``target`` and ``draft`` are models or ``TreeRunner`` objects (see ``as_runner``).
    """

    def __init__(
        self,
        target,
        draft,
        decoder: Decoder,
        warping: Warping,
        vocab_size: int | None = None,
        eos_token_ids: Iterable[int] = (),
        stop_sequences: StopSequences | None = None,
    ):
        check = getattr(decoder, "sampling_problem", None)  # the settings its pieces declare (mtad.core.knobs)
        problem = check(warping.temperature, warping.top_k, warping.top_p) if check else None
        if problem:
            raise ValueError(f"decoder {decoder.name!r}: {problem}")
        self.decoder = decoder
        self.warping = warping
        # where a generation ends (mtad.core.stopping): token ids only, built from the tokenizer elsewhere
        self.stopping = Stopping(eos_token_ids, stop_sequences)
        self.target = as_runner(target, vocab_size, "target")
        needs_draft = getattr(decoder, "uses_draft", True)
        if needs_draft and draft is None:
            raise ValueError(f"decoder {decoder.name!r} needs a draft model; the model pair has none")
        self.draft = as_runner(draft, vocab_size, "draft") if (draft is not None and needs_draft) else None

    def _runners(self) -> list[TreeRunner]:
        return [r for r in (self.target, self.draft) if r is not None]

    @property
    def _devices(self) -> list[torch.device]:
        """Every device the runners span (a runner without ``devices`` has its ``device``)."""
        return [d for r in self._runners() for d in getattr(r, "devices", [r.device])]

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        seed: int = 0,
        stop_after: int | None = None,
    ) -> GenerationResult:
        """Decode up to ``max_new_tokens`` (and the first EOS id or stop sequence).

        ``stop_after`` ends the generation after the step in which at least that many
        tokens have been emitted (stop reason ``"stop_after"``), while ``max_new_tokens``
        still sets the room each step sees (``StepContext.remaining``): a study can take
        a prefix of a long generation without its drafts being shortened near the end.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("the prompt must contain at least one token")
        gen = sampling.generator(self.warping, seed)  # the one generator; its draw scheme (``Warping.scheme``)
        result = GenerationResult(prompt_ids=prompt, output_ids=[])
        t0 = time.perf_counter()
        for r in self._runners():
            r.prefill(prompt)
        result.prefill_time = time.perf_counter() - t0

        committed = list(prompt)
        start = time.perf_counter()
        while len(result.output_ids) < max_new_tokens:
            ts = time.perf_counter()
            f0_target = self.target.forward_time
            f0_draft = self.draft.forward_time if self.draft else 0.0
            calls0 = self.target.forward_calls
            for r in self._runners():
                r.begin(committed)
            ctx = StepContext(
                committed=committed,
                target=self.target,
                draft=self.draft,
                warping=self.warping,
                generator=gen,
                remaining=max_new_tokens - len(result.output_ids),
            )
            out = self.decoder.step(ctx)
            tokens = list(out.tokens)
            if not tokens:
                raise RuntimeError(f"decoder {self.decoder.name!r} emitted no token in a step")
            tokens = tokens[: ctx.remaining]
            # an EOS id or a stop sequence inside the block: keep the block up to that token
            stop = self.stopping.first(result.output_ids + tokens, start=len(result.output_ids))
            if stop is not None:
                tokens = tokens[: stop.index - len(result.output_ids) + 1]
            committed = committed + tokens
            result.output_ids.extend(tokens)
            for r in self._runners():
                r.end(committed)
            synchronize(self._devices)  # the one synchronisation of the step: honest step times
            result.steps.append(
                StepRecord(
                    drafted=out.drafted,
                    accepted=min(out.accepted, len(tokens)),
                    emitted=len(tokens),
                    tree_size=out.tree_size,
                    target_passes=self.target.forward_calls - calls0,
                    target_time=self.target.forward_time - f0_target,
                    draft_time=(self.draft.forward_time - f0_draft) if self.draft else 0.0,
                    wall_time=time.perf_counter() - ts,
                    shape=out.info.get("shape"),
                )
            )
            if stop is not None:
                result.stop_reason = stop.reason  # "eos" or "stop_sequence"
                break
            if stop_after is not None and len(result.output_ids) >= stop_after:
                result.stop_reason = "stop_after"
                break
        result.wall_time = time.perf_counter() - start
        return result


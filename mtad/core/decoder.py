"""The decoder interface: one decoding step = draft, one target pass, verify.

A decoder proposes and verifies; the engine (``mtad.core.engine``) owns the loop,
commits the returned tokens and prunes both caches. What every decoder repeats lives in
``Decoder.step``, the one entry point the engine calls:

* the step's *shape*: a decoder declares its shape knobs (``shape_knobs``, e.g.
  ``("gamma",)`` or ``("gamma", "width")``; the first is the draft depth). Their values are
  the attributes of that name, or, when a knob is ``auto``, what the decoder's shape chooser
  (``_auto``, ``mtad.autotune.autoshape.AutoShape``) picks from past steps; the chooser is
  told every step's output (``record``);
* the *near-end clip*: the depth is cut to ``remaining - reserve`` (``reserve = 1``: room
  for the target's own token; 0 for a decoder whose block may fill the remaining length);
  at depth 0 the step samples the target alone (``target_only``);
* then ``decode(ctx, *shape)`` does the step's own work.

A decoder without shape knobs implements ``decode(ctx)``; one that needs full control
may still override ``step``. A decoder never edits the
committed sequence or the caches directly: it adds nodes to the runners' step
trees (``ModelRunner.forward``) and returns the tokens to commit.

Vocabulary (as in the papers): *accepted* = draft tokens kept after
verification; *correction* = the token the target emits after a rejection;
*bonus* = the token it emits when every draft token was accepted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mtad.core.knobs import (
    ANY_SAMPLING,
    Knob,
    KnobError,
    Sampling,
    did_you_mean,
    sampling_of,
    unsupported,
)
from mtad.core.protocols import StepContext  # noqa: F401  (decoders import it from here)
from mtad.core.sampling import residual, sample  # noqa: F401  (decoders import them from here)


@dataclass
class StepOutput:
    tokens: list[int]  # accepted draft tokens followed by one correction/bonus token
    drafted: int = 0  # draft tokens proposed along the verified chain (gamma for chains)
    accepted: int = 0  # draft tokens kept
    tree_size: int = 0  # nodes the target verified (== drafted for chains)
    info: dict = field(default_factory=dict)


class Decoder:
    """Base class. Subclasses set ``uses_draft``, ``shape_knobs`` and implement ``decode``."""

    name: str = "decoder"
    uses_draft: bool = True
    lossless: bool = True  # output follows the warped target distribution exactly
    stochastic: bool = True  # samples from the warped distributions (False: argmax rule)
    shape_knobs: tuple[str, ...] = ()  # knobs setting a step's shape; the first is its depth
    reserve: int = 1  # tokens of the remaining length kept for the target's own token
    _auto = None  # shape chooser when a knob is auto: choose(ctx) -> values, record(ctx, out)
    knobs: tuple[Knob, ...] = ()  # its fields (mtad.core.knobs); a composition's are its pieces'
    sampling: Sampling = ANY_SAMPLING  # the settings it supports (mtad.core.knobs); a composition's: its pieces'

    def __init__(self, name: str | None = None):
        if name is not None:
            self.name = name

    @classmethod
    def fields(cls, node: Mapping[str, Any] | None = None) -> dict[str, Knob]:
        """The fields a config node of this class may set (``name`` and ``_target_`` aside)."""
        return {k.name: k for k in cls.knobs}

    @classmethod
    def unknown_field(cls, key: str, node: Mapping[str, Any], known: Sequence[str]) -> str:
        """Why ``key`` is not a field (after the field's name): a "did you mean" at least."""
        return did_you_mean(key, known)

    @classmethod
    def samplings(cls, node: Mapping[str, Any] | None = None) -> tuple[tuple[str, Sampling], ...]:
        """Who declares which sampling settings for a config node of this class: (who, declaration)
        pairs (a composition: its proposer's and its verifier's)."""
        return ((f"decoder {(node or {}).get('name') or cls.name!r}", sampling_of(cls)),)

    def _node(self) -> dict[str, Any]:
        """What ``samplings`` reads of this decoder's config node."""
        return {"name": self.name}

    def sampling_problem(self, temperature: float, top_k: int = 0, top_p: float = 1.0) -> str | None:
        """Why this decoder does not support these sampling settings, in one line; None if it does."""
        return unsupported(self.samplings(self._node()), temperature, top_k, top_p)

    @classmethod
    def settings(cls, node: Mapping[str, Any], args: Sequence[Any] = ()) -> dict[str, Any]:
        """The fields' values for a config node (defaults filled in, checked, as the code takes
        them); positional ``args`` bind in field order. KnobError names the first bad field."""
        knobs = cls.fields(node)
        if len(args) > len(knobs):
            raise TypeError(f"{cls.__name__} takes {len(knobs)} positional fields ({', '.join(knobs)})")
        given = {**dict(zip(knobs, args)), **{k: v for k, v in node.items() if k not in ("_target_", "name")}}
        title = node.get("name") or cls.name
        for key in given:
            if key not in knobs:
                takes = f"{title} takes {', '.join(knobs)}" if knobs else f"{title} has no fields"
                detail = f"{cls.unknown_field(str(key), node, list(knobs))} ({takes})"
                raise KnobError(f"unknown field {key!r}{detail}", str(key), unknown=True, detail=detail)
        return {n: k.check(given.get(n, k.default)) for n, k in knobs.items()}

    def set_fields(self, args: Sequence[Any], values: Mapping[str, Any]) -> dict[str, Any]:
        """Check the fields (``settings``) and set them as attributes of this decoder."""
        node = {**values, **({"name": self.name} if self.name != type(self).name else {})}
        checked = self.settings(node, args)
        for n, v in checked.items():
            setattr(self, n, v)
        return checked

    def step(self, ctx: StepContext) -> StepOutput:
        """One step: its shape (knobs or ``auto``), the near-end clip, then ``decode``."""
        if not self.shape_knobs:
            return self.decode(ctx)
        auto = self._auto
        if auto is not None:
            shape = list(auto.choose(ctx)[: len(self.shape_knobs)])  # from past steps only
        else:
            shape = [getattr(self, k) for k in self.shape_knobs]
        shape[0] = min(shape[0], max(ctx.remaining - self.reserve, 0))
        if shape[0] == 0:
            return target_only(ctx)
        out = self.decode(ctx, *shape)
        return auto.record(ctx, out) if auto is not None else out

    def decode(self, ctx: StepContext, *shape: int) -> StepOutput:  # pragma: no cover - abstract
        raise NotImplementedError

    def config_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


def target_only(ctx: StepContext) -> StepOutput:
    """The step when no room is left to draft (``remaining == 1``): y ~ warped p at the endpoint."""
    p = ctx.warping(ctx.target.root_logits)
    return StepOutput(tokens=[sample(p, ctx.generator, ctx.warping.support_bound)])


def plain_probs(logits: torch.Tensor) -> torch.Tensor:  # [..., V]
    """The model's plain softmax (temperature 1, no top-k/top-p), in float32 or float64."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return logits.to(dtype).softmax(-1)


"""The interfaces a decoding step programs against: ``TreeRunner`` and ``StepContext``.

``TreeRunner`` is what the engine and the decoders use of a model runner
(``mtad.core.runner.ModelRunner`` is the real one; a study may plug in another, e.g. a
table of precomputed logits, and drive the same ``mtad.core.engine.Engine``). Token-tree
node ids follow the one convention of the code base, documented in ``mtad.core.runner``:
row 0 is the root (the committed endpoint), nodes are rows ``1..N`` in the order
added, and a node's parent row is smaller than its own.

This module sits below the decoders and the drafting / verification maths
(``mtad.propose.beam``, ``mtad.decoders``); of the package it imports only ``mtad.core.warping``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from mtad.core.warping import Warping

ROOT = 0  # row of the root (the committed endpoint) in a step's tree; nodes are rows 1..N


class TreeRunner(Protocol):
    """One model, its cache and the current step's token tree (see ``mtad.core.runner``)."""

    name: str
    device: torch.device
    vocab_size: int | None  # width of the logits (None: the model's own)
    forward_time: float  # seconds spent in forward passes, accumulated
    forward_calls: int  # forward passes, accumulated

    def prefill(self, ids: Sequence[int]) -> None:
        """Start a generation: cache all of ``ids`` but the last token."""

    def begin(self, committed: Sequence[int]) -> None:
        """Start a step for the committed sequence (its last token is the endpoint)."""

    @property
    def root_logits(self) -> torch.Tensor:  # [V]
        """Next-token logits at the endpoint (row 0)."""

    def forward(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:  # [m, V]
        """Add nodes (rows ``num_nodes + 1 ..``) under the given parent rows; their logits."""

    @property
    def num_nodes(self) -> int:
        """Nodes added this step (the last one is row ``num_nodes``)."""

    def depth(self, node: int) -> int:
        """Depth of a row (0 for the root)."""

    def end(self, committed: Sequence[int]) -> None:
        """End the step: keep the cached path matching ``committed``, drop the rest."""


@dataclass
class StepContext:
    committed: list[int]  # prompt + tokens emitted so far; the last one is the endpoint
    target: TreeRunner
    draft: TreeRunner | None
    warping: Warping
    generator: torch.Generator
    remaining: int  # new tokens still allowed; a decoder may draft fewer near the end

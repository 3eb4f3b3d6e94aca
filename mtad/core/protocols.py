"""The interfaces a decoding step programs against: ``TreeRunner``, ``StepContext``,
``Proposer`` and ``Verifier``.

``TreeRunner`` is what the engine and the decoders use of a model runner
(``mtad.core.runner.ModelRunner`` is the real one; a study may plug in another, e.g. a
table of precomputed logits, and drive the same ``mtad.core.engine.Engine``). Token-tree
node ids follow the one convention of the code base, documented in ``mtad.core.runner``:
row 0 is the root (the committed endpoint), nodes are rows ``1..N`` in the order
added, and a node's parent row is smaller than its own.

A speculative step is a ``Proposer`` (``mtad.propose``: drafts a token tree on the draft
model, ``mtad.core.tree.TokenTree``) and a ``Verifier`` (``mtad.verify``: one target pass over
what it needs of the tree and an acceptance rule); a decoder composes the two
(``mtad.decoders``). A proposer's ``kind`` (``PROPOSER_KINDS``) says what its draft passes look
like and a verifier's ``target_pass`` (``TARGET_PASSES``) what its target pass scores: one
vocabulary each, which is all the cost model (``mtad.autotune.costmodel.PROFILES``) needs to
know of them.

This module sits below the decoders and the drafting / verification maths
(``mtad.propose``, ``mtad.verify``, ``mtad.decoders``); of the package it imports only
``mtad.core.warping``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import torch

from mtad.core.warping import Warping

if TYPE_CHECKING:  # pragma: no cover
    from mtad.core.decoder import StepOutput
    from mtad.core.tree import TokenTree

ROOT = 0  # row of the root (the committed endpoint) in a step's tree; nodes are rows 1..N

#: ``Proposer.kind``: how a proposer's draft passes look for ``depth`` levels at ``width`` (the
#: new rows of each pass after the root's logits; the deepest level is never fed to the draft)
ProposerKind = Literal["chain", "beam", "chains", "tree"]
PROPOSER_KINDS: dict[ProposerKind, str] = {
    "chain": "one row per draft pass: a chain, one token per depth",
    "beam": "at most width rows per draft pass: the beam slots of one depth (equal paths share a row)",
    "chains": "at most one row per chain per draft pass: the next tokens of i.i.d. chains",
    "tree": "one draft pass per depth over the level's nodes (branching[d] children each)",
}
#: ``Verifier.target_pass``: what its one target pass (``mtad.verify.score``) scores
TargetPass = Literal["chain", "tree"]
TARGET_PASSES: dict[TargetPass, str] = {
    "chain": "one path: the drafted chain, or one path of the drafted tree (one row per depth)",
    "tree": "every distinct node of the drafted tree",
}


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


class Proposer(Protocol):
    """Drafts one step's token tree on ``ctx.draft`` (``mtad.propose``)."""

    #: how its draft passes look: one of ``PROPOSER_KINDS``
    kind: ProposerKind

    def propose(self, ctx: StepContext, depth: int, width: int = 1) -> TokenTree:
        """A tree of ``depth`` levels (``width``: the beam width, where the proposer has one)."""


class Verifier(Protocol):
    """Scores a drafted tree with the target (one pass, ``mtad.verify.score``) and decides what
    to emit with its acceptance rule (``mtad.verify``)."""

    #: what its target pass scores: one of ``TARGET_PASSES``
    target_pass: TargetPass
    lossless: bool  # its output follows the warped target distribution for a fitting proposer

    def verify(self, ctx: StepContext, tree: TokenTree) -> StepOutput:
        """Accepted tokens and one correction/bonus token; ``drafted`` is ``tree.depth``."""

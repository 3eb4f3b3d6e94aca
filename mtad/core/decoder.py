"""The decoder interface: one decoding step = draft, one target pass, verify.

A decoder proposes and verifies; the engine (``mtad.core.engine``) owns the loop,
commits the returned tokens and prunes both caches. A decoder never edits the
committed sequence or the caches directly: it adds nodes to the runners' step
trees (``ModelRunner.forward``) and returns the tokens to commit.

Vocabulary (as in the papers): *accepted* = draft tokens kept after
verification; *correction* = the token the target emits after a rejection;
*bonus* = the token it emits when every draft token was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    """Base class. Subclasses set ``uses_draft`` and implement ``step``."""

    name: str = "decoder"
    uses_draft: bool = True
    lossless: bool = True  # output follows the warped target distribution exactly
    stochastic: bool = True  # samples from the warped distributions (False: argmax rule)

    def __init__(self, name: str | None = None):
        if name is not None:
            self.name = name

    def step(self, ctx: StepContext) -> StepOutput:  # pragma: no cover - abstract
        raise NotImplementedError

    def config_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


def target_only(ctx: StepContext) -> StepOutput:
    """The step when no room is left to draft (``remaining == 1``): y ~ warped p at the endpoint."""
    p = ctx.warping(ctx.target.root_logits)
    return StepOutput(tokens=[sample(p, ctx.generator, ctx.warping.support_bound)])


def check_positive_int(field_name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field_name} must be an integer >= {minimum}, got {value!r}")
    return value

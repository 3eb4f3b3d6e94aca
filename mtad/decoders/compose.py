"""Decoders as compositions: a proposer (``mtad.propose``) and a verifier (``mtad.verify``).

``Composition`` is the base of every speculative decoder here: its ``decode`` drafts a token
tree with the proposer and hands it to the verifier; the decoder base
(``mtad.core.decoder.Decoder.step``) owns the step's shape (its ``shape_knobs``, ``auto``
included) and the near-end clip. A decoder class is its knobs and the two pieces it builds
from them (``compose``); with a knob ``auto`` it gets a shape chooser keyed by the pieces'
pass profile (``mtad.autotune.costmodel.profile_kind``), not by its name.

``Speculative`` composes pieces by name, so a new combination is a YAML file
(``conf/decoder/beam_specinfer.yaml``: beam drafts verified by SpecInfer's rule)::

    _target_: mtad.decoders.compose.Speculative
    proposer: beam        # chain | beam | chains
    verifier: specinfer   # speculative | specinfer | spectr | mcns
    gamma: ${gamma}
    width: ${width}

Only pairs whose verifier's assumptions the proposer meets are accepted (``FITS``):
speculative sampling needs a chain drawn from the warped draft; SpecInfer's rule needs
the candidates at a node to be i.i.d. draws from its ``q`` given their number (chains,
i.i.d. trees, and beam sampling *with replacement*: given its parent slot a draw is an
i.i.d. draw from the parent's ``q``, and how many children a slot gets does not depend on
their tokens); SpecTr's needs i.i.d. chains; MCNS takes any proposal. MCSS's rule needs
siblings drawn sequentially without replacement from ``q``, which beam sampling without
replacement does not give (a slot's number of children depends on the tokens drawn under
it), so it is not offered with beams.
"""

from __future__ import annotations

from mtad.autotune.autoshape import AUTO, auto_shape, check_shape_knob
from mtad.autotune.costmodel import profile_kind
from mtad.core.decoder import Decoder, StepContext, StepOutput
from mtad.propose.beam import Beam
from mtad.propose.chain import Chain
from mtad.propose.tree import Chains
from mtad.verify.chain import SpeculativeChain
from mtad.verify.multidraft import MultiDraft


class Composition(Decoder):
    """A proposer and a verifier; subclasses set ``shape_knobs`` and call ``compose``."""

    _proposer = None
    _verifier = None

    def compose(self, proposer, verifier) -> None:
        """Use these pieces; a knob ``auto`` gets a shape chooser for their pass profile."""
        self._proposer, self._verifier = proposer, verifier
        values = [getattr(self, k) for k in self.shape_knobs]
        if AUTO in values:
            kind = profile_kind(proposer.kind, verifier.target_pass)
            self._auto = auto_shape(kind, *values)  # mtad.autotune.autoshape

    def decode(self, ctx: StepContext, *shape: int) -> StepOutput:
        tree = self._proposer.propose(ctx, *shape)
        return self._verifier.verify(ctx, tree)


class _ChainsOf:
    """``Chains`` whose number of chains is the step's width."""

    kind = "chains"

    def propose(self, ctx: StepContext, depth: int, width: int = 1):
        return Chains(width).propose(ctx, depth)


#: proposer name -> (factory, whether it has a width); ``chains``: width = number of chains
PROPOSERS = {
    "chain": (Chain, False),
    "beam": (lambda: Beam(replacement=True), True),
    "chains": (lambda: _ChainsOf(), True),
}
VERIFIERS = {
    "speculative": SpeculativeChain,
    "specinfer": lambda: MultiDraft("specinfer"),
    "spectr": lambda: MultiDraft("spectr"),
    "mcns": lambda: MultiDraft("mcns"),
}
#: verifier -> the proposers it is lossless with (see the module docstring)
FITS = {
    "speculative": ("chain",),
    "specinfer": ("beam", "chains"),
    "spectr": ("chains",),
    "mcns": ("chain", "beam", "chains"),
}


class Speculative(Composition):
    """A proposer and a verifier named in the config (see the module docstring)."""

    name = "speculative"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)

    def __init__(
        self,
        proposer: str,
        verifier: str,
        gamma: int | str = 4,
        width: int | str = 4,
        name: str | None = None,
    ):
        super().__init__(name)
        if proposer not in PROPOSERS:
            raise ValueError(f"proposer must be one of {tuple(PROPOSERS)}, got {proposer!r}")
        if verifier not in VERIFIERS:
            raise ValueError(f"verifier must be one of {tuple(VERIFIERS)}, got {verifier!r}")
        if proposer not in FITS[verifier]:
            raise ValueError(
                f"verifier {verifier!r} is not lossless with a {proposer!r} proposer; "
                f"it fits: {', '.join(FITS[verifier])}"
            )
        self.proposer, self.verifier = proposer, verifier
        self.gamma = check_shape_knob("gamma", gamma)
        self.width = check_shape_knob("width", width)
        if proposer == "chains" and self.width == AUTO:
            raise ValueError("width (the number of chains) cannot be 'auto' for chains")
        self.compose(PROPOSERS[proposer][0](), VERIFIERS[verifier]())

    @property
    def shape_knobs(self) -> tuple[str, ...]:
        return ("gamma", "width") if PROPOSERS[self.proposer][1] else ("gamma",)

    @property
    def lossless(self) -> bool:
        return self._verifier.lossless

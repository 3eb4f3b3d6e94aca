"""Decoders as compositions: a proposer (``mtad.propose``) and a verifier (``mtad.verify``).

The pieces are registered here by name (``PROPOSERS``, ``VERIFIERS``); each piece class
declares, once, its knobs (``knobs``: ``mtad.core.knobs.Knob``, with range, default and use) and
what its drafts give (a proposer's ``provides``) or what it needs from a draft (a verifier's
``needs``), in the words of ``mtad.core.knobs.DRAFT_PROPERTIES``, and, where it does not support
every sampling setting, which it does (``sampling``: ``mtad.core.knobs.Sampling``). Everything
else is derived from those declarations: a composition's fields and their checks, where ``auto``
applies, which pairs fit, the sampling settings it supports (both pieces') and so whether it is
``stochastic``, the run config's schemas and command-line messages (``mtad.run.config``).

``Composition`` is the base of every decoder with a draft: a subclass names its proposer and
verifier (``proposer = "chain"``, ``verifier = "speculative"``) and is otherwise its name and
version; its fields are its pieces' knobs. Its ``decode`` drafts a token tree with the proposer
and hands it to the verifier; the decoder base (``mtad.core.decoder.Decoder.step``) owns the
step's shape (the proposer's shape knobs, ``auto`` included) and the near-end clip. With a
shape knob ``auto`` it gets a shape chooser keyed by the pieces' pass profile
(``mtad.autotune.costmodel.profile_kind``), not by its name; ``auto`` applies only where that
profile exists. A class adds logic of its own only where a decoder has some (``MJGD``).

``Speculative`` composes pieces named in the config, so a new combination is a YAML file
(``conf/decoder/greedy_match.yaml``: chain drafts checked against the target's argmaxes)::

    _target_: mtad.decoders.compose.Speculative
    name: greedy_match
    proposer: chain
    verifier: greedy_match
    gamma: ${gamma}

A pair fits when the proposer gives everything the verifier needs: speculative sampling needs
a chain with the rows q it was drawn from; SpecInfer's rule needs the candidates at a node to
be i.i.d. draws from its ``q`` given their number (i.i.d. trees, chains, and beam sampling
*with replacement*: given its parent slot a draw is an i.i.d. draw from the parent's ``q``, and
how many children a slot gets does not depend on their tokens); MCSS's rule needs siblings
drawn without replacement from ``q``, which beam sampling without replacement does not give (a
slot's number of children depends on the tokens drawn under it); SpecTr's needs i.i.d.
chains; MCNS needs only the rows q of a tree; MTAD's thresholds need beam history; typical
acceptance, greedy match and BiLD's rollback need a chain. Other pairs are refused, in one line naming
what the verifier needs and the proposers that give it, before any model is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mtad.autotune.autoshape import auto_shape
from mtad.autotune.costmodel import profile_kind
from mtad.core.decoder import Decoder, StepContext, StepOutput
from mtad.core.knobs import (
    AUTO,
    DRAFT_PROPERTIES,
    Knob,
    KnobError,
    Rule,
    Sampling,
    did_you_mean,
    properties,
    sampling_of,
)
from mtad.propose.beam import Beam
from mtad.propose.chain import Chain, ConfidenceRun
from mtad.propose.tree import Chains, Tree
from mtad.verify.chain import SpeculativeChain
from mtad.verify.greedy import GreedyMatch
from mtad.verify.multidraft import MultiDraft
from mtad.verify.rollback import Rollback
from mtad.verify.threshold import JointThreshold, TreeThreshold
from mtad.verify.typical import TypicalAcceptance


@dataclass(frozen=True)
class Piece:
    """A registered piece: its class and the constructor arguments its name fixes."""

    cls: type
    fixed: tuple[tuple[str, Any], ...] = ()

    @property
    def knobs(self) -> tuple[Knob, ...]:
        return tuple(self.cls.knobs)

    def _args(self, values: Mapping[str, Any]) -> dict[str, Any]:
        own = {k.arg or k.name: values[k.name] for k in self.knobs if not k.shape and k.name in values}
        return {**dict(self.fixed), **own}

    def provides(self, values: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """What its drafts give, with these knob values (default: the knobs' defaults)."""
        return properties(getattr(self.cls, "provides", ()), **self._args(values or {}))

    def needs(self, values: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """What it needs from a draft, with these knob values (default: the knobs' defaults)."""
        return properties(getattr(self.cls, "needs", ()), **self._args(values or {}))

    def cdf_draws(self, values: Mapping[str, Any] | None = None) -> str | None:
        """The name of its own inverse-CDF draws with these knob values (its class's ``cdf_draws``),
        None where it draws as ``mtad.core.sampling`` does: a point's ``draw_version`` names it
        (``mtad.run.results.identity.draw_version``)."""
        draws = getattr(self.cls, "cdf_draws", None)
        return draws(**self._args(values or {})) if draws is not None else None

    @property
    def sampling(self) -> Sampling:
        """The sampling settings it supports (its class's ``sampling``; absent: any)."""
        return sampling_of(self.cls)

    def build(self, values: Mapping[str, Any]):
        return self.cls(**self._args(values))


def piece(cls: type, **fixed: Any) -> Piece:
    return Piece(cls, tuple(fixed.items()))


#: proposer name -> piece (a piece's knobs, shape knobs and ``provides`` are on its class)
PROPOSERS: dict[str, Piece] = {
    "chain": piece(Chain),
    "beam": piece(Beam),
    "chains": piece(Chains),
    "tree": piece(Tree, sampler="iid"),
    "tree_without_replacement": piece(Tree, sampler="without_replacement"),
    "confidence_run": piece(ConfidenceRun),
}
#: verifier name -> piece (its knobs and ``needs`` are on its class)
VERIFIERS: dict[str, Piece] = {
    "speculative": piece(SpeculativeChain),
    "specinfer": piece(MultiDraft, rule="specinfer"),
    "mcss": piece(MultiDraft, rule="mcss"),
    "spectr": piece(MultiDraft, rule="spectr"),
    "mcns": piece(MultiDraft, rule="mcns"),
    "typical": piece(TypicalAcceptance),
    "threshold": piece(JointThreshold),
    "tree_threshold": piece(TreeThreshold),
    "rollback": piece(Rollback),
    "greedy_match": piece(GreedyMatch),
}
_WHERE = "a new piece is registered in PROPOSERS / VERIFIERS of mtad/decoders/compose.py"
PROPOSER = Knob("proposer", Rule("choice", options=tuple(PROPOSERS), hint=_WHERE), None)
VERIFIER = Knob("verifier", Rule("choice", options=tuple(VERIFIERS), hint=_WHERE), None)


def _named(kind: str, name: Any, registry: Mapping[str, Piece]) -> Piece:
    if not isinstance(name, str) or name not in registry:
        raise KnobError(
            f"{kind} must be one of {', '.join(map(repr, registry))}, got {name!r}"
            f"{did_you_mean(str(name), registry) or '; ' + _WHERE}",
            kind, name)
    return registry[name]


def has_profile(proposer: str, verifier: str) -> bool:
    """Whether the cost model knows the pair's pass profile (``auto`` shapes apply)."""
    try:
        profile_kind(PROPOSERS[proposer].cls.kind, VERIFIERS[verifier].cls.target_pass)
    except ValueError:
        return False
    return True


def composition_knobs(proposer: str, verifier: str) -> dict[str, Knob]:
    """The fields of a proposer + verifier composition, in order: the proposer's knobs, then the
    verifier's; a shape knob takes ``auto`` only where the pair has a cost profile."""
    p, v = _named("proposer", proposer, PROPOSERS), _named("verifier", verifier, VERIFIERS)
    auto = has_profile(proposer, verifier)
    out: dict[str, Knob] = {}
    for k in (*p.knobs, *v.knobs):
        if k.name in out:
            if out[k.name].rule != k.rule and out[k.name].without_auto().rule != k.without_auto().rule:
                raise TypeError(f"{proposer} and {verifier} both declare {k.name!r}, differently")
            continue
        out[k.name] = k if auto or not k.auto else k.without_auto()
    return out


def fit(proposer: str, verifier: str, values: Mapping[str, Any] | None = None) -> None:
    """KnobError in one line when the proposer (with these knob values) does not give what the
    verifier needs, naming what is missing and the proposers that give it (with their defaults)."""
    p, v, values = PROPOSERS[proposer], VERIFIERS[verifier], values or {}
    missing = [m for m in v.needs(values) if m not in p.provides(values)]
    if not missing:
        return
    givers = [n for n, q in PROPOSERS.items() if all(m in q.provides() for m in v.needs(values))]
    settings = "".join(f", {k.name}={values[k.name]!r}" for k in p.knobs
                       if not k.shape and values.get(k.name, k.default) != k.default)
    raise KnobError(
        f"verifier {verifier!r} needs {'; '.join(DRAFT_PROPERTIES[m] for m in missing)}, which proposer "
        f"{proposer!r}{settings} does not give; proposers that give it: {', '.join(givers) or 'none'}",
        "proposer", proposer)


class Composition(Decoder):
    """A proposer and a verifier, named by the class (``proposer``, ``verifier``) or the config."""

    proposer: str = ""
    verifier: str = ""
    _proposer = None
    _verifier = None
    _shape: tuple[str, ...] = ()
    _pieces: tuple[str, str] = ("", "")

    def __init__(self, *args: Any, name: str | None = None, **values: Any):
        super().__init__(name)
        self._build(values, args)

    # ------------------------------------------------------------------ declarations

    @classmethod
    def pieces(cls, node: Mapping[str, Any]) -> tuple[str, str]:
        """The (proposer, verifier) names of a config node of this class."""
        return cls.proposer, cls.verifier

    @classmethod
    def fields(cls, node: Mapping[str, Any] | None = None) -> dict[str, Knob]:
        return composition_knobs(*cls.pieces(node or {}))

    @classmethod
    def samplings(cls, node: Mapping[str, Any] | None = None) -> tuple[tuple[str, Sampling], ...]:
        """The proposer's and the verifier's sampling declarations: a composition supports what both do."""
        proposer, verifier = cls.pieces(node or {})
        return ((f"proposer {proposer!r}", PROPOSERS[proposer].sampling),
                (f"verifier {verifier!r}", VERIFIERS[verifier].sampling))

    def _node(self) -> dict[str, Any]:
        return {"name": self.name, "proposer": self._pieces[0], "verifier": self._pieces[1]}

    @property
    def stochastic(self) -> bool:
        """Whether it samples at temperature > 0 (False: its pieces support temperature 0 only)."""
        return all(s.sampled for _, s in self.samplings(self._node()))

    @classmethod
    def unknown_field(cls, key: str, node: Mapping[str, Any], known: Sequence[str]) -> str:
        proposer = cls.pieces(node)[0]
        if key in {k.name for q in PROPOSERS.values() for k in q.knobs if k.shape}:
            having = [n for n, q in PROPOSERS.items() if key in {k.name for k in q.knobs}]
            return f": a {proposer} composition has no {key} (proposers with a {key}: {', '.join(having)})"
        return did_you_mean(key, known)

    @classmethod
    def settings(cls, node: Mapping[str, Any], args: Sequence[Any] = ()) -> dict[str, Any]:
        proposer, verifier = cls.pieces(node)
        cls._fixed_pieces(node)
        fit(proposer, verifier, {k.name: node.get(k.name, k.default) for k in PROPOSERS[proposer].knobs})
        return super().settings(node, args)

    @classmethod
    def _fixed_pieces(cls, node: Mapping[str, Any]) -> None:
        """KnobError when a node of a class that fixes its pieces names a proposer or a verifier:
        the class is the reason (not its other fields), then whether the pair asked for would fit."""
        asked = {k: node[k] for k in ("proposer", "verifier") if k in node and k not in cls.fields(node)}
        if not asked:
            return
        proposer, verifier = cls.pieces(node)
        title = node.get("name") or cls.name
        key, value = next(iter(asked.items()))
        pair = {"proposer": proposer, "verifier": verifier, **asked}
        try:
            _named(key, value, PROPOSERS if key == "proposer" else VERIFIERS)
            fit(pair["proposer"], pair["verifier"])
            then = f"; proposer {pair['proposer']!r} and verifier {pair['verifier']!r} fit"
        except KnobError as e:
            then = f"; and that pair would not fit: {e}"
        detail = (f": {title}'s class fixes its pieces (proposer {proposer!r}, verifier {verifier!r}); "
                  "another pair is a YAML naming both with _target_: mtad.decoders.compose.Speculative "
                  f"(as conf/decoder/greedy_match.yaml does){then}")
        raise KnobError(f"unknown field {key!r}{detail}", key, unknown=True, detail=detail)

    # ------------------------------------------------------------------ building

    def _build(self, node: Mapping[str, Any], args: Sequence[Any] = ()) -> None:
        checked = self.set_fields(args, node)
        proposer, verifier = self._pieces = self.pieces(node)
        p = PROPOSERS[proposer]
        depth_from = getattr(p.cls, "depth_from", None)
        if depth_from:  # the draft's depth is a field's length (a tree's k_config)
            self.gamma = len(checked[depth_from])
            self._shape = ("gamma",)
        else:
            self._shape = tuple(k.name for k in p.knobs if k.shape)
        self.compose(p.build(checked), VERIFIERS[verifier].build(checked))

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

    @property
    def shape_knobs(self) -> tuple[str, ...]:
        return self._shape

    @property
    def lossless(self) -> bool:
        return self._verifier.lossless


class Speculative(Composition):
    """A proposer and a verifier named in the config (see the module docstring)."""

    name = "speculative"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)

    def __init__(self, proposer: str, verifier: str, name: str | None = None, **values: Any):
        Decoder.__init__(self, name)
        self._build({"proposer": proposer, "verifier": verifier, **values})

    @classmethod
    def pieces(cls, node: Mapping[str, Any]) -> tuple[str, str]:
        return node.get("proposer"), node.get("verifier")

    @classmethod
    def fields(cls, node: Mapping[str, Any] | None = None) -> dict[str, Knob]:
        return {"proposer": PROPOSER, "verifier": VERIFIER, **composition_knobs(*cls.pieces(node or {}))}

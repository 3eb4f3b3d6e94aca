"""Knobs: what one setting of a piece or a run accepts, declared once and read everywhere.

A ``Rule`` says which values a field accepts (kind, range, choices, the strings accepted
besides) and writes that as text; a ``Knob`` is a named setting of a piece (a proposer in
``mtad.propose``, a verifier in ``mtad.verify``, a decoder in ``mtad.decoders``) with its rule,
its default, and how it is used. The pieces declare their knobs as a class attribute
``knobs``; the decoders' checks, the run config's schemas and checks (``mtad.run.config``) and
the command line's messages are derived from those declarations, so a range is written once.

The knobs shared by pieces of different packages, or by a piece and the top-level config
(``conf/config.yaml``: ``gamma``, ``tau``, ``width``), are declared here; a piece's own knobs are
declared on the piece.

``Sampling`` says which sampling settings a piece supports (its class attribute ``sampling``,
next to ``knobs`` and ``needs``; absent: any): temperature 0 only, temperature > 0 only, and
whether top-k / top-p apply. A composition supports what both its pieces support; the run
config's check refuses an unsupported setting in one line before anything loads, the engine
refuses it too, and the tests, the draw fingerprints and the sweeps take only supported ones.

``DRAFT_PROPERTIES`` is the vocabulary in which a proposer says what its drafts give
(``provides``) and a verifier what it needs from a draft (``needs``); a composition of a
proposer and a verifier fits when the first gives everything the second needs.

This module knows no piece, decoder or config file.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

#: The string a shape knob may take instead of a number: the cost model chooses it per step
#: (``mtad.autotune.autoshape``), where it has a profile for the decoder's pieces.
AUTO = "auto"


class KnobError(ValueError):
    """A field has a bad value (``rule``: the rule it broke) or is unknown (``unknown``); the
    message is one line naming the field and what it accepts."""

    def __init__(self, message: str, field: str = "", value: Any = None, rule: Rule | None = None,
                 unknown: bool = False, detail: str = ""):
        super().__init__(message)
        self.field, self.value, self.rule, self.unknown, self.detail = field, value, rule, unknown, detail


def did_you_mean(word: str, options: Iterable[str]) -> str:
    near = difflib.get_close_matches(word, list(options), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""


@dataclass(frozen=True)
class Rule:
    """What one field accepts. ``kind``: ``integer``, ``number`` (int or float; ``inf`` passes
    unless ``high_open``), ``integers`` (a non-empty list of integers, each in range), ``bool``
    or ``choice`` (one of ``options``: a tuple, or a function returning them, read when asked).
    Bounds: ``low`` inclusive unless ``low_open``, ``high`` inclusive unless ``high_open``.
    ``special``: strings accepted besides (``auto``). ``example`` makes the hint
    (``e.g. <field>=<example>``) unless ``hint``."""

    kind: str
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    nullable: bool = False
    options: tuple[str, ...] | Callable[[], Iterable[str]] = ()
    special: tuple[str, ...] = ()
    means: str = ""
    example: str = ""
    hint: str = ""

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(self.options() if callable(self.options) else self.options)

    def _bound(self, x: float) -> str:
        return str(int(x)) if self.kind in ("integer", "integers") and math.isfinite(x) else f"{x:g}"

    def _range(self) -> str:
        if self.high != math.inf:
            return (f"in {'(' if self.low_open else '['}{self._bound(self.low)}, "
                    f"{self._bound(self.high)}{')' if self.high_open else ']'}")
        if self.low == -math.inf:
            return ""
        return f"{'>' if self.low_open else '>='} {self._bound(self.low)}"

    def text(self) -> str:
        rng = self._range()
        if self.kind == "bool":
            out = "true or false"
        elif self.kind == "choice":
            out = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.kind == "integers":
            out = f"a non-empty list of integers {rng}".rstrip()
        elif self.kind == "integer":
            out = f"an integer {rng}".rstrip()
        else:
            out = (("a finite number " if self.high == math.inf and self.high_open else "") + rng).strip() or "a number"
        out += " or null" if self.nullable else ""
        out += "".join(f" or {v!r}" for v in self.special)
        return out + (f" ({self.means})" if self.means else "")

    def _number(self, v: Any, integer: bool) -> bool:
        if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
            return False
        above = v > self.low if self.low_open else v >= self.low
        below = v < self.high if self.high_open else v <= self.high
        return above and below

    def ok(self, v: Any) -> bool:
        if v is None:
            return self.nullable
        if isinstance(v, str) and v in self.special:
            return True
        if self.kind == "bool":
            return isinstance(v, bool)
        if self.kind == "choice":
            return isinstance(v, str) and v in self.choices
        if self.kind == "integers":
            return (isinstance(v, Sequence) and not isinstance(v, str) and len(v) > 0
                    and all(self._number(k, True) for k in v))
        return self._number(v, self.kind == "integer")

    def message(self, name: str, value: Any) -> str:
        return f"{name} must be {self.text()}, got {value!r}"

    def check(self, name: str, value: Any) -> Any:
        """``value`` as the code takes it (floats for numbers, a list for integers); ValueError
        naming ``name`` and the rule otherwise."""
        if not self.ok(value):
            raise KnobError(self.message(name, value), name, value, self)
        if value is None or (isinstance(value, str) and value in self.special):
            return value
        if self.kind == "number":
            return float(value)
        if self.kind == "integers":
            return [int(k) for k in value]
        return value


@dataclass(frozen=True)
class Knob:
    """A named setting of a piece: its ``rule``, its ``default`` and how it is used.

    ``arg``: the piece's constructor argument it is passed as (default: ``name``).
    ``shape``: it sets a step's shape (the draft's depth, or its width) and is passed to
    ``propose`` each step, not to the constructor; ``auto`` applies to a shape knob whose rule
    accepts it, where the cost model has a profile for the pieces (``mtad.decoders.compose``).
    ``shared``: a top-level knob of the run config (``conf/config.yaml``) that a decoder's YAML
    interpolates (``gamma: ${gamma}``). ``identity``: its value changes the generated tokens, so
    it enters the point's identity: a decoder's YAML writes it, never leaving it to this default
    (the identity hashes the decoder node as its YAML writes it)."""

    name: str
    rule: Rule
    default: Any
    arg: str = ""
    shape: bool = False
    shared: bool = False
    identity: bool = True

    @property
    def auto(self) -> bool:
        return AUTO in self.rule.special

    def without_auto(self) -> Knob:
        """This knob where ``auto`` does not apply."""
        special = tuple(s for s in self.rule.special if s != AUTO)
        return replace(self, rule=replace(self.rule, special=special))

    def check(self, value: Any) -> Any:
        return self.rule.check(self.name, value)


# ----------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class Sampling:
    """The sampling settings a piece supports (its ``sampling``): ``greedy`` (temperature 0),
    ``sampled`` (temperature > 0), and at temperature > 0 ``top_k`` / ``top_p``. ``why``: the
    reason it supports no more, named in a refusal."""

    greedy: bool = True
    sampled: bool = True
    top_k: bool = True
    top_p: bool = True
    why: str = ""

    def problem(self, temperature: float, top_k: int = 0, top_p: float = 1.0) -> str | None:
        """Why these settings are not supported, in a few words naming the fix; None if they are."""
        why = f" ({self.why})" if self.why else ""
        if temperature == 0:
            if not self.greedy:
                return f"needs temperature > 0{why}, got temperature=0; e.g. temperature=1.0"
            return None
        if not self.sampled:
            return f"supports temperature 0 only{why}, got temperature={temperature:g}; set temperature=0"
        if top_k and not self.top_k:
            return f"does not support top-k{why}, got top_k={top_k}; set top_k=0"
        if top_p < 1 and not self.top_p:
            return f"does not support top-p{why}, got top_p={top_p:g}; set top_p=1.0"
        return None


#: Any temperature, top-k and top-p: what a piece without a ``sampling`` declaration supports.
ANY_SAMPLING = Sampling()


def sampling_of(piece: Any) -> Sampling:
    """A piece's (class's) ``sampling`` declaration; ``ANY_SAMPLING`` where it declares none."""
    declared = getattr(piece, "sampling", ANY_SAMPLING)
    return declared if isinstance(declared, Sampling) else ANY_SAMPLING


def unsupported(declared: Iterable[tuple[str, Sampling]], temperature: float, top_k: int = 0,
                top_p: float = 1.0) -> str | None:
    """The first of (who, declaration) that does not support these settings, in one line
    (``"verifier 'greedy_match' supports temperature 0 only (...)"``), or None."""
    for who, sampling in declared:
        problem = sampling.problem(temperature, top_k, top_p)
        if problem:
            return f"{who} {problem}"
    return None


# ----------------------------------------------------------------------------- shared knobs

GAMMA = Knob("gamma", Rule("integer", 1, special=(AUTO,), means="draft tokens per step", example="4"),
             4, shape=True, shared=True)
WIDTH = Knob("width", Rule("integer", 1, special=(AUTO,), means="beam width W", example="4"),
             4, shape=True, shared=True)
TAU = Knob("tau", Rule("number", 0, low_open=True, means="MTAD acceptance threshold; .inf allowed",
                       example="0.5"), 0.5, shared=True)
MODE = Knob("mode", Rule("choice", options=("greedy", "sampling"), example="greedy"), "greedy")

#: What a draft may give and a verifier may need (``provides`` / ``needs`` of the pieces).
DRAFT_PROPERTIES = {
    "chain": "a single chain of draft tokens",
    "chain_q": "the warped draft rows q its chain was drawn from (one per token)",
    "node_q": "the warped draft rows q at every row of its tree",
    "iid_children": "i.i.d. children (a node's children are i.i.d. draws from its q, their number "
                    "independent of their tokens)",
    "siblings_without_replacement": "siblings drawn one by one without replacement from q",
    "iid_chains": "i.i.d. chains under the root",
    "beam_history": "beam history (the beams' weights and cumulative log q)",
}


def properties(value: Any, **args: Any) -> tuple[str, ...]:
    """A piece's ``provides`` / ``needs``: a tuple, or a function of its constructor arguments."""
    return tuple(value(**args) if callable(value) else value)

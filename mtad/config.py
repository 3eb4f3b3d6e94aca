"""The run config's schema and checks: one place that says which values are valid.

``MtadConfig`` is registered in Hydra's ConfigStore as ``mtad_schema`` and is the first entry
of ``conf/config.yaml``'s defaults list, so OmegaConf checks types while composing (``limit=abc``
fails there) and the set of top-level keys is closed. ``validate`` checks ranges, one rule per
field (``RULES``), with messages that name the field and a fix; ``describe_error`` turns
Hydra's composition errors into the same kind of message.

Decoder knobs: ``KNOBS`` are top-level values shared by decoders. A decoder declares the knobs
it uses in its YAML by interpolating them (``gamma: ${gamma}``); ``decoder_knobs`` reads that
declaration. A knob set explicitly (command line, experiment or sweep file) for a decoder that
does not use it is an error (``check_knobs``); defaults in ``conf/config.yaml`` never are.
This module knows nothing about results or runs.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
#: Top-level knobs a decoder YAML may interpolate.
KNOBS = ("gamma", "tau", "width")
#: Config groups (folders of conf/) that name a YAML file.
GROUPS = ("model", "decoder", "task", "logger", "experiment")
#: Values a knob may take besides numbers: knob -> strings (``auto``: mtad.autoshape chooses per step).
SPECIAL_VALUES: dict[str, tuple[str, ...]] = {"gamma": ("auto",), "width": ("auto",)}


class ConfigError(ValueError):
    """A config field has a bad value; the message names the field and the fix."""


@dataclass
class MtadConfig:
    model: Any = None
    decoder: Any = None
    task: Any = None
    logger: Any = None
    seed: int = 42
    gamma: Any = 4  # Any, not int: leaves room for SPECIAL_VALUES
    tau: float = 0.5
    width: Any = 4  # Any, not int: leaves room for SPECIAL_VALUES
    temperature: float = 1.0
    top_k: int = 10
    top_p: float = 0.9
    max_new_tokens: int = 128
    limit: Optional[int] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    warmup: int = 1
    resume: bool = True
    wait_lock: bool = False
    perplexity: bool = True
    output_dir: Optional[str] = None  # noqa: UP045
    sweep: Any = None  # a sweep file's block (name, root, profiles, estimate)


ConfigStore.instance().store(name="mtad_schema", node=MtadConfig)
TOP_LEVEL_KEYS = tuple(f.name for f in fields(MtadConfig))


@dataclass(frozen=True)
class Rule:
    integer: bool  # an int (else any number)
    low: float  # inclusive unless low_open
    high: float = math.inf  # inclusive
    low_open: bool = False
    nullable: bool = False
    means: str = ""
    hint: str = ""

    def text(self, special: tuple[str, ...] = ()) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.high != math.inf:
            rng = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        else:
            rng = f"{'>' if self.low_open else '>='} {self.low:g}"
        out = f"{kind} {rng}" if self.integer else rng
        out += " or null" if self.nullable else ""
        out += "".join(f" or {v!r}" for v in special)
        return out + (f" ({self.means})" if self.means else "")

    def ok(self, v: Any) -> bool:
        if v is None:
            return self.nullable
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if self.integer and not isinstance(v, int):
            return False
        above = v > self.low if self.low_open else v >= self.low
        return above and v <= self.high


RULES: dict[str, Rule] = {
    "gamma": Rule(True, 1, means="draft tokens per step", hint="e.g. gamma=4"),
    "tau": Rule(False, 0, low_open=True, means="MTAD acceptance threshold; .inf allowed", hint="e.g. tau=0.5"),
    "width": Rule(True, 1, means="beam width W", hint="e.g. width=4"),
    "temperature": Rule(False, 0, means="0 = greedy", hint="e.g. temperature=1.0"),
    "top_k": Rule(True, 0, means="0 = disabled", hint="e.g. top_k=10"),
    "top_p": Rule(False, 0, 1, low_open=True, hint="use top_p=1.0 to disable"),
    "max_new_tokens": Rule(True, 1, hint="e.g. max_new_tokens=128"),
    "limit": Rule(True, 1, nullable=True, means="null: all of the task's examples", hint="e.g. limit=30"),
    "seed": Rule(True, 0, hint="e.g. seed=42"),
    "warmup": Rule(True, 0, means="untimed generations before the run", hint="e.g. warmup=1"),
}


def field_message(name: str, value: Any) -> str:
    rule = RULES[name]
    return f"{name} must be {rule.text(SPECIAL_VALUES.get(name, ()))}, got {value!r}" + (f"; {rule.hint}" if rule.hint else "")


def validate(cfg: Any) -> None:
    """Check every ``RULES`` field of a composed config; raise ConfigError naming the first bad one."""
    for name, rule in RULES.items():
        if name not in cfg:
            continue
        value = cfg[name]
        if value in SPECIAL_VALUES.get(name, ()):
            continue
        if not rule.ok(value):
            raise ConfigError(field_message(name, value))


def decoder_knobs(decoder: Any) -> list[str]:
    """The knobs a decoder config interpolates (``gamma: ${gamma}``): the knobs it uses."""
    from omegaconf import DictConfig, OmegaConf

    raw = OmegaConf.to_container(decoder, resolve=False) if isinstance(decoder, DictConfig) else decoder
    text = repr(raw or {})
    return [k for k in KNOBS if re.search(r"\$\{" + k + r"\}", text)]


def check_knobs(cfg: Any, explicit: Iterable[str]) -> None:
    """Refuse a knob set explicitly for a decoder that does not use it."""
    from omegaconf import OmegaConf

    decoder = cfg.decoder
    uses = decoder_knobs(decoder)
    name = decoder.get("name") or str(decoder.get("_target_", "?")).rsplit(".", 1)[-1].lower()
    raw = OmegaConf.to_container(decoder, resolve=False)
    own = [k for k in raw if k not in ("_target_", "name") and k not in uses]
    for knob in KNOBS:
        if knob in explicit and knob not in uses:
            fields_text = ", ".join([*uses, *own])
            raise ConfigError(
                (f"{name} uses {fields_text}, not {knob}" if fields_text else f"{name} has no knobs")
                + f": drop {knob}=... for decoder={name}"
                + (f" (its own settings are decoder.{own[0]}=...)" if own else "")
            )


def did_you_mean(word: str, options: Iterable[str]) -> str:
    near = difflib.get_close_matches(word, list(options), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""


def file_keys(path: Path) -> set[str]:
    """Top-level keys an experiment or sweep file sets (not its defaults, hydra or sweep block)."""
    from omegaconf import OmegaConf

    data = OmegaConf.load(path)
    return {str(k) for k in data.keys() if k not in ("defaults", "hydra", "sweep")}


def explicit_keys(overrides: Iterable[str], files: Iterable[Path] = (), conf_dir: Path = CONF_DIR) -> set[str]:
    """Top-level keys the user set: in ``overrides`` (and experiment files they select) and ``files``."""
    out: set[str] = set()
    for o in overrides:
        key, _, value = o.partition("=")
        key = key.lstrip("+~").split(".", 1)[0]
        if key == "experiment" and value and (conf_dir / "experiment" / f"{value}.yaml").exists():
            out |= file_keys(conf_dir / "experiment" / f"{value}.yaml")
        elif not key.startswith("hydra"):
            out.add(key)
    for f in files:
        out |= file_keys(Path(f))
    return out


def describe_error(exc: BaseException, cfg_keys: Mapping[str, Iterable[str]] | None = None) -> str:
    """One line for a Hydra/OmegaConf composition error: the field rule or a "did you mean"."""
    cause = exc.__cause__ or exc
    text = f"{exc}\n{cause}"
    full_key = getattr(cause, "full_key", None) or _match(r"full_key: (\S+)", text)
    if full_key in RULES:
        value = _match(r"Value '([^']*)'", text)
        return field_message(full_key, value if value is not None else "?")
    missing = _match(r"Key '([^']+)' is not in struct", text) or _match(r"Key '([^']+)' not in", text)
    if missing and cfg_keys is not None:
        parent = full_key.rsplit(".", 1)[0] if full_key and "." in full_key else ""
        return f"unknown key {full_key or missing!r}{did_you_mean(missing, cfg_keys.get(parent, ()))}"
    first = str(exc).strip().splitlines()
    return first[0] if first else type(exc).__name__


def _match(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text)
    return m.group(1) if m else None

"""The run config's schema and checks: one place that says which values are valid.

``MtadConfig`` is registered in Hydra's ConfigStore as ``mtad_schema`` and is the first entry
of ``conf/config.yaml``'s defaults list, so OmegaConf checks types while composing (``limit=abc``
fails there) and the set of top-level keys is closed. ``validate`` checks values, one rule per
field (``RULES``: top-level and nested fields, ``task.limit``, ``decoder.k_config``, ...), with
messages that name the field and a fix; ``describe_error`` turns
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

from mtad.models.cpu_choice import register_resolver as register_cpu_pair_resolver

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
#: Top-level knobs a decoder YAML may interpolate.
KNOBS = ("gamma", "tau", "width")
#: Config groups (folders of conf/) that name a YAML file.
GROUPS = ("model", "decoder", "task", "logger", "experiment")
#: Values a knob may take besides numbers: knob -> strings (``auto``: mtad.autotune.autoshape chooses per step).
SPECIAL_VALUES: dict[str, tuple[str, ...]] = {
    name: ("auto",) for name in ("gamma", "width", "decoder.gamma", "decoder.width")
}


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
# ${mtad_cpu_pair:KEY}: the default pair (conf/model/qwen_coder_offline_auto.yaml) resolves through it
register_cpu_pair_resolver()
TOP_LEVEL_KEYS = tuple(f.name for f in fields(MtadConfig))


@dataclass(frozen=True)
class Rule:
    """What one config field accepts. ``kind``: ``integer``, ``number`` (int or float; ``inf``
    passes unless ``high_open``), ``integers`` (a non-empty list of integers, each in range),
    ``bool`` or ``choice`` (one of ``choices``). Bounds: ``low`` inclusive unless ``low_open``,
    ``high`` inclusive unless ``high_open``."""

    kind: str
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    nullable: bool = False
    choices: tuple[str, ...] = ()
    means: str = ""
    hint: str = ""

    def _bound(self, x: float) -> str:
        return str(int(x)) if self.kind in ("integer", "integers") and math.isfinite(x) else f"{x:g}"

    def _range(self) -> str:
        if self.high != math.inf:
            return (f"in {'(' if self.low_open else '['}{self._bound(self.low)}, "
                    f"{self._bound(self.high)}{')' if self.high_open else ']'}")
        if self.low == -math.inf:
            return ""
        return f"{'>' if self.low_open else '>='} {self._bound(self.low)}"

    def text(self, special: tuple[str, ...] = ()) -> str:
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
        out += "".join(f" or {v!r}" for v in special)
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
        if self.kind == "bool":
            return isinstance(v, bool)
        if self.kind == "choice":
            return isinstance(v, str) and v in self.choices
        if self.kind == "integers":
            return isinstance(v, (list, tuple)) and bool(v) and all(self._number(k, True) for k in v)
        return self._number(v, self.kind == "integer")


def _positive(hint: str, means: str = "") -> Rule:
    return Rule("integer", 1, means=means, hint=hint)


#: torch.manual_seed takes [-2**63, 2**64 - 1]; a seed up to 2**63 - 1 leaves room for the
#: per-example seeds (seed + 1000 * index + turn).
MAX_SEED = 2**63 - 1

#: One rule per config field, by dotted path: what ``validate`` (composed configs) and
#: ``mtad.run.cli`` (every value on the command line, sweeps included) accept, before anything
#: loads. A field without a rule is checked by its type only. The choices of
#: ``decoder.method`` / ``decoder.mode`` are the decoders' ``METHODS`` / ``MODES``.
RULES: dict[str, Rule] = {
    # top-level knobs and run settings (MtadConfig)
    "gamma": _positive("e.g. gamma=4", "draft tokens per step"),
    "tau": Rule("number", 0, low_open=True, means="MTAD acceptance threshold; .inf allowed", hint="e.g. tau=0.5"),
    "width": _positive("e.g. width=4", "beam width W"),
    "temperature": Rule("number", 0, means="0 = greedy", hint="e.g. temperature=1.0"),
    "top_k": Rule("integer", 0, means="0 = disabled", hint="e.g. top_k=10"),
    "top_p": Rule("number", 0, 1, low_open=True, hint="use top_p=1.0 to disable"),
    "max_new_tokens": _positive("e.g. max_new_tokens=128"),
    "limit": Rule("integer", 1, nullable=True, means="null: all of the task's examples", hint="e.g. limit=30"),
    "seed": Rule("integer", 0, MAX_SEED, means="torch.manual_seed, with room for per-example seeds",
                 hint="e.g. seed=42"),
    "warmup": Rule("integer", 0, means="untimed generations before the run", hint="e.g. warmup=1"),
    # decoder fields (conf/decoder/*.yaml)
    "decoder.gamma": _positive("e.g. gamma=4 (the knob) or decoder.gamma=4", "draft tokens per step"),
    "decoder.width": _positive("e.g. width=4 (the knob) or decoder.width=4", "beam width W"),
    "decoder.tau": Rule("number", 0, low_open=True, means="MTAD acceptance threshold; .inf allowed",
                        hint="e.g. tau=0.5 (the knob) or decoder.tau=0.5"),
    "decoder.replacement": Rule("bool", hint="e.g. decoder.replacement=true"),
    "decoder.compat_slot_index": Rule("bool", hint="e.g. decoder.compat_slot_index=false"),
    "decoder.k_config": Rule("integers", 1, means="children per node at each depth", hint="e.g. decoder.k_config=[4,2,2]"),
    "decoder.num_drafts": _positive("e.g. decoder.num_drafts=4"),
    "decoder.method": Rule("choice", choices=("exact", "beam", "auto"), hint="e.g. decoder.method=auto"),
    "decoder.beam_width": _positive("e.g. decoder.beam_width=16"),
    "decoder.max_enumeration": _positive("e.g. decoder.max_enumeration=100000"),
    "decoder.mode": Rule("choice", choices=("greedy", "sampling"), hint="e.g. decoder.mode=greedy"),
    "decoder.alpha_fb": Rule("number", 0, high_open=True, means="fallback threshold", hint="e.g. decoder.alpha_fb=0.6"),
    "decoder.alpha_rb": Rule("number", 0, means="rollback threshold; .inf allowed", hint="e.g. decoder.alpha_rb=5.0"),
    "decoder.max_run": _positive("e.g. decoder.max_run=10"),
    "decoder.eps": Rule("number", 0, 1, low_open=True, hint="e.g. decoder.eps=0.09"),
    "decoder.delta": Rule("number", 0, low_open=True, high_open=True, hint="e.g. decoder.delta=0.3"),
    # task fields (conf/task/*.yaml)
    "task.limit": Rule("integer", 1, nullable=True, means="null: all of the task's examples", hint="e.g. task.limit=30"),
    "task.max_prompt_tokens": _positive("e.g. task.max_prompt_tokens=1024"),
    "task.article_tokens": _positive("e.g. task.article_tokens=512"),
    "task.chat": Rule("bool", hint="e.g. task.chat=true"),
    "task.few_shot": Rule("bool", hint="e.g. task.few_shot=true"),
    "task.download": Rule("bool", hint="e.g. task.download=true"),
    "task.hub_timeout_s": Rule("number", 0, low_open=True, hint="e.g. task.hub_timeout_s=3.0"),
    "task.scorer.timeout": Rule("number", 0, low_open=True, means="seconds", hint="e.g. task.scorer.timeout=5.0"),
    "task.scorer.timeout_s": Rule("number", 0, low_open=True, means="seconds", hint="e.g. task.scorer.timeout_s=5.0"),
    "task.scorer.memory_mb": _positive("e.g. task.scorer.memory_mb=1024"),
    "task.scorer.max_rows": _positive("e.g. task.scorer.max_rows=10000"),
    "task.scorer.use_stemmer": Rule("bool", hint="e.g. task.scorer.use_stemmer=true"),
    "task.judge.timeout_s": Rule("number", 0, low_open=True, means="seconds", hint="e.g. task.judge.timeout_s=120"),
    # model fields (conf/model/*.yaml)
    "model.gpus": Rule("integer", 0, hint="e.g. model.gpus=1"),
    "model.threads": Rule("integer", 1, nullable=True, means="null: torch's default", hint="e.g. model.threads=8"),
    "model.eos_token_ids": Rule("integers", 0, hint="e.g. model.eos_token_ids=[2]"),
    **{f"model.{side}dtype": Rule("choice", choices=("float32", "bfloat16", "float16"), hint=f"e.g. model.{side}dtype=float32")
       for side in ("", "target.", "draft.")},
    **{f"model.{k}": _positive(f"e.g. model.{k}=32")
       for k in ("vocab_size", "hidden_size", "num_layers", "draft_hidden_size", "draft_num_layers")},
    "model.logit_scale": Rule("number", 0, low_open=True, high_open=True, hint="e.g. model.logit_scale=4.0"),
}


def field_message(name: str, value: Any) -> str:
    rule = RULES[name]
    near = did_you_mean(value, rule.choices) if rule.kind == "choice" and isinstance(value, str) else ""
    return (f"{name} must be {rule.text(SPECIAL_VALUES.get(name, ()))}, got {value!r}{near}"
            + (f"; {rule.hint}" if rule.hint and not near else ""))


_ABSENT = object()


def _value(cfg: Any, name: str) -> Any:
    """The plain value of the dotted field ``name`` of ``cfg``; _ABSENT when the config has no
    such field or it cannot be resolved here (composition reports that)."""
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.select(cfg, name, default=_ABSENT, throw_on_missing=False)
    except Exception:
        return _ABSENT
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return value


def validate(cfg: Any) -> None:
    """Check every ``RULES`` field of a composed config; raise ConfigError naming the first bad one."""
    for name, rule in RULES.items():
        value = _value(cfg, name)
        if value is _ABSENT or value in SPECIAL_VALUES.get(name, ()):
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

"""The run config's schemas and checks: one place that says which values are valid.

Schemas are dataclasses registered in Hydra's ConfigStore; each checked field carries its
``Rule`` (range, choices, hint) in its metadata, declared once and read by ``validate``:
- ``MtadConfig`` (``mtad_schema``), the first entry of ``conf/config.yaml``'s defaults list:
  OmegaConf checks its types while composing (``limit=abc`` fails there) and the set of
  top-level keys is closed;
- one schema per decoder class (``schema/decoder/<name>``, found by the node's ``_target_``):
  the fields the class takes. A field whose default interpolates a top-level knob
  (``gamma: ${gamma}``, as the decoder's YAML writes it) is a knob the decoder uses;
- ``TaskChecks`` and ``ModelChecks`` (``schema/task_checks``, ``schema/model_checks``): the
  task and model fields checked when a task or model has them.
Decoder, task and model schemas are checked against, never merged into the composed config
(a point's identity hashes those nodes exactly as their YAML writes them).

A knob set explicitly (command line, experiment or sweep file) for a decoder that does not use
it is an error (``check_knobs``); defaults in ``conf/config.yaml`` never are. ``describe_error``
turns Hydra's composition errors into the same one-line messages. This module knows nothing
about results or runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from mtad.models.cpu_choice import register_resolver as register_cpu_pair_resolver

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
#: Top-level knobs a decoder may use (its schema's knob fields interpolate them).
KNOBS = ("gamma", "tau", "width")
#: Config groups (folders of conf/) that name a YAML file.
GROUPS = ("model", "decoder", "task", "logger", "experiment")
#: torch.manual_seed takes [-2**63, 2**64 - 1]; a seed up to 2**63 - 1 leaves room for the
#: per-example seeds (seed + 1000 * index + turn).
MAX_SEED = 2**63 - 1


class ConfigError(ValueError):
    """A config field has a bad value; the message names the field and the fix."""


class MachineUnfit(ConfigError):
    """The config is valid but this machine cannot run it (a scorer's preflight: e.g. no
    bubblewrap); the message names what is missing and the fix. A sweep refuses as a whole on
    it (it is not a property of one grid point, and skipping the points would end the sweep
    "finished" with points never run)."""


@dataclass(frozen=True)
class Rule:
    """What one config field accepts. ``kind``: ``integer``, ``number`` (int or float; ``inf``
    passes unless ``high_open``), ``integers`` (a non-empty list of integers, each in range),
    ``bool`` or ``choice`` (one of ``choices``, read from ``source``, ``module:NAME`` of the code
    that owns them). Bounds: ``low`` inclusive unless ``low_open``, ``high`` inclusive unless
    ``high_open``. ``special``: strings accepted besides (``auto``: mtad.autotune.autoshape
    chooses per step). ``example`` makes the hint (``e.g. <field>=<example>``) unless ``hint``."""

    kind: str
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    nullable: bool = False
    source: str = ""
    special: tuple[str, ...] = ()
    means: str = ""
    example: str = ""
    hint: str = ""

    @property
    def choices(self) -> tuple[str, ...]:
        module, _, name = self.source.partition(":")
        return tuple(getattr(importlib.import_module(module), name)) if module else ()

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
            return isinstance(v, (list, tuple)) and bool(v) and all(self._number(k, True) for k in v)
        return self._number(v, self.kind == "integer")


def _positive(example: str, means: str = "") -> Rule:
    return Rule("integer", 1, means=means, example=example)


def _bool(example: str) -> Rule:
    return Rule("bool", example=example)


def _seconds(example: str) -> Rule:
    return Rule("number", 0, low_open=True, means="seconds", example=example)


# Rules shared by several fields (a knob and the decoder fields that interpolate it).
GAMMA = _positive("4", "draft tokens per step")
WIDTH = _positive("4", "beam width W")
TAU = Rule("number", 0, low_open=True, means="MTAD acceptance threshold; .inf allowed", example="0.5")
LIMIT = Rule("integer", 1, nullable=True, means="null: all of the task's examples", example="30")
GAMMA_OR_AUTO = dataclasses.replace(GAMMA, special=("auto",))  # mtad.autotune.autoshape.AUTO
WIDTH_OR_AUTO = dataclasses.replace(WIDTH, special=("auto",))
DTYPE = Rule("choice", source="mtad.models.offline:DTYPES", example="float32")


def checked(rule: Rule | None, default: Any = MISSING) -> Any:
    """A schema field and its rule (``default``: ``???``, the value comes from the YAML)."""
    return field(default=default, metadata={"rule": rule})


def knob(name: str, rule: Rule) -> Any:
    """A decoder field that uses the top-level knob ``name``: its default is ``${name}``."""
    return field(default=f"${{{name}}}", metadata={"rule": rule, "knob": name})


def nested(schema: type) -> Any:
    """A sub-node checked against ``schema`` when present."""
    return field(default=None, metadata={"schema": schema})


@dataclass
class MtadConfig:
    model: Any = None
    decoder: Any = None
    task: Any = None
    logger: Any = None
    seed: int = checked(Rule("integer", 0, MAX_SEED, means="torch.manual_seed, with room for per-example seeds",
                             example="42"), 42)
    gamma: Any = checked(GAMMA_OR_AUTO, 4)  # Any, not int: room for 'auto'
    tau: float = checked(TAU, 0.5)
    width: Any = checked(WIDTH_OR_AUTO, 4)  # Any, not int: room for 'auto'
    temperature: float = checked(Rule("number", 0, means="0 = greedy", example="1.0"), 1.0)
    top_k: int = checked(Rule("integer", 0, means="0 = disabled", example="10"), 10)
    top_p: float = checked(Rule("number", 0, 1, low_open=True, hint="use top_p=1.0 to disable"), 0.9)
    max_new_tokens: int = checked(_positive("128"), 128)
    limit: Optional[int] = checked(LIMIT, None)  # noqa: UP045 (OmegaConf reads typing.Optional)
    warmup: int = checked(Rule("integer", 0, means="untimed generations before the run", example="1"), 1)
    resume: bool = True
    wait_lock: bool = False
    perplexity: bool = True
    output_dir: Optional[str] = None  # noqa: UP045
    sweep: Any = None  # a sweep file's block (name, root, profiles, estimate)


TOP_LEVEL_KEYS = tuple(f.name for f in dataclasses.fields(MtadConfig))

# ----------------------------------------------------------------------------- decoders

#: Decoder schemas by the class they configure (``_target_``).
DECODER_SCHEMAS: dict[str, type] = {}


def _decoder(name: str):
    """Make a class a decoder schema: a dataclass, stored as ``schema/decoder/<name>``."""
    def register(cls: type) -> type:
        schema = dataclass(cls)
        DECODER_SCHEMAS[schema._target_] = schema
        ConfigStore.instance().store(group="schema/decoder", name=name, node=schema)
        return schema
    return register


@dataclass
class DecoderSchema:
    """What every decoder takes: its class and an optional display name (``bild_sampling``)."""

    _target_: str = MISSING
    name: Optional[str] = None  # noqa: UP045


@_decoder("greedy")
class GreedySchema(DecoderSchema):
    _target_: str = "mtad.decoders.autoregressive.Greedy"


@_decoder("multinomial")
class MultinomialSchema(DecoderSchema):
    _target_: str = "mtad.decoders.autoregressive.Multinomial"


@_decoder("spd")
class SpDSchema(DecoderSchema):
    _target_: str = "mtad.decoders.spd.SpD"
    gamma: Any = knob("gamma", GAMMA_OR_AUTO)


@_decoder("mtad")
class MTADSchema(DecoderSchema):
    _target_: str = "mtad.decoders.mtad.MTAD"
    gamma: Any = knob("gamma", GAMMA_OR_AUTO)
    width: Any = knob("width", WIDTH_OR_AUTO)
    tau: float = knob("tau", TAU)
    replacement: bool = checked(_bool("true"))


@_decoder("tree_mtad")
class TreeMTADSchema(MTADSchema):
    _target_: str = "mtad.decoders.tree_mtad.TreeMTAD"
    compat_slot_index: bool = checked(_bool("false"))


@_decoder("mjgd")
class MJGDSchema(DecoderSchema):
    _target_: str = "mtad.decoders.mjgd.MJGD"
    gamma: int = knob("gamma", GAMMA)
    method: str = checked(Rule("choice", source="mtad.decoders.mjgd:METHODS", example="auto"))
    beam_width: int = checked(_positive("16"))
    max_enumeration: int = checked(_positive("100000"))


@_decoder("mtjd")
class MTJDSchema(MJGDSchema):
    _target_: str = "mtad.decoders.mjgd.MTJD"


@_decoder("bild")
class BiLDSchema(DecoderSchema):
    _target_: str = "mtad.decoders.bild.BiLD"
    mode: str = checked(Rule("choice", source="mtad.decoders.bild:MODES", example="greedy"))
    alpha_fb: float = checked(Rule("number", 0, high_open=True, means="fallback threshold", example="0.6"))
    alpha_rb: float = checked(Rule("number", 0, means="rollback threshold; .inf allowed", example="5.0"))
    max_run: int = checked(_positive("10"))


@_decoder("specinfer")
class SpecInferSchema(DecoderSchema):
    _target_: str = "mtad.decoders.specinfer.SpecInfer"
    k_config: list[int] = checked(Rule("integers", 1, means="children per node at each depth", example="[4,2,2]"))


@_decoder("mcns")
class MCNSSchema(SpecInferSchema):
    _target_: str = "mtad.decoders.mcns.MCNS"


@_decoder("mcss")
class MCSSSchema(SpecInferSchema):
    _target_: str = "mtad.decoders.mcss.MCSS"


@_decoder("spectr")
class SpecTrSchema(DecoderSchema):
    _target_: str = "mtad.decoders.spectr.SpecTr"
    gamma: int = knob("gamma", GAMMA)
    num_drafts: int = checked(_positive("4"))


@_decoder("typical")
class TypicalSchema(DecoderSchema):
    _target_: str = "mtad.decoders.typical.Typical"
    gamma: int = knob("gamma", GAMMA)
    eps: float = checked(Rule("number", 0, 1, low_open=True, example="0.09"))
    delta: float = checked(Rule("number", 0, low_open=True, high_open=True, example="0.3"))


@_decoder("speculative")
class SpeculativeSchema(DecoderSchema):
    _target_: str = "mtad.decoders.compose.Speculative"
    proposer: str = checked(Rule("choice", source="mtad.decoders.compose:PROPOSERS", example="beam"))
    verifier: str = checked(Rule("choice", source="mtad.decoders.compose:VERIFIERS", example="specinfer"))
    gamma: Any = knob("gamma", GAMMA_OR_AUTO)
    width: Any = knob("width", WIDTH_OR_AUTO)


# ----------------------------------------------------------------------------- tasks and models


#: Bounds of the scorers' resources: a limit the sandbox or SQLite cannot apply is refused here,
#: with the rest of the config, not after the first generation. One day of seconds (``select``
#: and SQLite's deadline take it); 1 TiB of memory (``setrlimit`` takes bytes below 2**63).
MAX_SCORER_SECONDS, MAX_SCORER_MEMORY_MB = 86_400, 1 << 20


def _scorer_seconds(example: str) -> Rule:
    return Rule("number", 0, MAX_SCORER_SECONDS, low_open=True, means="seconds", example=example)


@dataclass
class ScorerChecks:
    timeout: Any = checked(_scorer_seconds("5.0"), None)
    timeout_s: Any = checked(_scorer_seconds("5.0"), None)
    memory_mb: Any = checked(Rule("integer", 1, MAX_SCORER_MEMORY_MB, example="1024"), None)
    max_rows: Any = checked(Rule("integer", 1, 10_000_000, example="10000"), None)
    output_limit: Any = checked(Rule("integer", 1, 1 << 30, means="bytes", example="65536"), None)
    drop_privileges: Any = checked(_bool("true"), None)
    isolation: Any = checked(Rule("choice", source="eval.sandbox:ISOLATIONS", example="rlimits"), None)
    keep_distinct: Any = checked(_bool("false"), None)
    use_stemmer: Any = checked(_bool("true"), None)


@dataclass
class JudgeChecks:
    timeout_s: Any = checked(_seconds("120"), None)


@dataclass
class TaskChecks:
    """Task fields checked when a task has them (tasks differ; their classes take the rest)."""

    limit: Any = checked(LIMIT, None)
    max_prompt_tokens: Any = checked(_positive("1024"), None)
    article_tokens: Any = checked(_positive("512"), None)
    chat: Any = checked(_bool("true"), None)
    few_shot: Any = checked(_bool("true"), None)
    download: Any = checked(_bool("true"), None)
    hub_timeout_s: Any = checked(Rule("number", 0, low_open=True, example="3.0"), None)
    scorer: Any = nested(ScorerChecks)
    judge: Any = nested(JudgeChecks)


@dataclass
class SideChecks:
    dtype: Any = checked(DTYPE, None)


@dataclass
class ModelChecks:
    """Model-pair fields checked when a pair has them (hub, offline and tiny pairs differ)."""

    gpus: Any = checked(Rule("integer", 0, example="1"), None)
    threads: Any = checked(Rule("integer", 1, nullable=True, means="null: torch's default", example="8"), None)
    eos_token_ids: Any = checked(Rule("integers", 0, example="[2]"), None)
    dtype: Any = checked(DTYPE, None)
    target: Any = nested(SideChecks)
    draft: Any = nested(SideChecks)
    vocab_size: Any = checked(_positive("32"), None)
    hidden_size: Any = checked(_positive("32"), None)
    num_layers: Any = checked(_positive("32"), None)
    draft_hidden_size: Any = checked(_positive("32"), None)
    draft_num_layers: Any = checked(_positive("32"), None)
    logit_scale: Any = checked(Rule("number", 0, low_open=True, high_open=True, example="4.0"), None)


_cs = ConfigStore.instance()
_cs.store(name="mtad_schema", node=MtadConfig)
_cs.store(group="schema", name="task_checks", node=TaskChecks)
_cs.store(group="schema", name="model_checks", node=ModelChecks)
# ${mtad_cpu_pair:KEY}: the default pair (conf/model/qwen_coder_offline_auto.yaml) resolves through it
register_cpu_pair_resolver()

# ----------------------------------------------------------------------------- checks

_ABSENT = object()


def _fields(schema: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(schema)}


def decoder_schema(decoder: Any) -> type:
    """The schema of a decoder node (or ``_target_``); ConfigError when its class has none."""
    target = decoder if isinstance(decoder, str) else str((decoder or {}).get("_target_"))
    if target not in DECODER_SCHEMAS:
        raise ConfigError(f"decoder class {target} has no schema: add one to mtad/run/config.py "
                          "(its fields and their rules)")
    return DECODER_SCHEMAS[target]


def _rule_in(schema: type | None, parts: list[str]) -> Rule | None:
    for part in parts[:-1]:
        f = _fields(schema).get(part)
        schema = f.metadata.get("schema") if f else None
        if schema is None:
            return None
    f = _fields(schema).get(parts[-1])
    return f.metadata.get("rule") if f else None


def rule_for(path: str, decoder: Any = None) -> Rule | None:
    """The rule of the dotted field ``path`` (``decoder.*``: of ``decoder``'s schema, else of
    the first decoder schema that has the field); None when the field has none."""
    head, _, rest = path.partition(".")
    if not rest:
        return _rule_in(MtadConfig, [head])
    if head == "decoder":
        schemas = [decoder_schema(decoder)] if decoder is not None else list(DECODER_SCHEMAS.values())
    else:
        schemas = {"task": [TaskChecks], "model": [ModelChecks]}.get(head, [])
    return next((r for s in schemas if (r := _rule_in(s, rest.split("."))) is not None), None)


def field_message(name: str, value: Any, rule: Rule | None = None) -> str:
    rule = rule or rule_for(name)
    near = did_you_mean(value, rule.choices) if rule.kind == "choice" and isinstance(value, str) else ""
    head, _, leaf = name.rpartition(".")
    if rule.hint or not rule.example:
        hint = rule.hint
    elif head == "decoder" and leaf in KNOBS:
        hint = f"e.g. {leaf}={rule.example} (the knob) or {name}={rule.example}"
    else:
        hint = f"e.g. {name}={rule.example}"
    return f"{name} must be {rule.text()}, got {value!r}{near}" + (f"; {hint}" if hint and not near else "")


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


def _check(cfg: Any, schema: type, prefix: str) -> None:
    """Every field of ``schema`` with a rule (sub-schemas included) that ``cfg`` has."""
    for f in dataclasses.fields(schema):
        path = f"{prefix}{f.name}"
        if "schema" in f.metadata:
            if isinstance(_value(cfg, path), Mapping):
                _check(cfg, f.metadata["schema"], f"{path}.")
            continue
        rule = f.metadata.get("rule")
        value = _value(cfg, path) if rule else _ABSENT
        if value is not _ABSENT and not rule.ok(value):
            raise ConfigError(field_message(path, value, rule))


def validate(cfg: Any) -> None:
    """Check a composed config against the schemas: the top-level fields, the decoder's own
    (an unknown one is refused), the task's and the model's; ConfigError names the first bad one."""
    _check(cfg, MtadConfig, "")
    decoder = cfg.get("decoder")
    if decoder is not None:
        schema = decoder_schema(decoder)
        names = list(_fields(schema))
        for key in decoder.keys():
            if key not in names:
                raise ConfigError(f"unknown key 'decoder.{key}'{did_you_mean(str(key), names)} "
                                  f"({_name(decoder)} takes {', '.join(names[1:])})")
        _check(cfg, schema, "decoder.")
    for section, schema in (("task", TaskChecks), ("model", ModelChecks)):
        if cfg.get(section) is not None:
            _check(cfg, schema, f"{section}.")


def check_scorer(cfg: Any) -> None:
    """The task's scorer's own preflight (``eval.base.Scorer.preflight``: e.g. HumanEval's
    bubblewrap probe) on its configured settings, before anything is loaded or written;
    ConfigError with its one-line reason. The config is a composed one (``conf/``)."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    node = OmegaConf.select(cfg, "task.scorer") if OmegaConf.is_config(cfg) else (cfg.get("task") or {}).get("scorer")
    if node is None:
        return
    settings = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
    target = settings.pop("_target_", None)
    if not target:
        return
    preflight = getattr(get_class(target), "preflight", None)
    if preflight is None:
        return
    try:
        preflight(**settings)
    except ValueError as e:  # the settings themselves
        raise ConfigError(str(e)) from None
    except RuntimeError as e:  # this machine (Scorer.preflight's contract)
        raise MachineUnfit(str(e)) from None


def decoder_knobs(decoder: Any) -> list[str]:
    """The top-level knobs a decoder uses: its schema's knob fields (``gamma: ${gamma}``)."""
    uses = {f.metadata.get("knob") for f in dataclasses.fields(decoder_schema(decoder))}
    return [k for k in KNOBS if k in uses]


def _name(decoder: Any) -> str:
    return decoder.get("name") or str(decoder.get("_target_", "?")).rsplit(".", 1)[-1].lower()


def check_knobs(cfg: Any, explicit: Iterable[str]) -> None:
    """Refuse a knob set explicitly for a decoder that does not use it."""
    decoder = cfg.decoder
    uses = decoder_knobs(decoder)
    own = [str(k) for k in decoder.keys() if k not in ("_target_", "name") and k not in uses]
    name = _name(decoder)
    for knob_name in KNOBS:
        if knob_name in explicit and knob_name not in uses:
            fields_text = ", ".join([*uses, *own])
            raise ConfigError(
                (f"{name} uses {fields_text}, not {knob_name}" if fields_text else f"{name} has no knobs")
                + f": drop {knob_name}=... for decoder={name}"
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
    """One line for a Hydra/OmegaConf composition error: the field's rule or a "did you mean"."""
    cause = exc.__cause__ or exc
    text = f"{exc}\n{cause}"
    full_key = getattr(cause, "full_key", None) or _match(r"full_key: (\S+)", text)
    rule = rule_for(full_key) if full_key else None
    if rule is not None:
        value = _match(r"Value '([^']*)'", text)
        return field_message(full_key, value if value is not None else "?", rule)
    missing = _match(r"Key '([^']+)' is not in struct", text) or _match(r"Key '([^']+)' not in", text)
    if missing and cfg_keys is not None:
        parent = full_key.rsplit(".", 1)[0] if full_key and "." in full_key else ""
        return f"unknown key {full_key or missing!r}{did_you_mean(missing, cfg_keys.get(parent, ()))}"
    first = str(exc).strip().splitlines()
    return first[0] if first else type(exc).__name__


def _match(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text)
    return m.group(1) if m else None

"""The run config's schemas and checks: one place that says which values are valid.

Schemas are dataclasses registered in Hydra's ConfigStore; each checked field carries its
``Rule`` (``mtad.core.knobs``: range, choices, hint) in its metadata, read by ``validate``:
- ``MtadConfig`` (``mtad_schema``), the first entry of ``conf/config.yaml``'s defaults list:
  OmegaConf checks its types while composing (``limit=abc`` fails there) and the set of
  top-level keys is closed;
- a decoder's schema is derived (``decoder_schema``) from what its class and its pieces
  declare (``knobs`` on the classes of ``mtad.propose``, ``mtad.verify``, ``mtad.decoders``;
  the top-level knobs ``gamma``, ``tau``, ``width`` in ``mtad.core.knobs``), never written
  here: its fields, their rules, where ``auto`` applies, and the pairs that fit are checked
  by the class's own ``settings`` (what its constructor runs), without building anything.
  A field that interpolates a top-level knob (``gamma: ${gamma}``, as the decoder's YAML
  writes it; ``shared`` in its declaration) is a knob the decoder uses;
- the sampling settings (``temperature``, ``top_k``, ``top_p``) a decoder's pieces support, as
  they declare it (``sampling``: ``mtad.core.knobs.Sampling``; ``sampling_problem``);
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
import functools
import importlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from mtad.core.knobs import GAMMA, TAU, WIDTH, Knob, KnobError, Rule, did_you_mean, unsupported
from mtad.models.cpu_choice import register_resolver as register_cpu_pair_resolver

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
#: Top-level knobs a decoder may use (its fields interpolate them: ``mtad.core.knobs``, ``shared``).
KNOBS = tuple(k.name for k in (GAMMA, TAU, WIDTH))
#: Config groups (folders of conf/) that name a YAML file.
GROUPS = ("model", "decoder", "task", "logger", "experiment")
#: torch.manual_seed takes [-2**63, 2**64 - 1]; a seed up to 2**63 - 1 leaves room for the
#: per-example seeds (seed + 1000 * index + turn).
MAX_SEED = 2**63 - 1
#: The longest generation any config may ask for: the longest context of a pair the project
#: knows (128k tokens; ``mtad.run.evaluate`` also holds it to the loaded pair's own context).
MAX_NEW_TOKENS = 1 << 17
#: ``top_k`` above this is no longer a filter (no vocabulary comes near it; torch.topk takes int32).
MAX_TOP_K = 2**31 - 1


class ConfigError(ValueError):
    """A config field has a bad value; the message names the field and the fix."""


class MachineUnfit(ConfigError):
    """The config is valid but this machine cannot run it (a scorer's preflight: e.g. no
    bubblewrap); the message names what is missing and the fix. A sweep refuses as a whole on
    it (it is not a property of one grid point, and skipping the points would end the sweep
    "finished" with points never run)."""


def _source(spec: str):
    """The choices named by ``module:NAME``, read when asked (``Rule.options``)."""
    module, _, name = spec.partition(":")
    return lambda: tuple(getattr(importlib.import_module(module), name))


def _positive(example: str, means: str = "") -> Rule:
    return Rule("integer", 1, means=means, example=example)


def _bool(example: str) -> Rule:
    return Rule("bool", example=example)


def _seconds(example: str) -> Rule:
    return Rule("number", 0, low_open=True, means="seconds", example=example)


LIMIT = Rule("integer", 1, nullable=True, means="null: all of the task's examples", example="30")
DTYPE = Rule("choice", options=_source("mtad.models.offline:DTYPES"), example="float32")


def checked(rule: Rule | None, default: Any = MISSING) -> Any:
    """A schema field and its rule (``default``: ``???``, the value comes from the YAML)."""
    return field(default=default, metadata={"rule": rule})


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
    gamma: Any = checked(GAMMA.rule, GAMMA.default)  # Any, not int: room for 'auto'
    tau: float = checked(TAU.rule, TAU.default)
    width: Any = checked(WIDTH.rule, WIDTH.default)  # Any, not int: room for 'auto'
    temperature: float = checked(Rule("number", 0, high_open=True, means="0 = greedy", example="1.0"), 1.0)
    top_k: int = checked(Rule("integer", 0, MAX_TOP_K, means="0 = disabled", example="10"), 10)
    top_p: float = checked(Rule("number", 0, 1, low_open=True, hint="use top_p=1.0 to disable"), 0.9)
    max_new_tokens: int = checked(Rule("integer", 1, MAX_NEW_TOKENS, example="128"), 128)
    limit: Optional[int] = checked(LIMIT, None)  # noqa: UP045 (OmegaConf reads typing.Optional)
    warmup: int = checked(Rule("integer", 0, means="untimed generations before the run", example="1"), 1)
    resume: bool = True
    wait_lock: bool = False
    perplexity: bool = True
    output_dir: Optional[str] = None  # noqa: UP045
    sweep: Any = None  # a sweep file's block (name, root, profiles, estimate)


TOP_LEVEL_KEYS = tuple(f.name for f in dataclasses.fields(MtadConfig))

# ----------------------------------------------------------------------------- decoders

@dataclass
class DecoderSchema:
    """What every decoder takes: its class and an optional display name (``bild_sampling``)."""

    _target_: str = MISSING
    name: Optional[str] = None  # noqa: UP045


def _plain(decoder: Any) -> dict:
    from omegaconf import OmegaConf

    if OmegaConf.is_config(decoder):
        return OmegaConf.to_container(decoder, resolve=False)
    return dict(decoder or {})


def decoder_class(decoder: Any) -> type:
    """The class a decoder node (or ``_target_``) names; ConfigError when it is not a decoder."""
    from hydra.utils import get_class

    target = decoder if isinstance(decoder, str) else str(_plain(decoder).get("_target_"))
    try:
        cls = get_class(target)
    except Exception:
        cls = None
    if not callable(getattr(cls, "fields", None)):
        raise ConfigError(f"decoder class {target} has no schema: it is not an importable "
                          "mtad.core.decoder.Decoder subclass (a decoder's fields are its knobs)")
    return cls


def decoder_fields(decoder: Any) -> dict[str, Knob]:
    """The fields a decoder node may set, declared by its class and pieces (``mtad.core.knobs``;
    a ``Speculative`` node: by the proposer and verifier it names)."""
    node = _plain(decoder)
    try:
        return decoder_class(node).fields(node)
    except KnobError as e:
        raise ConfigError(f"decoder.{e}") from None


_SCHEMAS: dict[tuple, type] = {}


def decoder_schema(decoder: Any) -> type:
    """The schema of a decoder node, derived from its class's declarations (``decoder_fields``)
    and stored in Hydra's ConfigStore as ``schema/decoder/<name>``: a dataclass whose fields
    carry their ``rule`` (and ``knob``: the top-level knob a shared field interpolates)."""
    node = _plain(decoder)
    cls, fields = decoder_class(node), decoder_fields(node)
    key = (node.get("_target_"), tuple(fields.items()))
    if key not in _SCHEMAS:
        specs = [("_target_", str, field(default=node.get("_target_")))]
        for n, k in fields.items():
            default = f"${{{n}}}" if k.shared else MISSING
            specs.append((n, Any, field(default=default, metadata={"rule": k.rule, "knob": n if k.shared else None})))
        pieces = [str(node[p]) for p in ("proposer", "verifier") if p in fields]
        name = "_".join([cls.name, *pieces])
        schema = dataclasses.make_dataclass(f"{cls.__name__}Schema", specs, bases=(DecoderSchema,))
        ConfigStore.instance().store(group="schema/decoder", name=name, node=schema)
        _SCHEMAS[key] = schema
    return _SCHEMAS[key]


def decoder_problem(decoder: Any, resolved: Any = None) -> str | None:
    """The first thing wrong with a decoder node, in one line, or None: a key its class does not
    take, a value out of its field's rule, a proposer the verifier does not fit (the class's
    ``settings``: everything its constructor checks, without building anything). ``resolved``:
    the node with the top-level knobs it interpolates resolved (values are checked on it)."""
    node = _plain(decoder)
    cls = decoder_class(node)
    try:
        cls.settings(node if resolved is None else _plain(resolved))
    except KnobError as e:
        name = node.get("name") or getattr(cls, "name", "decoder")
        if e.rule is not None:
            return field_message(f"decoder.{e.field}", e.value, e.rule)
        if e.unknown:
            return f"unknown key 'decoder.{e.field}'{e.detail}"
        return f"decoder={name}: {e}"
    return None


def sampling_problem(cfg: Any) -> str | None:
    """The run's sampling settings (``temperature``, ``top_k``, ``top_p``) where its decoder's
    pieces do not support them (their ``sampling`` declarations, ``mtad.core.knobs.Sampling``),
    in one line naming who refuses and the fix; None when they do."""
    node = _plain(cfg.get("decoder"))
    settings = {k: _value(cfg, k) for k in ("temperature", "top_k", "top_p")}
    if any(v is _ABSENT for v in settings.values()):
        return None
    try:
        problem = unsupported(decoder_class(node).samplings(node), settings["temperature"], settings["top_k"],
                              settings["top_p"])
    except KeyError:  # an unregistered piece: decoder_problem names it
        return None
    return f"decoder={_name(node)}: {problem}" if problem else None


@functools.cache
def _all_decoder_knobs() -> tuple[Knob, ...]:
    """Every knob a decoder of conf/decoder/ or a registered piece declares."""
    from omegaconf import OmegaConf

    from mtad.decoders.compose import PROPOSERS, VERIFIERS

    out = [k for reg in (PROPOSERS, VERIFIERS) for p in reg.values() for k in p.knobs]
    for path in sorted((CONF_DIR / "decoder").glob("*.yaml")):
        try:
            out += decoder_fields(OmegaConf.to_container(OmegaConf.load(path), resolve=False)).values()
        except ConfigError:
            continue  # validate reports it when that decoder is chosen
    return tuple(out)


def decoder_field_names() -> set[str]:
    """The names of every field a decoder of conf/decoder/ or a registered piece declares."""
    return {k.name for k in _all_decoder_knobs()}


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
    isolation: Any = checked(Rule("choice", options=_source("eval.sandbox:ISOLATIONS"), example="rlimits"), None)
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


def _rule_in(schema: type | None, parts: list[str]) -> Rule | None:
    for part in parts[:-1]:
        f = _fields(schema).get(part)
        schema = f.metadata.get("schema") if f else None
        if schema is None:
            return None
    f = _fields(schema).get(parts[-1])
    return f.metadata.get("rule") if f else None


def rule_for(path: str, decoder: Any = None) -> Rule | None:
    """The rule of the dotted field ``path`` (``decoder.*``: of ``decoder``'s field, else the rule
    every decoder and piece declaring the field agrees on, with ``auto`` where one takes it: the
    composed decoder's own is checked later); None when there is none."""
    head, _, rest = path.partition(".")
    if not rest:
        return _rule_in(MtadConfig, [head])
    if head == "decoder":
        if decoder is not None:
            k = decoder_fields(decoder).get(rest)
            return k.rule if k is not None else None
        knobs = [k for k in _all_decoder_knobs() if k.name == rest]
        if len({k.without_auto().rule for k in knobs}) != 1:
            return None  # declared differently: the decoder decides
        return next((k.rule for k in knobs if k.auto), knobs[0].rule)  # with auto where any takes it
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


def _raw(cfg: Any, name: str) -> Any:
    """The dotted field ``name`` as the config writes it (an interpolation unresolved)."""
    from omegaconf import OmegaConf

    head, _, leaf = name.rpartition(".")
    try:
        parent = OmegaConf.select(cfg, head) if head else cfg
        if OmegaConf.is_config(parent):
            return OmegaConf.to_container(parent, resolve=False).get(leaf, _ABSENT)
    except Exception:
        pass
    return _ABSENT


def _check(cfg: Any, schema: type, prefix: str) -> None:
    """Every field of ``schema`` with a rule (sub-schemas included) that ``cfg`` has. A message
    shows a value given as an interpolation as written, never resolved (it may read a secret)."""
    for f in dataclasses.fields(schema):
        path = f"{prefix}{f.name}"
        if "schema" in f.metadata:
            if isinstance(_value(cfg, path), Mapping):
                _check(cfg, f.metadata["schema"], f"{path}.")
            continue
        rule = f.metadata.get("rule")
        value = _value(cfg, path) if rule else _ABSENT
        if value is not _ABSENT and not rule.ok(value):
            raw = _raw(cfg, path)
            shown = raw if isinstance(raw, str) and "${" in raw else value
            raise ConfigError(field_message(path, shown, rule))


#: Task fields that name a folder or a file on this machine (checked before any run folder is made).
TASK_PATHS = {"data_dir": "folder", "problem_file": "file", "path": "file"}


def check_paths(cfg: Any) -> None:
    """Each path a task field names (``TASK_PATHS``) exists and is what it must be (a folder, a
    regular file); ConfigError naming the field otherwise. Relative paths as the task reads them
    (``mtad.tasks.common.data_root`` for ``data_dir``)."""
    for name, kind in TASK_PATHS.items():
        value = _value(cfg, f"task.{name}")
        if value is _ABSENT or value is None:
            continue
        if not isinstance(value, str) or not value or "\x00" in value:
            raise ConfigError(f"task.{name} must be a path, got {value!r}")
        path = Path(value).expanduser()
        if kind == "folder":
            from mtad.tasks.common import project_root

            root = project_root()
            if not path.is_absolute() and root is not None and (root / path).exists():
                path = root / path
            ok = path.is_dir()
        else:
            ok = path.is_file()
        if not ok:
            what = "no such folder" if not path.exists() else f"not a {'folder' if kind == 'folder' else 'regular file'}"
            raise ConfigError(f"task.{name}={value}: {what}; give an existing {kind} "
                              f"(e.g. task.{name}=null for the project's own data)")


def validate(cfg: Any) -> None:
    """Check a composed config against the schemas: the top-level fields, the decoder's (its
    class's ``settings``: an unknown field, a value out of range, a proposer that does not fit
    its verifier; sampling settings its pieces do not support), the task's and the model's;
    ConfigError names the first bad one."""
    _check(cfg, MtadConfig, "")
    decoder = cfg.get("decoder")
    if decoder is not None:
        resolved = _value(cfg, "decoder")
        problem = decoder_problem(decoder, None if resolved is _ABSENT else resolved) or sampling_problem(cfg)
        if problem:
            raise ConfigError(problem)
    for section, schema in (("task", TaskChecks), ("model", ModelChecks)):
        if cfg.get(section) is not None:
            _check(cfg, schema, f"{section}.")
    if cfg.get("task") is not None:
        check_paths(cfg)


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
    """The top-level knobs a decoder uses: its shared fields (``gamma: ${gamma}``)."""
    fields = decoder_fields(decoder)
    return [k for k in KNOBS if k in fields and fields[k].shared]


def _name(decoder: Any) -> str:
    return decoder.get("name") or str(decoder.get("_target_", "?")).rsplit(".", 1)[-1].lower()


def check_knobs(cfg: Any, explicit: Iterable[str]) -> None:
    """Refuse a knob set explicitly for a decoder that does not use it."""
    decoder = cfg.decoder
    uses = decoder_knobs(decoder)
    own = [str(k) for k in decoder.keys() if k not in ("_target_", "name", "proposer", "verifier") and k not in uses]
    name = _name(decoder)
    for knob_name in KNOBS:
        if knob_name in explicit and knob_name not in uses:
            fields_text = ", ".join([*uses, *own])
            raise ConfigError(
                (f"{name} uses {fields_text}, not {knob_name}" if fields_text else f"{name} has no knobs")
                + f": drop {knob_name}=... for decoder={name}"
                + (f" (its own settings are decoder.{own[0]}=...)" if own else "")
            )


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
    value = _match(r"Value '([^']*)'", text)
    missing = _match(r"Key '([^']+)' is not in struct", text) or _match(r"Key '([^']+)' not in", text)
    if rule is not None and value is not None:
        return field_message(full_key, value, rule)
    if rule is not None and missing:  # a checked field its YAML does not write: Hydra adds it with '+'
        return f"{full_key}: the composed config does not write {missing}; add it with a '+': +{full_key}=..."
    if missing and cfg_keys is not None:
        parent = full_key.rsplit(".", 1)[0] if full_key and "." in full_key else ""
        return f"unknown key {full_key or missing!r}{did_you_mean(missing, cfg_keys.get(parent, ()))}"
    first = str(exc).strip().splitlines()
    return first[0] if first else type(exc).__name__


def _match(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text)
    return m.group(1) if m else None

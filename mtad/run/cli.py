"""Command-line checks before Hydra runs anything, on Hydra's own override parser and sweeper.

``check_overrides`` parses the command line with Hydra's ``OverridesParser`` and expands it
into jobs with Hydra's basic sweeper (``expand``: sweep syntax such as ``decoder=spd,mtad``,
``choice(...)``, ``range(...)``, ``glob(...)`` and quoted commas gives Hydra's own jobs). Then,
before the first job runs: unknown config names and keys get a "did you mean", a top-level
``+key=`` add is refused (only ``+experiment=`` adds), every value given for a checked field is
checked against its rule (every value of a sweep), and every job is composed once and checked
against the schemas (``mtad.run.config``: its values, nested ones included, and its knobs: a
knob the decoder does not use is refused). Hydra's composition errors are reworded in one
line, not bypassed."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from mtad.run.config import (
    CONF_DIR,
    GROUPS,
    KNOBS,
    TOP_LEVEL_KEYS,
    ConfigError,
    check_knobs,
    check_scorer,
    decoder_field_names,
    decoder_fields,
    decoder_problem,
    describe_error,
    did_you_mean,
    explicit_keys,
    field_message,
    rule_for,
    validate,
)

#: Hydra flags after which the command line is Hydra's business only (help, info, other configs).
_HYDRA_ONLY = ("-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "--cfg",
               "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--shell-completion", "-sc",
               "--experimental-rerun")


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


class _GroupOptions:
    """What Hydra's override parser asks a config loader for ``glob()``: a group's options."""

    def __init__(self, conf_dir: Path):
        self.conf_dir = conf_dir

    def get_group_options(self, group: str, *args, **kwargs) -> list[str]:
        if group.split("@", 1)[0] not in GROUPS:
            raise ConfigError(f"glob() selects config names; {group} is not a config group")
        return group_options(group.split("@", 1)[0], self.conf_dir)


def parse(overrides: Sequence, conf_dir: Path = CONF_DIR) -> list:
    """Hydra ``Override`` objects (given ones are kept); ConfigError with Hydra's parse message."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    if all(not isinstance(o, str) for o in overrides):
        return list(overrides)
    try:
        return OverridesParser.create(_GroupOptions(conf_dir)).parse_overrides(list(overrides))
    except OverrideParseException as e:
        raise ConfigError(str(e).strip().splitlines()[0]) from None


def expand(overrides: Sequence, conf_dir: Path = CONF_DIR) -> list[list[str]]:
    """The jobs of ``overrides``, made by Hydra's basic sweeper (``BasicSweeper.split_arguments``:
    one value list per key, a later override of a key replacing the earlier one in its place,
    cartesian product with the first key outermost)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.errors import HydraException

    try:
        (jobs,) = BasicSweeper.split_arguments(parse(overrides, conf_dir), None)
    except HydraException as e:  # interval() etc.: only for other sweepers
        raise ConfigError(f"{e}") from None
    return [list(job) for job in jobs]


def _group(o) -> str | None:
    key = o.key_or_group.split("@", 1)[0]
    return key if key in GROUPS else None


def check_keys(overrides: Sequence, conf_dir: Path = CONF_DIR) -> None:
    """Unknown group names and top-level keys, and top-level ``+key=`` adds: ConfigError."""
    known = [*TOP_LEVEL_KEYS, *GROUPS]
    for o in parse(overrides, conf_dir):
        key = o.key_or_group
        if key.startswith("hydra"):
            continue
        group = _group(o)
        if group is not None:
            if o.is_delete() or o.value() is None:
                continue
            options = group_options(group, conf_dir)
            given = o.sweep_string_iterator() if o.is_sweep_override() else [o.get_value_element_as_str()]
            for v in given:
                if v not in options and v != "null":
                    raise ConfigError(
                        f"unknown {group} {v!r} (no conf/{group}/{v}.yaml{did_you_mean(v, options)}); "
                        f"available: {', '.join(options)}"
                    )
            continue
        top = key.split(".", 1)[0]
        if top not in known and top in decoder_field_names():
            value = o.get_value_element_as_str() if not o.is_sweep_override() else "..."
            raise ConfigError(f"unknown key {top!r}: a field of a decoder, not a top-level key; did you mean "
                              f"decoder.{key}={value}?")
        if top not in known:
            raise ConfigError(f"unknown key {top!r}{did_you_mean(top, known)} (keys: {', '.join(TOP_LEVEL_KEYS)})")
        if o.is_add() and "." not in key:
            raise ConfigError(f"{o.input_line}: {top} is already a key; set it without '+' ({top}=...)")


def check_values(overrides: Sequence, conf_dir: Path = CONF_DIR) -> None:
    """Every value given for a checked field (every value of a sweep) against its rule, before
    anything is composed; the composed jobs are checked whole by ``check_jobs``."""
    parsed = parse(overrides, conf_dir)
    for o in parsed:
        rule = None if o.is_delete() else rule_for(o.key_or_group)
        for v in (o.sweep_iterator() if o.is_sweep_override() else [o.value()]) if rule else ():
            if not rule.ok(v):
                where = _unwritten(parsed, o.key_or_group, conf_dir)
                message = field_message(o.key_or_group, v, rule)
                if where and rule.example:  # the hint adds it, as Hydra needs
                    message = (message.split("; e.g. ", 1)[0] + f"; e.g. +{o.key_or_group}={rule.example} "
                               f"({where}: add it with a '+')")
                raise ConfigError(message)


def _unwritten(parsed: Sequence, key: str, conf_dir: Path = CONF_DIR) -> str | None:
    """Where a ``decoder.<field>`` override's field is declared but not written: the chosen
    decoder's YAML (``decoder=`` among the overrides, else the config's default) lacks it, so
    Hydra takes it only with a '+'; None otherwise (another key, a written field, an unknown one)."""
    from omegaconf import OmegaConf

    leaf = key.removeprefix("decoder.")
    if leaf == key or "." in leaf:
        return None
    chosen = [o for o in parsed if o.key_or_group == "decoder" and not o.is_delete()]
    if chosen and chosen[-1].is_sweep_override():
        return None
    name = (chosen[-1].get_value_element_as_str() if chosen else
            next((d["decoder"] for d in OmegaConf.load(conf_dir / "config.yaml").defaults
                  if isinstance(d, Mapping) and "decoder" in d), None))
    path = conf_dir / "decoder" / f"{name}.yaml"
    if not name or not path.is_file():
        return None
    node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    try:
        declared = leaf in decoder_fields(node)
    except ConfigError:
        return None
    return f"conf/decoder/{name}.yaml does not write {leaf}" if declared and leaf not in node else None


def check_jobs(jobs: Sequence[Sequence[str]], files: Sequence[Path] = (), conf_dir: Path = CONF_DIR) -> list:
    """Compose every job once and check its values, knobs, scorer's preflight
    (``mtad.run.config.check_scorer``) and its task's data (loaded once per process, before
    Hydra makes any run folder); the composed configs, in order.
    ConfigError names the first bad job (when there are several)."""
    from hydra import initialize_config_dir

    from mtad.run.sweep.plan import check_task

    out = []
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        for job in jobs:
            try:
                cfg = _compose(job)
                validate(cfg)
                check_knobs(cfg, explicit_keys(job, files, conf_dir))
                check_scorer(cfg)
                available, reason, _, _ = check_task(cfg)
                if not available:
                    raise ConfigError(f"task {cfg.task.name}: {reason}")
            except ConfigError as e:
                raise ConfigError(f"{e}" + (f"  [job: {' '.join(job)}]" if len(jobs) > 1 else "")) from None
            out.append(cfg)
    return out


def _compose(job: Sequence[str]):
    """Compose ``job`` (Hydra initialized by the caller); ConfigError with a one-line reason."""
    from hydra import compose
    from omegaconf import OmegaConf

    job = [o for o in job if not o.lstrip("+~").startswith("hydra")]
    try:
        return compose("config", overrides=list(job))
    except Exception as e:
        groups_only = [o for o in job if o.lstrip("+~").split("=", 1)[0] in GROUPS]
        try:  # the keys next to the one that failed, for a "did you mean"
            base = compose("config", overrides=groups_only)
        except Exception:
            base = None
        problem = _decoder_key_problem(job, base)
        if problem:
            raise ConfigError(problem) from None
        try:
            keys = {"": list(base.keys())}
            for k in base.keys():
                node = OmegaConf.select(base, str(k), throw_on_resolution_failure=False)
                if OmegaConf.is_dict(node):
                    keys[str(k)] = list(node.keys())
        except Exception:
            keys = None
        raise ConfigError(describe_error(e, keys)) from None


def _decoder_key_problem(job: Sequence[str], base) -> str | None:
    """A ``decoder.<key>=`` override of a key the chosen decoder's YAML does not have: the
    decoder class's own message (e.g. a chain composition has no width), or None."""
    from omegaconf import OmegaConf

    if base is None or base.get("decoder") is None:
        return None
    node = OmegaConf.to_container(base.decoder, resolve=False)
    for o in job:
        key, _, value = o.lstrip("+~").partition("=")
        leaf = key[len("decoder."):]
        if not key.startswith("decoder.") or "." in leaf or leaf in node:
            continue
        if leaf not in decoder_fields(node):
            return decoder_problem({**node, leaf: value})
        if not o.startswith(("+", "~")):  # a field its YAML leaves to the default: Hydra adds it with '+'
            knob = decoder_fields(node)[leaf]
            where = _unwritten(parse(job), key) or f"the decoder's YAML does not write {leaf}"
            return (f"decoder.{leaf}: {where} (its default, {_text(knob.default)}, applies); add it with a "
                    f"'+': +decoder.{leaf}={_text(parse([o])[0].value())}")
    return None


def _text(value) -> str:
    """A value as an override writes it (``true``, ``false``, ``null``)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


def check_run_dirs(overrides: Sequence, multirun: bool) -> None:
    """A sweep without ``-m`` (Hydra would stop on it), and an output folder given on the command
    line (``hydra.run.dir``, ``hydra.sweep.dir``) that names a file or lies under one:
    ConfigError."""
    for o in overrides:
        if o.is_sweep_override() and not multirun:
            raise ConfigError(f"{o.input_line} is a sweep: add -m to run each value (python run.py -m "
                              f"{o.input_line} ...), or give one value")
        if o.key_or_group in ("hydra.run.dir", "hydra.sweep.dir") and not o.is_delete():
            path = Path(str(o.value()))
            for p in (path, *path.parents):
                if p.exists() and not p.is_dir():
                    raise ConfigError(f"{o.key_or_group}={o.value()}: {p} is a file, not a folder; "
                                      "choose a folder path")


def check_overrides(argv: Sequence[str], conf_dir: Path = CONF_DIR) -> None:
    """``run.py``'s command line: exit 2 with a one-line message when something is wrong."""
    from hydra.errors import HydraException

    if any(a.split("=", 1)[0] in _HYDRA_ONLY for a in argv):
        return
    try:
        overrides = parse([a for a in argv if not a.startswith("-")], conf_dir)
        check_keys(overrides, conf_dir)
        check_values(overrides, conf_dir)
        check_run_dirs(overrides, multirun=any(a in ("-m", "--multirun") for a in argv))
        check_jobs(expand(overrides, conf_dir), (), conf_dir)
    except (ConfigError, HydraException) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def compose_config(overrides: Sequence[str] = (), conf_dir: Path = CONF_DIR, drop: tuple[str, ...] = ()):
    """Compose ``conf/config.yaml`` outside a Hydra run (tests, notebooks, benchmarks).

    ``drop`` removes config groups from the defaults list (e.g. ``("task",)``).
    """
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        return compose("config", overrides=[f"~{g}" for g in drop] + list(overrides))


def load_decoder(name: str, **knobs):
    """Instantiate ``conf/decoder/<name>.yaml`` with top-level knobs (``gamma``, ``tau``, ``width``)
    and the decoder's own fields by name (``eps=0.2``, or ``**{"decoder.eps": 0.2}``; a field its
    YAML does not write is added). ConfigError in one line for an unknown decoder, knob or field,
    or a bad value, as on the command line; the sampling settings are not checked here (the
    engine refuses ones the decoder's pieces do not support)."""
    from hydra import initialize_config_dir
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    overrides = [f"decoder={name}"]
    path = _conf_file("decoder", name)
    node = OmegaConf.to_container(OmegaConf.load(path), resolve=False) if path else {}
    fields = decoder_fields(node) if node else {}
    for k, v in knobs.items():
        leaf = k.removeprefix("decoder.")
        if node and k not in TOP_LEVEL_KEYS and "." not in k and k not in fields and k not in ("proposer", "verifier"):
            near = did_you_mean(k, dict.fromkeys([*TOP_LEVEL_KEYS, *fields]))
            raise ConfigError(f"load_decoder({name!r}): unknown knob {k!r}{near} ({name} takes "
                              f"{', '.join(fields) or 'no fields'}; the top-level knobs: {', '.join(KNOBS)})")
        if k.startswith("decoder.") or (k not in TOP_LEVEL_KEYS and "." not in k):
            k = f"{'+' if leaf not in node else ''}decoder.{leaf}"
        overrides.append(f"{k}={v}")
    check_keys(overrides)
    check_values(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = _compose([*(f"~{g}" for g in ("task", "model", "logger")), *overrides])
    problem = decoder_problem(cfg.decoder, OmegaConf.to_container(cfg.decoder, resolve=True))
    if problem:
        raise ConfigError(problem)
    return instantiate(cfg.decoder)


def _conf_file(group: str, name: str, conf_dir: Path = CONF_DIR) -> Path | None:
    """``conf/<group>/<name>.yaml`` if it exists."""
    path = conf_dir / group / f"{name}.yaml"
    return path if path.is_file() else None

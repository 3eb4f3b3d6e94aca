"""Command-line checks before Hydra runs anything, on Hydra's own override parser.

``check_overrides`` parses the command line with ``OverridesParser`` (so sweep syntax such as
``decoder=spd,mtad``, ``choice(...)``, ``range(...)``, ``glob(...)`` and quoted commas is read
exactly as Hydra reads it), expands it into jobs as Hydra's basic sweeper does and checks them
(``mtad.run.config``): unknown config names and keys get a "did you mean", a top-level ``+key=``
add is refused (only ``+experiment=`` adds), every value of a checked field is checked against
its rule, one job per combination of config-group choices is composed and its knobs checked
(a knob the decoder does not use is refused). Hydra's own errors are reworded, not bypassed:
``hydra.main`` reports composition errors itself, so the check composes first.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from pathlib import Path

from mtad.run.config import (
    CONF_DIR,
    GROUPS,
    RULES,
    SPECIAL_VALUES,
    TOP_LEVEL_KEYS,
    ConfigError,
    check_knobs,
    describe_error,
    did_you_mean,
    explicit_keys,
    field_message,
    validate,
)

#: Hydra flags after which the command line is Hydra's business only (help, info, other configs).
_HYDRA_ONLY = ("-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "--cfg",
               "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--shell-completion", "-sc",
               "--experimental-rerun")


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def parse(overrides: Sequence[str]):
    """Hydra ``Override`` objects; raises ConfigError with Hydra's parse message."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as e:
        raise ConfigError(str(e).strip().splitlines()[0]) from None


def _group(o) -> str | None:
    key = o.key_or_group.split("@", 1)[0]
    return key if key in GROUPS else None


def values(o, conf_dir: Path = CONF_DIR) -> list[str]:
    """The values of one override as strings (a sweep gives several; a glob reads conf/<group>)."""
    from hydra.core.override_parser.types import Glob

    if not o.is_sweep_override():
        return [o.get_value_element_as_str()]
    if isinstance(o.value(), Glob):
        group = _group(o)
        if group is None:
            raise ConfigError(f"{o.input_line}: glob() selects config names; {o.key_or_group} is not a config group")
        return o.value().filter(group_options(group, conf_dir))
    try:
        return list(o.sweep_string_iterator())
    except Exception as e:  # interval() etc.: only for other sweepers
        raise ConfigError(f"{o.input_line}: not a list of values ({e})") from None


def expand(overrides: Sequence[str], conf_dir: Path = CONF_DIR) -> list[list[str]]:
    """Jobs of ``overrides`` as Hydra's basic sweeper makes them: one value list per key (a
    later override of a key replaces the earlier one in its place), cartesian product with
    the first key outermost."""
    lists: dict[str, list[str]] = {}
    for o in parse(overrides):
        key = o.get_key_element()
        lists[key] = [f"{key}={v}" for v in values(o, conf_dir)]
    return [list(job) for job in itertools.product(*lists.values())] or [[]]


def check_keys(overrides: Sequence[str], conf_dir: Path = CONF_DIR) -> None:
    """Unknown group names and top-level keys, and top-level ``+key=`` adds: ConfigError."""
    known = [*TOP_LEVEL_KEYS, *GROUPS]
    for o in parse(overrides):
        key = o.key_or_group
        if key.startswith("hydra"):
            continue
        group = _group(o)
        if group is not None:
            if o.is_delete() or o.value() is None:
                continue
            options = group_options(group, conf_dir)
            for v in values(o, conf_dir):
                if v not in options and v != "null":
                    raise ConfigError(
                        f"unknown {group} {v!r} (no conf/{group}/{v}.yaml{did_you_mean(v, options)}); "
                        f"available: {', '.join(options)}"
                    )
            continue
        top = key.split(".", 1)[0]
        if top not in known:
            raise ConfigError(f"unknown key {top!r}{did_you_mean(top, known)} (keys: {', '.join(TOP_LEVEL_KEYS)})")
        if o.is_add() and "." not in key:
            raise ConfigError(f"{o.input_line}: {top} is already a key; set it without '+' ({top}=...)")


def check_values(overrides: Sequence[str]) -> None:
    """Every value given for a checked field (all values of a sweep) against its rule."""
    for o in parse(overrides):
        if o.key_or_group not in RULES or o.is_delete():
            continue
        given = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
        for v in given:
            if v not in SPECIAL_VALUES.get(o.key_or_group, ()) and not RULES[o.key_or_group].ok(v):
                raise ConfigError(field_message(o.key_or_group, v))


def check_jobs(jobs: Sequence[Sequence[str]], files: Sequence[Path] = (), conf_dir: Path = CONF_DIR) -> None:
    """Compose one job per combination of config-group choices (the values themselves are
    checked by ``check_values``) and check its values and knobs."""
    from hydra import initialize_config_dir

    combos: dict[tuple[str, ...], Sequence[str]] = {}
    for job in jobs:
        combos.setdefault(tuple(o for o in job if o.lstrip("+~").split("=", 1)[0] in GROUPS), job)
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        for job in combos.values():
            try:
                cfg = _compose(job)
                validate(cfg)
                check_knobs(cfg, explicit_keys(job, files, conf_dir))
            except ConfigError as e:
                raise ConfigError(f"{e}" + (f"  [job: {' '.join(job)}]" if len(jobs) > 1 else "")) from None


def _compose(job: Sequence[str]):
    """Compose ``job`` (Hydra initialized by the caller); ConfigError with a one-line reason."""
    from hydra import compose
    from omegaconf import OmegaConf

    job = [o for o in job if not o.lstrip("+~").startswith("hydra")]
    try:
        return compose("config", overrides=list(job))
    except Exception as e:
        groups_only = [o for o in job if o.lstrip("+~").split("=", 1)[0] in GROUPS]
        try:
            base = compose("config", overrides=groups_only)
            keys = {"": list(base.keys())}
            for k in base.keys():
                node = OmegaConf.select(base, str(k), throw_on_resolution_failure=False)
                if OmegaConf.is_dict(node):
                    keys[str(k)] = list(node.keys())
        except Exception:
            keys = None
        raise ConfigError(describe_error(e, keys)) from None


def check_overrides(argv: Sequence[str], conf_dir: Path = CONF_DIR) -> None:
    """``run.py``'s command line: exit 2 with a one-line message when something is wrong."""
    if any(a.split("=", 1)[0] in _HYDRA_ONLY for a in argv):
        return
    overrides = [a for a in argv if not a.startswith("-")]
    try:
        check_keys(overrides, conf_dir)
        check_values(overrides)
        check_jobs(expand(overrides, conf_dir), (), conf_dir)
    except ConfigError as e:
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
    """Instantiate ``conf/decoder/<name>.yaml`` with top-level knobs (gamma, tau, width, ...)."""
    from hydra.utils import instantiate

    cfg = compose_config([f"decoder={name}"] + [f"{k}={v}" for k, v in knobs.items()],
                         drop=("task", "model", "logger"))
    return instantiate(cfg.decoder)

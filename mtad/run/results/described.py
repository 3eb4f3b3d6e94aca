"""A results folder as a description of what was run: the one loader every reader goes through.

A stored config (``summary.json``'s ``config``, ``config.json``, a legacy ``point.json``'s
``identity``) describes what was run; it is never a source of settings for the machine that
reads it (docs/trust.md). ``describe(path)`` turns a folder into a ``Described``: the point's
config-group names (decoder, task, model pair), the values that made its tokens (decoder
knobs, the task's data identity, sampling, seed, ``max_new_tokens``), its scorer's name and
version, and the host settings it stored (sandbox, limits, judge endpoint and key variable,
data and problem files), kept only to be reported. Nothing in the folder is imported,
instantiated, interpolated or resolved: a stored string holding ``${`` is refused, every
``_target_`` is checked against the project's places (``mtad.run.results.targets``), and the
folder's own values are plain JSON data from here on.

``rebuild(described, overrides)`` makes the config a reader runs: the named members of
``conf/`` (the project's registry of decoders, tasks, pairs and scorers) composed with the
reader's own overrides, then the described values that change the tokens (checked by
``mtad.run.config.validate``). Host settings come only from ``conf/`` and the reader's
overrides; a stored value that differs is reported in one line (``Rebuilt.report``) and the
reader's value runs. A field ``conf/`` does not know is reported and ignored.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtad.core.io import read_json
from mtad.run.results.folder import CONFIG_FILE, POINT_FILE, SUMMARY_FILE, read_summary
from mtad.run.results.identity import SAMPLING, identity, identity_hash
from mtad.run.results.targets import UntrustedConfig, data_only, trusted_config

log = logging.getLogger(__name__)

#: Task fields that touch the host (files read, network, the scorer's sandbox and limits):
#: taken from the reader's invocation or ``conf/``, never from a folder.
HOST_TASK_FIELDS = ("data_dir", "problem_file", "path", "question_file", "download", "use_hub",
                    "hub_timeout_s", "judge", "scorer")
#: Model-pair fields a folder describes (they change the tokens and are checked by
#: ``mtad.run.config.ModelChecks`` or name a kernel); every other pair field (weights' ids,
#: devices, memory, threads) comes from ``conf/model/<name>.yaml``.
PAIR_KNOBS = ("eos_token_ids", "dtype", "attn_implementation", "arch", "vocab_size", "hidden_size",
              "num_layers", "draft_hidden_size", "draft_num_layers", "logit_scale",
              "target.dtype", "target.kernel", "target.attn_implementation",
              "draft.dtype", "draft.kernel", "draft.attn_implementation")
#: Top-level values a folder describes (``limit``: how many examples it asked for).
TOP_KNOBS = ("seed", *SAMPLING, "max_new_tokens", "limit", "gamma", "tau", "width")
_NAME = re.compile(r"[A-Za-z0-9_]{1,100}")
_WORD = re.compile(r"[A-Za-z0-9_.\-]{1,100}")
GROUPS = ("decoder", "task", "model")


def _conf_dir() -> Path:
    from mtad.run.config import CONF_DIR

    return CONF_DIR


@functools.cache
def registry(group: str) -> dict[str, dict]:
    """The members of a config group as ``conf/<group>/*.yaml`` writes them (unresolved)."""
    from omegaconf import OmegaConf

    out = {}
    for path in sorted((_conf_dir() / group).glob("*.yaml")):
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        if isinstance(node, dict):
            out[path.stem] = node
    return out


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, Mapping) or not node:
        return {prefix: node} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _get(node: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


_ABSENT = object()


def _shown(value: Any) -> str:
    return json.dumps(value, default=str)[:60]


@dataclass(frozen=True)
class Described:
    """What a folder says was run (plain data); see the module docstring."""

    where: Path
    config: dict  # the stored config as data (moved class paths migrated, targets checked)
    choices: dict[str, str]  # config-group names (point.json, else found from the config)
    identity_hash: str | None  # what point.json says (None: none, or a legacy folder)
    decoder: str | None
    decoder_knobs: dict[str, Any]
    task: str | None
    task_fields: dict[str, Any]  # the task's data identity (name, limit, prompt settings, stop)
    data_source: str | None
    scorer: str | None
    scorer_version: str | None
    pair: str | None
    pair_knobs: dict[str, Any]
    sampling: dict[str, Any]
    seed: Any
    max_new_tokens: Any
    limit: Any
    host: dict[str, Any] = field(default_factory=dict)  # dotted -> stored host setting (reported only)

    def knobs(self) -> dict[str, Any]:
        """Dotted config key -> described value, for every value that changes the tokens."""
        out = {k: self.config[k] for k in TOP_KNOBS if k in self.config}
        out.update({f"decoder.{k}": v for k, v in self.decoder_knobs.items()})
        out.update({f"task.{k}": v for k, v in self.task_fields.items()})
        out.update({f"model.{k}": v for k, v in self.pair_knobs.items()})
        return out


def stored_config(path: Path, point: Mapping | None = None, summary: Mapping | None = None) -> dict:
    """The folder's stored config (summary, else ``config.json``, else a legacy ``point.json``'s
    identity) as checked data: {} when it has none."""
    point = point if point is not None else (read_json(path / POINT_FILE) or {})
    summary = summary if summary is not None else (read_summary(path / SUMMARY_FILE) or {})
    legacy = point.get("identity") if not point.get("format") else None
    config = summary.get("config") or read_json(path / CONFIG_FILE) or legacy or {}
    if not isinstance(config, dict):
        raise UntrustedConfig(f"{path}: stored config is not a mapping; refusing to load it")
    data_only(config, path)
    return trusted_config(config, path)  # moved class paths migrated; code outside the project refused


def _choice(group: str, stored: Any, node: Mapping | None) -> str | None:
    """The ``conf/<group>`` member a folder names: its stored choice when that member builds the
    class its stored config ran (``_target_``), else the member found from the stored config
    (by name and class); None when none fits (the folder cannot be rebuilt)."""
    members = registry(group)
    target = node.get("_target_") if isinstance(node, Mapping) else None
    if isinstance(stored, str) and _NAME.fullmatch(stored) and stored in members:
        if target is None or _member_target(group, stored) in (None, target):
            return stored
    if not isinstance(node, Mapping):
        return None
    if group == "decoder":
        return decoder_choice(node)
    name = node.get("name")
    if isinstance(name, str) and _NAME.fullmatch(name) and name in members \
            and _member_target(group, name) in (None, target):
        return name
    return None


def _member_target(group: str, name: str) -> str | None:
    """The class a ``conf/<group>`` member builds (its defaults list followed), None if unknown."""
    member = registry(group).get(name) or {}
    if member.get("_target_"):
        return member["_target_"]
    for parent in member.get("defaults") or ():
        if isinstance(parent, str) and parent in registry(group):
            return _member_target(group, parent)
    return None


def decoder_choice(node: Mapping) -> str | None:
    """The ``conf/decoder`` member whose class and literal fields (``name``, ``proposer``, ...)
    best match a stored decoder node; None when no member has its class."""
    best, score = None, -1
    for stem, member in registry("decoder").items():
        if member.get("_target_") != node.get("_target_"):
            continue
        literal = {k: v for k, v in member.items() if k != "_target_" and not (isinstance(v, str) and "${" in v)}
        if any(k in literal and node.get(k) != literal[k] for k in ("name", "proposer", "verifier")):
            continue
        if "name" in node and node.get("name") != member.get("name"):
            continue
        matched = sum(node.get(k) == v for k, v in literal.items())
        if matched > score:
            best, score = stem, matched
    return best


def describe(path: str | Path) -> Described:
    """The folder at ``path`` as a description (see the module docstring); UntrustedConfig in one
    line when its stored config is more than data."""
    path = Path(path)
    point = read_json(path / POINT_FILE) or {}
    summary = read_summary(path / SUMMARY_FILE) or {}
    config = stored_config(path, point, summary)
    raw_choices = point.get("choices") if isinstance(point.get("choices"), dict) else {}
    data_only(raw_choices, path, "choices")
    # stored names are labels only (escaped where shown); a lookup in conf/ (_choice) takes a
    # member's own name and nothing else
    choices = {g: v for g, v in raw_choices.items() if isinstance(g, str) and isinstance(v, str) and len(v) <= 1000}
    decoder = config.get("decoder") if isinstance(config.get("decoder"), dict) else {}
    task = config.get("task") if isinstance(config.get("task"), dict) else {}
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    scorer = task.get("scorer") if isinstance(task.get("scorer"), dict) else None
    score = summary.get("score") if isinstance(summary.get("score"), dict) else {}
    host = {f"task.{k}": v for k, v in _flat({k: task[k] for k in HOST_TASK_FIELDS if k in task}).items()}
    flat_model = _flat(model)
    host.update({f"model.{k}": v for k, v in flat_model.items()
                 if k not in PAIR_KNOBS and k not in ("_target_", "name")})
    return Described(
        where=path,
        config=config,
        choices=choices,
        identity_hash=point.get("identity_hash") if point.get("format") else None,
        decoder=_choice("decoder", choices.get("decoder"), decoder),
        decoder_knobs={k: v for k, v in decoder.items() if k != "_target_"},
        task=_choice("task", choices.get("task"), task),
        task_fields={k: v for k, v in task.items() if k not in HOST_TASK_FIELDS and k != "_target_"},
        data_source=summary.get("data_source") if isinstance(summary.get("data_source"), str) else None,
        scorer=str(score.get("metric") or (scorer or {}).get("_target_") or "") or None,
        scorer_version=str(score["version"]) if score.get("version") is not None else None,
        pair=_choice("model", model.get("name") or choices.get("model"), model),
        pair_knobs={k: v for k, v in flat_model.items() if k in PAIR_KNOBS},
        sampling={k: config.get(k) for k in SAMPLING},
        seed=config.get("seed"),
        max_new_tokens=config.get("max_new_tokens"),
        limit=config.get("limit"),
        host=host,
    )


@dataclass
class Rebuilt:
    """The config a reader runs for a described point, and what it did not take from the folder."""

    cfg: Any  # DictConfig
    ignored: list[str] = field(default_factory=list)  # "key: stored X, running Y" / "key: unknown"
    identity_differs: bool = False  # the rebuilt point is not the stored one (host or knob differs)

    def report(self, where: Any) -> str | None:
        """The one line a reader logs when the folder stored settings it did not use."""
        if not self.ignored:
            return None
        shown = "; ".join(self.ignored[:6]) + (f"; and {len(self.ignored) - 6} more" if len(self.ignored) > 6 else "")
        return (f"{where}: stored settings not used here (this invocation's and the project's "
                f"defaults run; docs/trust.md): {shown}")


@functools.lru_cache(maxsize=64)
def _composed(overrides: tuple[str, ...], drop: tuple[str, ...]):
    from mtad.run.cli import compose_config

    return compose_config(list(overrides), drop=drop)


def rebuild(d: Described, overrides: Sequence[str] = (), sections: Sequence[str] = GROUPS) -> Rebuilt:
    """The config a reader runs for ``d``: ``conf/`` members by name, the reader's ``overrides``,
    then the described knobs of ``sections`` (see the module docstring). UntrustedConfig (one
    line) when the folder names no member of ``conf/`` for a section; ConfigError when a
    described value is refused by the checks."""
    from omegaconf import OmegaConf

    from mtad.run.config import ConfigError, describe_error, validate

    names = {"decoder": d.decoder, "task": d.task, "model": d.pair}
    missing = [g for g in sections if not names[g]]
    if missing:
        shown = ", ".join(f"{g} {_shown((d.config.get(g) or {}).get('_target_') if isinstance(d.config.get(g), dict) else None)}"
                          for g in missing)
        raise UntrustedConfig(f"{d.where}: stored config names no member of {', '.join(f'conf/{g}/' for g in missing)} "
                              f"({shown}); refusing to rebuild it (only the project's own configs are built)")
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    drop = tuple(g for g in GROUPS if g not in sections)
    try:
        cfg = _composed((*(f"{g}={names[g]}" for g in sections), "logger=none", *overrides), drop).copy()
    except Exception as e:  # the reader's own override: Hydra's message in one line
        raise ConfigError(describe_error(e)) from None
    OmegaConf.set_struct(cfg, False)
    out = Rebuilt(cfg)
    for key, value in d.knobs().items():
        section = key.split(".", 1)[0] if "." in key else None
        if section is not None and section not in sections:
            continue
        if section is None and "decoder" not in sections and key not in ("limit",):
            continue
        if key in given or any(key.startswith(g + ".") for g in given):
            continue
        if section is not None and _get(OmegaConf.to_container(cfg[section], resolve=False), key.split(".", 1)[1]) is _ABSENT:
            out.ignored.append(f"{key}: not a field of conf/{section}/{names[section]}.yaml, ignored")
            continue
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    try:
        validate(cfg)
    except ConfigError as e:
        raise ConfigError(f"{d.where}: stored {e}") from None
    out.ignored += host_differences(d, cfg, sections)
    if set(sections) == set(GROUPS) and d.identity_hash is not None:
        try:
            out.identity_differs = identity_hash(identity(cfg)) != d.identity_hash
        except (KeyError, TypeError, ValueError):
            out.identity_differs = True
    return out


def host_differences(d: Described, cfg: Any, sections: Sequence[str] = GROUPS) -> list[str]:
    """``key: stored X, running Y`` for each host setting the folder stored that ``cfg`` (the
    config this invocation runs) does not have."""
    from omegaconf import OmegaConf

    out = []
    resolved = {g: OmegaConf.to_container(cfg[g], resolve=True) if cfg.get(g) is not None else {}
                for g in sections}
    for key, stored in sorted(d.host.items()):
        section, rest = key.split(".", 1)
        if section not in sections:
            continue
        running = _get(resolved[section], rest)
        if running is _ABSENT or stored != running:
            now = "(not set)" if running is _ABSENT else _shown(running)
            out.append(f"{key}: stored {_shown(stored)}, running {now}")
    return out


def report_resume(path: Any, cfg: Any) -> None:
    """One line when a folder being resumed stored host settings other than the run's own (the
    run's are what run), or a stored config that is not data (it is replaced by the run's)."""
    from mtad.core.io import BadResultsFile

    try:
        d = describe(path)
    except (UntrustedConfig, BadResultsFile) as e:
        log.warning("%s; the run writes its own config", e)
        return
    line = Rebuilt(cfg, host_differences(d, cfg)).report(path)
    if line:
        log.warning("%s", line)


def report(rebuilt: Rebuilt, where: Any) -> None:
    """Log ``rebuilt``'s one line (when the folder stored settings that do not run)."""
    line = rebuilt.report(where)
    if line:
        log.warning("%s", line)


def recorded_threads(summary: Any, where: Any = None) -> int | None:
    """The thread count to regenerate a folder's records with: the ``torch_threads`` its summary
    recorded (a bfloat16 matmul's reduction order may depend on it), as a hint and never more
    than this machine's CPUs (a stored number decides no host resource beyond that; one line
    when it is cut); None when nothing usable was recorded (the reader's own count runs)."""
    import os

    prov = summary.get("provenance") if isinstance(summary, dict) else None
    n = prov.get("torch_threads") if isinstance(prov, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return None
    cpus = os.cpu_count() or 1
    if n > cpus:
        log.warning("%s: the records were made with %d threads; this machine has %d CPUs, so %d run",
                    where if where is not None else "folder", n, cpus, cpus)
        return cpus
    return n

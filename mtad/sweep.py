"""Sweeps that resume: a grid of (model pair, task, decoder, knobs) points, each computed once.

A sweep file (``experiments/*.yaml``) is a Hydra primary config: ``defaults: [config, ...]``
pulls in ``conf/config.yaml``, the file sets the fixed knobs, a ``sweep:`` block (``name``,
``root``, optional ``profiles``) and the grid in ``hydra.sweeper.params`` (Hydra's sweep
syntax: ``a,b,c``, ``range(2,9)``, ``choice(...)``). The grid is expanded exactly as Hydra's
basic sweeper expands it (first key outermost), so the same file runs three ways:

- ``python -m mtad.sweep experiments/table2_cpu.yaml [--dry-run] [key=value ...]``:
  here, point after point, with a progress bar over points;
- ``python -m mtad.sweep experiments/table2.yaml --launcher mtad_slurm``: one Hydra
  multirun per model pair through a launcher in ``conf/hydra/launcher/`` (one Slurm job
  per point, GPUs per job from the pair's ``gpus`` field);
- ``python -m mtad.sweep hydra -m -cd experiments -cn table2_smoke``: a plain Hydra
  multirun whose jobs are sweep points (what the launcher path runs).

Identity: a point is the SHA-256 of its resolved config without the keys in
``NON_IDENTITY_KEYS`` (output paths, tracking, the ``sweep`` block). Its results go to
``<root>/<name>/<hash>/``: ``point.json`` (overrides, identity), then evaluate's
``config.json``, ``samples.jsonl`` and ``summary.json``; or ``skipped.json`` (task data
unavailable, model cannot be loaded) or ``error.json`` (anything else, with traceback).
A point whose ``summary.json`` carries a config with the same hash is never recomputed; an
interrupted point resumes at the (example, turn) level (``mtad.evaluate.run`` does that in
the same folder). ``<root>/<name>/sweep.json`` lists the points of the current definition
(``mtad.render`` shows only those).

This module knows nothing about decoders or metrics (``mtad.evaluate`` runs a point) nor
about tables (``mtad.render``).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mtad.cli import CONF_DIR, group_options
from mtad.records import read_jsonl, write_json_atomic

log = logging.getLogger(__name__)

#: Top-level config keys that do not change a point's results (and so not its identity).
NON_IDENTITY_KEYS = ("output_dir", "logger", "resume", "sweep", "hydra")
#: Config groups whose values are checked against ``conf/<group>/*.yaml``.
GROUPS = ("model", "decoder", "task", "logger")
HASH_LEN = 12

# Point statuses.
DONE, CACHED, SKIPPED, FAILED, UNKNOWN, PENDING, PARTIAL = (
    "done",
    "cached",
    "skipped",
    "failed",
    "unknown",
    "pending",
    "partial",
)


# ----------------------------------------------------------------------------- identity


def identity(cfg: DictConfig | dict) -> dict[str, Any]:
    """The resolved config that identifies a point: everything but ``NON_IDENTITY_KEYS``."""
    if isinstance(cfg, DictConfig):
        keep = [k for k in cfg.keys() if k not in NON_IDENTITY_KEYS]
        cfg = OmegaConf.to_container(OmegaConf.masked_copy(cfg, keep), resolve=True)
    return {k: v for k, v in cfg.items() if k not in NON_IDENTITY_KEYS}


def config_hash(ident: dict[str, Any]) -> str:
    blob = json.dumps(ident, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:HASH_LEN]


def finished(point_dir: Path, point_hash: str) -> bool:
    """True when ``summary.json`` exists and was produced by a config with this hash."""
    path = point_dir / "summary.json"
    if not path.exists():
        return False
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return (
        isinstance(summary.get("config"), dict)
        and config_hash(identity(summary["config"])) == point_hash
    )


# ----------------------------------------------------------------------------- definition


@dataclass
class Point:
    overrides: list[str]
    cfg: DictConfig | None = None  # composed (without the hydra node); None when unknown
    choices: dict[str, str] = field(default_factory=dict)  # config group -> option
    hash: str | None = None
    problem: str | None = None  # why it cannot be composed (unknown group option, bad value)

    @property
    def label(self) -> str:
        return " ".join(self.overrides)


@dataclass
class Sweep:
    path: Path
    name: str
    root: Path
    base_overrides: list[str]  # profile + command-line overrides, as given (hydra.* excluded)
    jobs: list[list[str]]  # per point, the overrides Hydra would give the job
    points: list[Point]
    meta: dict[str, Any] = field(default_factory=dict)  # the file's ``sweep:`` block
    hydra_overrides: list[str] = field(
        default_factory=list
    )  # hydra.* / hydra/*: for launchers only

    @property
    def dir(self) -> Path:
        return self.root / self.name

    def known(self) -> list[Point]:
        return [p for p in self.points if p.hash is not None]


class _Composer:
    """Compose configs with the sweep file as primary config and ``conf/`` on the search path.

    Use as a context manager (Hydra is initialized once for all the points).
    """

    def __init__(self, sweep_file: Path, conf_dir: Path = CONF_DIR):
        from hydra import initialize_config_dir

        self.file = Path(sweep_file).resolve()
        self.conf_dir = Path(conf_dir).resolve()
        self._init = initialize_config_dir(config_dir=str(self.file.parent), version_base="1.3")

    def __enter__(self) -> _Composer:
        self._init.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._init.__exit__(*exc)

    def __call__(self, overrides: Sequence[str]) -> DictConfig:
        from hydra import compose

        return compose(
            self.file.stem,
            overrides=[f"hydra.searchpath=[file://{self.conf_dir}]", *overrides],
            return_hydra_config=True,
        )


def expand(params: dict[str, Any], overrides: Sequence[str]) -> list[list[str]]:
    """Jobs of the grid ``params`` + ``overrides``, as Hydra's basic sweeper makes them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = [f"{k}={v}" for k, v in (params or {}).items()] + list(overrides)
    parsed = OverridesParser.create().parse_overrides(args)
    chunks = BasicSweeper.split_arguments(parsed, None)
    return [list(job) for job in chunks[0]] if chunks else [[]]


def _unknown_option(override: str, conf_dir: Path) -> str | None:
    key, _, value = override.partition("=")
    key = key.lstrip("+~")
    if key not in GROUPS or not value or value == "null":
        return None
    options = group_options(key, conf_dir)
    if value in options:
        return None
    near = difflib.get_close_matches(value, options, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    return f"unknown {key} {value!r} (no conf/{key}/{value}.yaml{hint}); available: {', '.join(options)}"


def load(
    sweep_file: str | Path,
    overrides: Sequence[str] = (),
    *,
    name: str | None = None,
    root: str | Path | None = None,
    profile: str | None = None,
    conf_dir: Path = CONF_DIR,
) -> Sweep:
    """Read a sweep file, expand its grid and compose every point (no model is loaded)."""
    sweep_file = Path(sweep_file)
    if not sweep_file.exists():
        raise FileNotFoundError(f"no sweep file {sweep_file}")
    if "sweep" not in OmegaConf.load(sweep_file):
        raise ValueError(
            f"{sweep_file} is not a sweep file: it has no `sweep:` block (name, root) "
            "and grid in hydra.sweeper.params; see experiments/table2_smoke.yaml"
        )
    with _Composer(sweep_file, conf_dir) as composer:
        return _load(composer, sweep_file, overrides, name, root, profile, conf_dir)


def _load(
    composer: _Composer,
    sweep_file: Path,
    overrides: Sequence[str],
    name: str | None,
    root: str | Path | None,
    profile: str | None,
    conf_dir: Path,
) -> Sweep:
    base_cfg = composer([])
    meta = OmegaConf.to_container(base_cfg.get("sweep") or {}, resolve=False)
    profiles = meta.get("profiles") or {}
    extra: list[str] = []
    if profile:
        if profile not in profiles:
            raise ValueError(
                f"sweep {sweep_file} has no profile {profile!r}; profiles: {sorted(profiles) or 'none'}"
            )
        extra = [str(o) for o in profiles[profile]]
    base_overrides, hydra_overrides = [], []
    for o in [*extra, *overrides]:
        (hydra_overrides if _is_hydra_override(o) else base_overrides).append(o)
    sweep_name = name or (
        f"{meta.get('name') or sweep_file.stem}" + (f"_{profile}" if profile else "")
    )
    sweep_root = Path(root if root is not None else meta.get("root") or "results/sweeps")
    params = OmegaConf.to_container(base_cfg.hydra.sweeper.params or {}, resolve=False)
    jobs = expand(params, base_overrides)
    points = []
    for job in jobs:
        point = Point(overrides=job)
        problems = [p for p in (_unknown_option(o, conf_dir) for o in job) if p]
        if problems:
            point.problem = "; ".join(problems)
        else:
            try:
                cfg = composer(job)
            except Exception as e:  # a bad override value: report it, keep the other points
                point.problem = f"cannot compose: {e}".splitlines()[0]
            else:
                point.choices = {
                    k: v
                    for k, v in cfg.hydra.runtime.choices.items()
                    if not k.startswith("hydra/") and v is not None
                }
                point.cfg = _strip_hydra(cfg)
                point.hash = config_hash(identity(point.cfg))
        points.append(point)
    return Sweep(
        path=sweep_file,
        name=sweep_name,
        root=sweep_root,
        base_overrides=base_overrides,
        jobs=jobs,
        points=points,
        meta=meta,
        hydra_overrides=hydra_overrides,
    )


def _is_hydra_override(override: str) -> bool:
    """``hydra.launcher.partition=gpu``, ``hydra/launcher=...``: Hydra's own settings, not the job's."""
    return override.lstrip("+~").startswith(("hydra.", "hydra/"))


def _strip_hydra(cfg: DictConfig) -> DictConfig:
    keep = [k for k in cfg.keys() if k != "hydra"]
    out = OmegaConf.masked_copy(cfg, keep)
    OmegaConf.set_struct(out, False)
    return out


def unknown_names(sweep: Sweep) -> dict[str, list[str]]:
    """Group option names in the grid that have no YAML in ``conf/``: {group: [names]}."""
    out: dict[str, set[str]] = {}
    for p in sweep.points:
        for o in p.overrides:
            if _unknown_option(o, CONF_DIR):
                key, _, value = o.partition("=")
                out.setdefault(key.lstrip("+~"), set()).add(value)
    return {k: sorted(v) for k, v in out.items()}


# ----------------------------------------------------------------------------- running


def point_status(point_dir: Path, point_hash: str) -> tuple[str, str | None]:
    """(status, detail) of a point folder, from its files only."""
    if finished(point_dir, point_hash):
        return DONE, None
    for name, status in (("skipped.json", SKIPPED), ("error.json", FAILED)):
        path = point_dir / name
        if path.exists():
            try:
                return status, json.loads(path.read_text()).get("reason")
            except (OSError, json.JSONDecodeError):
                return status, None
    records = read_jsonl(point_dir / "samples.jsonl")
    if records:
        return PARTIAL, f"{len(records)} records"
    return PENDING, None


_task_checks: dict[str, tuple[bool, str | None, int | None, int | None]] = {}


def check_task(cfg: DictConfig) -> tuple[bool, str | None, int | None, int | None]:
    """(available, reason, examples, turns) of a point's task, loading its data once per process."""
    from hydra.utils import instantiate

    from mtad.tasks.base import TaskUnavailable

    task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
    task_cfg.pop("scorer", None)
    key = json.dumps([task_cfg, cfg.get("limit")], sort_keys=True, default=str)
    if key not in _task_checks:
        try:
            task = instantiate(task_cfg)
            examples = task.load()
        except Exception as e:
            cause = _find_cause(e, TaskUnavailable)
            if cause is None:
                raise
            _task_checks[key] = (False, f"TaskUnavailable: {cause}", None, None)
        else:
            if cfg.get("limit") is not None:
                examples = examples[: int(cfg.limit)]
            _task_checks[key] = (
                True,
                None,
                len(examples),
                sum(task.num_turns(ex) for ex in examples),
            )
    return _task_checks[key]


def _find_cause(exc: BaseException, kind: type) -> BaseException | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _model_load_error(exc: BaseException, cfg: DictConfig) -> str | None:
    """The reason when ``exc`` came from instantiating the model pair, else None."""
    from hydra.errors import InstantiationException

    target = str(OmegaConf.select(cfg, "model._target_") or "")
    if isinstance(exc, InstantiationException) and target and f"'{target}'" in str(exc):
        cause = exc.__cause__ or exc
        return f"model pair {OmegaConf.select(cfg, 'model.name')!r} cannot be loaded: {type(cause).__name__}: {cause}"
    return None


def run_point(
    cfg: DictConfig,
    point_dir: Path,
    overrides: Sequence[str] = (),
    choices: dict[str, str] | None = None,
    evaluate: Callable[[DictConfig, Path], Any] | None = None,
) -> str:
    """Run one point into ``point_dir`` unless it is finished; returns its status.

    TaskUnavailable and model-load errors write ``skipped.json``; any other exception writes
    ``error.json`` and is re-raised. KeyboardInterrupt passes through untouched (resumable).
    """
    if evaluate is None:
        from mtad.evaluate import run as evaluate
    from mtad.tasks.base import TaskUnavailable

    cfg = cfg.copy()
    OmegaConf.set_struct(cfg, False)
    cfg.output_dir = str(point_dir)
    ident = identity(cfg)
    h = config_hash(ident)
    if finished(point_dir, h):
        return CACHED
    point_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        point_dir / "point.json",
        {
            "hash": h,
            "overrides": list(overrides),
            "choices": dict(choices or {}),
            "identity": ident,
        },
    )
    for stale in ("skipped.json", "error.json"):
        (point_dir / stale).unlink(missing_ok=True)

    def _record(name: str, reason: str, **extra) -> None:
        write_json_atomic(
            point_dir / name,
            {
                "hash": h,
                "overrides": list(overrides),
                "reason": reason,
                "time_utc": datetime.now(timezone.utc).isoformat(),
                **extra,
            },
        )

    try:
        stored = _stored_hash(point_dir)
        if stored not in (None, h):
            raise RuntimeError(
                f"{point_dir} holds results of another config (hash {stored}, expected {h}); "
                "move it away to recompute this point"
            )
        available, reason, _, _ = check_task(cfg)
        if not available:
            _record("skipped.json", reason, kind="task_unavailable")
            log.warning("skipped %s: %s", point_dir.name, reason)
            return SKIPPED
        evaluate(cfg, point_dir)
    except Exception as e:
        cause = _find_cause(e, TaskUnavailable)
        model_reason = _model_load_error(e, cfg)
        if cause is not None or model_reason is not None:
            reason = f"TaskUnavailable: {cause}" if cause is not None else model_reason
            kind = "task_unavailable" if cause is not None else "model_unavailable"
            _record("skipped.json", reason, kind=kind)
            log.warning("skipped %s: %s", point_dir.name, reason)
            return SKIPPED
        _record("error.json", f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        raise
    return DONE


def _stored_hash(point_dir: Path) -> str | None:
    """Hash of the config evaluate recorded in ``point_dir`` (summary.json, else config.json)."""
    for name in ("summary.json", "config.json"):
        path = point_dir / name
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            cfg = data.get("config") if name == "summary.json" else data
            if isinstance(cfg, dict):
                return config_hash(identity(cfg))
    return None


@dataclass
class Report:
    statuses: dict[str, str] = field(default_factory=dict)  # label -> status

    def count(self, status: str) -> int:
        return sum(1 for s in self.statuses.values() if s == status)

    @property
    def ok(self) -> bool:
        return self.count(FAILED) == 0


def write_index(sweep: Sweep) -> None:
    """``<root>/<name>/sweep.json``: the points of this definition and where they stand."""
    rows = []
    for p in sweep.points:
        row: dict[str, Any] = {"overrides": p.overrides, "hash": p.hash, "choices": p.choices}
        if p.hash is None:
            row.update(status=UNKNOWN, reason=p.problem)
        else:
            row["status"], row["reason"] = point_status(sweep.dir / p.hash, p.hash)
        rows.append(row)
    write_json_atomic(
        sweep.dir / "sweep.json",
        {
            "name": sweep.name,
            "file": str(sweep.path),
            "overrides": sweep.base_overrides,
            "updated_utc": datetime.now(timezone.utc).isoformat(),
            "points": rows,
        },
    )


def run(
    sweep: Sweep,
    *,
    fail_fast: bool = False,
    progress: bool = True,
    evaluate: Callable[[DictConfig, Path], Any] | None = None,
) -> Report:
    """Run every known point of ``sweep`` here, one after the other."""
    from tqdm import tqdm

    report = Report()
    for p in sweep.points:
        if p.hash is None:
            report.statuses[p.label] = UNKNOWN
            log.warning("not run (%s): %s", p.label, p.problem)
    write_index(sweep)
    todo = sweep.known()
    bar = tqdm(
        total=len(todo), desc=f"sweep {sweep.name}", unit="pt", disable=not progress, position=0
    )
    try:
        for p in todo:
            bar.set_postfix_str(p.label[:60])
            try:
                status = run_point(
                    p.cfg, sweep.dir / p.hash, p.overrides, p.choices, evaluate=evaluate
                )
            except Exception as e:
                status = FAILED
                log.error("point %s (%s) failed: %s", p.hash, p.label, e)
                if fail_fast:
                    raise
            finally:
                write_index(sweep)
            report.statuses[p.label] = status
            bar.update(1)
            bar.set_postfix(
                done=report.count(DONE) + report.count(CACHED),
                skipped=report.count(SKIPPED),
                failed=report.count(FAILED),
            )
    finally:
        bar.close()
    return report


# ----------------------------------------------------------------------------- launchers


def launch(sweep: Sweep, launcher: str, concurrent: bool = False) -> int:
    """One Hydra multirun per model pair through ``hydra/launcher=<launcher>``; returns an exit code.

    A multirun launches one job per point; the pair is fixed per multirun so that the launcher
    config can read its ``gpus`` (``${model.gpus}``). Pairs whose points are all finished are
    not launched; finished points inside a launched multirun return at once. With
    ``concurrent`` the multiruns of all pairs are started together (a scheduler queues them
    all); otherwise one after the other (local launchers: points do not share the machine).
    """
    write_index(sweep)
    by_model: dict[str, list[Point]] = {}
    for p in sweep.known():
        by_model.setdefault(p.choices.get("model", ""), []).append(p)
    rc, procs = 0, []
    for model, points in by_model.items():
        todo = [p for p in points if not finished(sweep.dir / p.hash, p.hash)]
        if not todo:
            log.info("model %s: all %d points finished", model, len(points))
            continue
        axes = _axes(points)
        axes.pop("model", None)
        cmd = [
            sys.executable,
            "-m",
            "mtad.sweep",
            "hydra",
            "-m",
            "-cd",
            str(sweep.path.resolve().parent),
            "-cn",
            sweep.path.stem,
            f"hydra/launcher={launcher}",
            f"sweep.name={sweep.name}",
            f"sweep.root={sweep.root.resolve()}",
            *sweep.hydra_overrides,
        ]
        if model:
            cmd.append(f"model={model}")
        cmd += [f"{k}={','.join(v)}" for k, v in axes.items()]
        log.info(
            "launching %d points of %s: %s", len(points), model or "the default pair", " ".join(cmd)
        )
        if concurrent:
            procs.append(subprocess.Popen(cmd))
        else:
            rc = subprocess.call(cmd) or rc
    for proc in procs:
        rc = proc.wait() or rc
    write_index(sweep)
    return rc


def _axes(points: Sequence[Point]) -> dict[str, list[str]]:
    """The distinct values per override key among ``points``, in first-seen order."""
    axes: dict[str, list[str]] = {}
    for p in points:
        for o in p.overrides:
            key, _, value = o.partition("=")
            vals = axes.setdefault(key, [])
            if value not in vals:
                vals.append(value)
    return axes


def _hydra_task(cfg: DictConfig) -> str:
    """A Hydra job = one sweep point, written to ``<sweep.root>/<sweep.name>/<hash>/``."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    choices = {
        k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra/") and v is not None
    }
    meta = cfg.get("sweep") or {}
    out_root = Path(meta.get("root") or "results/sweeps") / str(meta.get("name") or "sweep")
    cfg = _strip_hydra(cfg)
    cfg.output_dir = None
    h = config_hash(identity(cfg))
    status = run_point(
        cfg, out_root / h, [o for o in overrides if not o.startswith(("sweep.", "hydra"))], choices
    )
    log.info("point %s: %s", h, status)
    return status


def hydra_main(argv: Sequence[str]) -> None:
    """``python -m mtad.sweep hydra [-m] -cd experiments -cn <sweep> [overrides]``."""
    import hydra

    sys.argv = [sys.argv[0], *argv]
    hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(_hydra_task)()


# ----------------------------------------------------------------------------- command line


def estimate(
    sweep: Sweep, tokens_per_s: float, point_overhead_s: float, example_overhead_s: float = 0.0
) -> dict[str, Any]:
    """Rough wall time of the unfinished points, an upper bound on generation (no early EOS):
    new tokens / rate + a cost per point (model load, warm-up) + a cost per (example, turn)
    (prompt prefill, perplexity pass, scoring)."""
    tokens, points, unavailable, turns = 0, 0, 0, 0
    for p in sweep.known():
        if finished(sweep.dir / p.hash, p.hash):
            continue
        ok, _, n_ex, n_turns = check_task(p.cfg)
        if not ok:
            unavailable += 1
            continue
        left = max(0, (n_turns or 0) - len(read_jsonl(sweep.dir / p.hash / "samples.jsonl")))
        tokens += left * int(p.cfg.max_new_tokens)
        turns += left
        points += 1
    seconds = tokens / tokens_per_s + points * point_overhead_s + turns * example_overhead_s
    return {
        "points": points,
        "turns": turns,
        "max_new_tokens_total": tokens,
        "seconds": seconds,
        "unavailable": unavailable,
    }


def dry_run(
    sweep: Sweep,
    tokens_per_s: float,
    point_overhead_s: float,
    example_overhead_s: float = 0.0,
    out=None,
) -> None:
    out = out or sys.stdout
    known = sweep.known()
    print(
        f"sweep {sweep.name}: {len(sweep.points)} points ({len(known)} composable) -> {sweep.dir}",
        file=out,
    )
    for p in sweep.points:
        if p.hash is None:
            status, detail, h = UNKNOWN, p.problem, "-" * HASH_LEN
        else:
            ok, reason, n_ex, n_turns = check_task(p.cfg)
            status, detail = point_status(sweep.dir / p.hash, p.hash)
            if status in (PENDING, PARTIAL, SKIPPED) and not ok:
                status, detail = "unavailable", reason
            elif status in (PENDING, PARTIAL):
                detail = f"{n_ex} examples, {n_turns} turns" + (f", {detail}" if detail else "")
            h = p.hash
        print(f"  {h}  {status:<11} {p.label}" + (f"  [{detail}]" if detail else ""), file=out)
    for group, names in unknown_names(sweep).items():
        print(
            f"unknown {group} names (no conf/{group}/<name>.yaml yet): {', '.join(names)}", file=out
        )
    est = estimate(sweep, tokens_per_s, point_overhead_s, example_overhead_s)
    print(
        f"estimate: {est['points']} points, {est['turns']} generations, <= {est['max_new_tokens_total']} "
        f"new tokens -> at most about {est['seconds'] / 60:.0f} min, assuming {tokens_per_s:g} tokens/s, "
        f"{point_overhead_s:g} s per point (model load, warm-up) and {example_overhead_s:g} s per "
        "generation (prefill, perplexity, scoring)",
        file=out,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["hydra"]:
        hydra_main(argv[1:])
        return 0
    ap = argparse.ArgumentParser(prog="python -m mtad.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_file", help="experiments/<sweep>.yaml")
    ap.add_argument(
        "overrides", nargs="*", help="Hydra overrides; a sweep value (a,b) replaces that axis"
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="list the points and their status; run nothing"
    )
    ap.add_argument("--profile", help="a profile from the file's sweep.profiles (e.g. smoke, cpu)")
    ap.add_argument("--name", help="results folder name (default: sweep.name[_profile])")
    ap.add_argument("--root", help="results root (default: sweep.root, results/sweeps)")
    ap.add_argument(
        "--launcher",
        help="run through Hydra with conf/hydra/launcher/<name>.yaml (mtad_slurm, mtad_joblib)",
    )
    ap.add_argument(
        "--concurrent-pairs",
        action="store_true",
        help="with --launcher: start the multiruns of all model pairs at once (Slurm)",
    )
    ap.add_argument("--fail-fast", action="store_true", help="stop at the first failing point")
    ap.add_argument(
        "--strict", action="store_true", help="refuse a grid with unknown decoder/task/model names"
    )
    ap.add_argument(
        "--assume-tokens-per-s",
        type=float,
        help="rate for --dry-run's estimate (default: the file's sweep.estimate, else 2)",
    )
    ap.add_argument(
        "--point-overhead-s",
        type=float,
        help="cost per point for the estimate (default: sweep.estimate, else 20)",
    )
    ap.add_argument(
        "--example-overhead-s",
        type=float,
        help="cost per generation for the estimate (default: sweep.estimate, else 0)",
    )
    args = ap.parse_intermixed_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    sweep = load(
        args.sweep_file, args.overrides, name=args.name, root=args.root, profile=args.profile
    )
    if sweep.hydra_overrides and not args.launcher:
        log.warning("ignored without --launcher: %s", " ".join(sweep.hydra_overrides))
    unknown = unknown_names(sweep)
    for group, names in unknown.items():
        log.warning(
            "sweep %s: unknown %s names %s (no conf/%s/<name>.yaml); their points are not run",
            sweep.name,
            group,
            names,
            group,
        )
    if args.strict and unknown:
        return 2
    if args.dry_run:
        est = sweep.meta.get("estimate") or {}
        rate = args.assume_tokens_per_s or float(est.get("tokens_per_s", 2.0))

        def pick(arg, key, default):
            return arg if arg is not None else float(est.get(key, default))

        dry_run(
            sweep,
            rate,
            pick(args.point_overhead_s, "point_overhead_s", 20.0),
            pick(args.example_overhead_s, "example_overhead_s", 0.0),
        )
        return 0
    if args.launcher:
        return launch(sweep, args.launcher, concurrent=args.concurrent_pairs)
    report = run(sweep, fail_fast=args.fail_fast)
    summary = ", ".join(
        f"{s} {report.count(s)}"
        for s in (DONE, CACHED, SKIPPED, FAILED, UNKNOWN)
        if report.count(s)
    )
    print(f"sweep {sweep.name}: {summary} -> {sweep.dir}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    import mtad.sweep as _module  # run the importable copy, so Hydra jobs pickle by reference

    sys.exit(_module.main())

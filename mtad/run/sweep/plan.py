"""A sweep's plan: read a sweep file, expand its grid as Hydra does, compose and check every point.

Nothing runs here and no model is loaded (``check_task`` loads a task's examples to count
them). A point that cannot be composed or fails a check (unknown config name, bad value, a
knob its decoder does not use) keeps its ``problem`` and is never run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mtad.run.cli import CONF_DIR, check_keys, expand
from mtad.run.config import (
    ConfigError,
    MachineUnfit,
    check_knobs,
    check_scorer,
    describe_error,
    explicit_keys,
    validate,
)
from mtad.run.results import Catalog, PointFolder, Store, identity, identity_hash, requested_limit


@dataclass
class Point:
    overrides: list[str]
    cfg: DictConfig | None = None  # composed (without the hydra node); None when unknown
    choices: dict[str, str] = field(default_factory=dict)  # config group -> option
    hash: str | None = None  # identity hash (mtad.run.results.identity)
    limit: int | None = None  # examples requested (None: all of the task's)
    problem: str | None = None  # why it cannot be run (unknown name, bad value, unused knob)
    machine: bool = False  # the problem is this machine's (MachineUnfit), not the point's

    @property
    def label(self) -> str:
        return " ".join(self.overrides)


#: ``sweep.examples``: which examples a rendering of the sweep shows for a point whose folder
#: holds more than the point asks for (a point found in another sweep's folder): ``all`` of
#: them, or the ``requested`` first ``limit`` (an ablation: every point on the same examples).
EXAMPLES_POLICIES = ("all", "requested")
#: ``sweep.render.<profile>`` (``paper`` without a profile): how a rendering draws the sweep.
#: ``pareto_x``: the x axis of the perplexity-vs-speed figure, tokens/s or, for records made on
#: a shared machine, block efficiency (``mtad.analysis.figures.PARETO_X``); ``speedups``: the
#: tables' ×MN / ×SpD columns (false for a shared machine's tokens/s).
RENDER_OPTIONS = {"pareto_x": ("tokens_per_s", "block_efficiency"), "speedups": (True, False)}


@dataclass
class Sweep:
    path: Path
    name: str
    root: Path
    base_overrides: list[str]  # profile + command-line overrides, as given (hydra.* excluded)
    jobs: list[list[str]]  # per point, the overrides Hydra would give the job
    points: list[Point]
    meta: dict[str, Any] = field(default_factory=dict)  # the file's ``sweep:`` block
    hydra_overrides: list[str] = field(default_factory=list)  # hydra.* / hydra/*: launchers only
    search: list[Path] = field(default_factory=list)  # where a point is looked for (Catalog)
    render: dict[str, Any] = field(default_factory=dict)  # sweep.render of its profile
    _folders: dict[str, PointFolder] = field(default_factory=dict, repr=False)
    _catalog: Catalog | None = field(default=None, repr=False)

    @property
    def dir(self) -> Path:
        return self.root / self.name

    def known(self) -> list[Point]:
        return [p for p in self.points if p.hash is not None]

    def store(self) -> Store:
        return Store(self.dir)

    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog(self.search or [self.root])
        return self._catalog

    def folder(self, point: Point, store: Store | None = None) -> PointFolder:
        """The folder of ``point``: one under ``search`` that holds it (another sweep's, read or
        resumed in place; ``Store.folder``), else ``<root>/<name>/<hash>/``. Chosen once per
        point and kept, so a run and its index name the same folder."""
        if point.hash not in self._folders:
            self._folders[point.hash] = (store or self.store()).folder(
                point.hash, point.limit, self.catalog())
        return self._folders[point.hash]

    def is_own(self, folder: PointFolder) -> bool:
        return folder.path.parent.resolve() == self.dir.resolve()


class Composer:
    """Compose configs with the sweep file as primary config and ``conf/`` on the search path.

    Use as a context manager (Hydra is initialized once for all the points).
    """

    def __init__(self, sweep_file: Path, conf_dir: Path = CONF_DIR):
        from hydra import initialize_config_dir

        self.file = Path(sweep_file).resolve()
        self.conf_dir = Path(conf_dir).resolve()
        self._init = initialize_config_dir(config_dir=str(self.file.parent), version_base="1.3")

    def __enter__(self) -> Composer:
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


def is_hydra_override(override: str) -> bool:
    """``hydra.launcher.partition=gpu``, ``hydra/launcher=...``: Hydra's own settings, not the job's."""
    return override.lstrip("+~").startswith(("hydra.", "hydra/"))


def strip_hydra(cfg: DictConfig) -> DictConfig:
    out = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
    OmegaConf.set_struct(out, False)
    return out


def choices_of(cfg: DictConfig) -> dict[str, str]:
    return {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra/") and v is not None}


def check_point(cfg: DictConfig, overrides: Sequence[str], sweep_file: Path) -> None:
    """Values, knobs, class paths and scorer preflight of one composed point; ConfigError names
    the problem. The class paths are held to the stored-config allow-list
    (``mtad.run.results.targets``): a launcher job composes its points from the overrides its
    sweep folder's ``sweep.json`` lists."""
    from mtad.run.results.targets import UntrustedConfig, trusted_config

    validate(cfg)
    check_knobs(cfg, explicit_keys(overrides, [sweep_file]))
    try:
        trusted_config(OmegaConf.to_container(cfg, resolve=False), sweep_file)
    except UntrustedConfig as e:
        raise ConfigError(str(e)) from None
    check_scorer(cfg)


def load(
    sweep_file: str | Path,
    overrides: Sequence[str] = (),
    *,
    name: str | None = None,
    root: str | Path | None = None,
    profile: str | None = None,
    search: Sequence[str | Path] | None = None,
    conf_dir: Path = CONF_DIR,
) -> Sweep:
    """Read a sweep file, expand its grid and compose every point (no model is loaded).

    ``search``: the folders where a point is looked for before it gets a folder of its own
    (default: the file's ``sweep.search``, e.g. ``[results]``; with ``root`` given and no
    ``search``, that root only, so a sweep run into a scratch root never touches other folders).
    """
    sweep_file = Path(sweep_file)
    explicit_root = root is not None
    if not sweep_file.exists():
        raise FileNotFoundError(f"no sweep file {sweep_file}")
    try:
        top = OmegaConf.load(sweep_file)
    except Exception as e:  # noqa: BLE001 - yaml's scanner/parser errors have no common public base
        raise ValueError(f"{sweep_file} is not a YAML sweep file ({type(e).__name__}: "
                         f"{str(e).splitlines()[0]}); see experiments/table2.yaml") from None
    if not isinstance(top, DictConfig) or "sweep" not in top:
        raise ValueError(
            f"{sweep_file} is not a sweep file: it has no `sweep:` block (name, root) "
            "and grid in hydra.sweeper.params; see experiments/table2.yaml"
        )
    with Composer(sweep_file, conf_dir) as composer:
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
        _check_examples(meta, sweep_file)  # the file's own fields, before any point is composed
        render = _render_options(meta, sweep_file, profile)
        base_overrides, hydra_overrides = [], []
        for o in [*extra, *overrides]:
            (hydra_overrides if is_hydra_override(o) else base_overrides).append(o)
        params = OmegaConf.to_container(base_cfg.hydra.sweeper.params or {}, resolve=False)
        grid = [f"{k}={v}" for k, v in params.items()] + base_overrides
        jobs = expand(grid, conf_dir)
        points = [_point(composer, job, sweep_file, conf_dir) for job in jobs]
    root = Path(root if root is not None else meta.get("root") or "results/sweeps")
    if search is None:
        search = [root] if explicit_root or not meta.get("search") else list(meta["search"])
    return Sweep(
        path=sweep_file,
        name=name or f"{meta.get('name') or sweep_file.stem}" + (f"_{profile}" if profile else ""),
        root=root,
        search=[Path(s) for s in search],
        base_overrides=base_overrides,
        jobs=jobs,
        points=points,
        meta=meta,
        hydra_overrides=hydra_overrides,
        render=dict(render),
    )


def _check_examples(meta: dict, sweep_file: Path) -> None:
    if meta.get("examples", "all") not in EXAMPLES_POLICIES:
        raise ValueError(
            f"{sweep_file}: sweep.examples={meta.get('examples')!r} is not one of "
            f"{', '.join(EXAMPLES_POLICIES)} (all: a table shows every example a point's folder "
            "holds; requested: only the first `limit`, so that the points of an ablation share "
            "their examples)"
        )


def sweep_meta(sweep_file: str | Path, conf_dir: Path = CONF_DIR) -> dict:
    """The file's ``sweep:`` block as ``load`` reads it (``examples`` checked), without
    composing its points."""
    sweep_file = Path(sweep_file)
    with Composer(sweep_file, conf_dir) as composer:
        meta = OmegaConf.to_container(composer([]).get("sweep") or {}, resolve=False)
    _check_examples(meta, sweep_file)
    return meta


def _render_options(meta: dict, sweep_file: Path, profile: str | None) -> dict:
    """The file's ``sweep.render.<profile>`` (``paper`` without one), each option checked."""
    render = (meta.get("render") or {}).get(profile or "paper") or {}
    for key, value in render.items():
        if key not in RENDER_OPTIONS or value not in RENDER_OPTIONS[key]:
            raise ValueError(
                f"{sweep_file}: sweep.render.{profile or 'paper'}.{key}={value!r}: the options are "
                + "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in RENDER_OPTIONS.items())
            )
    return dict(render)


def render_options(sweep_file: str | Path, profile: str | None = None, conf_dir: Path = CONF_DIR) -> dict:
    """The render options ``load`` gives ``sweep_file`` under ``profile``, without composing its
    points (ValueError naming the option when one is not in ``RENDER_OPTIONS``)."""
    return _render_options(sweep_meta(sweep_file, conf_dir), Path(sweep_file), profile)


def _point(composer: Composer, job: list[str], sweep_file: Path, conf_dir: Path) -> Point:
    point = Point(overrides=job)
    try:
        check_keys(job, conf_dir)
        try:
            cfg = composer(job)
        except Exception as e:  # a bad override value: report it, keep the other points
            raise ConfigError(describe_error(e)) from None
        point.choices = choices_of(cfg)
        point.cfg = strip_hydra(cfg)
        check_point(point.cfg, job, sweep_file)
        point.hash = identity_hash(identity(point.cfg))
        point.limit = requested_limit(point.cfg)
    except (ConfigError, ValueError) as e:
        point.problem = str(e)
        point.machine = isinstance(e, MachineUnfit)
        point.hash = None
    return point


def unknown_names(sweep: Sweep) -> dict[str, list[str]]:
    """Group option names in the grid that have no YAML in ``conf/``: {group: [names]}."""
    out: dict[str, set[str]] = {}
    for p in sweep.points:
        m = re.match(r"unknown (\w+) '([^']+)' \(no conf/", p.problem or "")
        if m:
            out.setdefault(m.group(1), set()).add(m.group(2))
    return {k: sorted(v) for k, v in out.items()}


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
            cause = find_cause(e, TaskUnavailable)
            if cause is None:
                raise
            _task_checks[key] = (False, f"TaskUnavailable: {cause}", None, None)
        else:
            if cfg.get("limit") is not None:
                examples = examples[: int(cfg.limit)]
            _task_checks[key] = (True, None, len(examples), sum(task.num_turns(ex) for ex in examples))
    return _task_checks[key]


def find_cause(exc: BaseException, kind: type) -> BaseException | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None

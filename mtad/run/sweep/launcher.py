"""Sweeps through Hydra launchers (Slurm via submitit, joblib) and as plain Hydra multiruns.

- ``launch`` (``python -m mtad.run.sweep <file> --launcher <name>``): a Slurm launcher
  (``mtad_slurm``) goes to ``mtad.run.sweep.slurm`` (the unfinished points as one job array per
  model pair, sized by the pair's config, checked against ``sinfo`` first); any other launcher
  (``mtad_joblib``) runs one Hydra multirun whose jobs are model pairs (times
  ``--jobs-per-pair`` shards). Each job loads its pair once and runs that pair's points one
  after the other (``pair_job``): a pair is never reloaded per point. More shards per pair
  trade pair loads for parallelism; points are split round-robin.
- ``python -m mtad.run.sweep hydra -m -cd experiments -cn <sweep>``: a plain Hydra multirun whose
  jobs are single points (``point_job``).

Both write exactly what a local run writes (``mtad.run.sweep.execute.run_point``), under each
point's lock, so a requeued or repeated job resumes and two jobs never write one folder.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig

from mtad.run.cli import CONF_DIR
from mtad.run.config import ConfigError
from mtad.run.results import (
    UNKNOWN,
    Catalog,
    Store,
    identity,
    identity_hash,
    read_json,
    requested_limit,
)
from mtad.run.sweep import slurm
from mtad.run.sweep.execute import run, run_point, write_index
from mtad.run.sweep.plan import Sweep, check_point, load, strip_hydra

log = logging.getLogger(__name__)


def launch(sweep: Sweep, launcher: str, jobs_per_pair: int = 1) -> int:
    """One Hydra multirun over the sweep's model pairs with unfinished points; returns an exit code."""
    write_index(sweep)
    store = sweep.store()
    pairs: list[str] = []
    for p in sweep.known():
        if not sweep.folder(p, store).finished(p.hash, p.limit):
            model = p.choices.get("model", "")
            if model not in pairs:
                pairs.append(model)
    if not pairs:
        log.info("sweep %s: every point is finished; nothing submitted", sweep.name)
        return 0
    first = next(p for p in sweep.known() if p.choices.get("model", "") == pairs[0])
    if slurm.is_slurm(slurm.launcher_config(sweep, launcher, first)):
        try:
            return slurm.launch(sweep, launcher, jobs_per_pair=jobs_per_pair)
        finally:
            write_index(sweep)
    cmd = [
        sys.executable, "-m", "mtad.run.sweep", "pairs", "-m",
        "-cd", str(sweep.path.resolve().parent), "-cn", sweep.path.stem,
        f"hydra/launcher={launcher}",
        "hydra.sweeper.params=null",  # the grid is expanded inside each job, not by the launcher
        f"sweep.name={sweep.name}",
        f"sweep.root={sweep.root.resolve()}",
        f"++sweep.search=[{','.join(str(d.resolve()) for d in sweep.search)}]",
        f"+sweep.file={sweep.path.resolve()}",
        f"+sweep.shards={jobs_per_pair}",
        f"+sweep.shard={','.join(str(i) for i in range(jobs_per_pair))}",
        f"model={','.join(pairs)}",
        *sweep.hydra_overrides,
    ]
    log.info("launching %d pair jobs x %d shards: %s", len(pairs), jobs_per_pair, " ".join(cmd))
    rc = subprocess.call(cmd)
    write_index(sweep)
    return rc


def pair_job(cfg: DictConfig) -> str:
    """A launcher job: the points of one model pair (one shard of them), pair loaded once."""
    from hydra.core.hydra_config import HydraConfig

    meta = cfg.sweep
    root = Path(meta.root) / str(meta.name)
    index = read_json(root / "sweep.json") or {}
    model = HydraConfig.get().runtime.choices.get("model")
    with _own_hydra():
        sweep = load(meta.file, index.get("overrides", []), name=str(meta.name), root=meta.root,
                     search=list(meta.get("search") or [meta.root]))
    mine = [p for p in sweep.known() if p.choices.get("model") == model]
    mine = mine[int(meta.shard) :: int(meta.shards)]
    report = run(sweep, points=mine, progress=False)
    summary = ", ".join(f"{s} {report.count(s)}" for s in sorted(set(report.statuses.values())))
    log.info("pair %s, shard %s/%s: %s", model, meta.shard, meta.shards, summary)
    return summary


@contextmanager
def _own_hydra():
    """Compose configs inside a running Hydra job: set its global state aside, then restore it."""
    from hydra.core.global_hydra import GlobalHydra

    running = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        yield
    finally:
        GlobalHydra.instance().clear()
        if running is not None:
            GlobalHydra.instance().initialize(running)


def point_job(cfg: DictConfig) -> str:
    """A plain multirun job = one sweep point, written to its folder under ``<root>/<name>/``."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    overrides = [o for o in hc.overrides.task if not o.lstrip("+~").startswith(("sweep.", "hydra"))]
    meta = cfg.get("sweep") or {}
    root = Path(meta.get("root") or "results/sweeps")
    store = Store(root / str(meta.get("name") or "sweep"))
    catalog = Catalog(meta.get("search") or [root])
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra/") and v is not None}
    cfg = strip_hydra(cfg)
    cfg.output_dir = None
    sweep_file = _primary_file(hc)
    try:
        check_point(cfg, overrides, sweep_file)
    except ConfigError as e:
        log.error("point %s not run: %s", " ".join(overrides), e)
        return UNKNOWN
    h = identity_hash(identity(cfg))
    status = run_point(cfg, store.folder(h, requested_limit(cfg), catalog), overrides, choices)
    log.info("point %s: %s", h, status)
    return status


def _primary_file(hc) -> Path:
    """The primary config file of a Hydra job (the sweep file given with ``-cd``/``-cn``)."""
    for source in hc.runtime.config_sources:
        if source.schema == "file":
            path = Path(source.path) / f"{hc.job.config_name}.yaml"
            if path.exists():
                return path
    raise FileNotFoundError(f"no {hc.job.config_name}.yaml among Hydra's config sources")


def hydra_main(argv: Sequence[str], task=point_job) -> None:
    """``python -m mtad.run.sweep hydra|pairs [-m] -cd experiments -cn <sweep> [overrides]``."""
    import hydra

    sys.argv = [sys.argv[0], *argv]
    hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(task)()


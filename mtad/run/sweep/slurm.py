"""A sweep on a Slurm cluster: its unfinished points as job arrays, submitted with submitit.

``python -m mtad.run.sweep <file> --launcher mtad_slurm [--jobs-per-pair N]`` comes here
(``mtad.run.sweep.launcher.launch``) when the launcher config's ``_target_`` is a Slurm
launcher. The launcher config (``conf/hydra/launcher/mtad_slurm.yaml`` and ``hydra.launcher.*``
overrides) is composed once per model pair, so each pair's job gets the size its config asks
for (``model.gpus``, ``model.mem_gb``, ``model.cpus``). Before anything is submitted:

- ``sacct`` must answer (submitit reads job states with it; without accounting a job that
  dies is never seen to end), else refused in one line;
- the job must fit a node of its partition (the one it names, else the default) as ``sinfo``
  lists them (CPUs, memory, GPUs, time limit), else refused in one line naming the limit (a
  job that fits nowhere would pend forever).

Only unfinished points are submitted: a pair's unfinished points are split round-robin over at
most N jobs (one array per pair), and each job runs its points one after the other with the
pair loaded once (``mtad.run.sweep.execute.run``, each point under its folder's lock). A job
that ends without a result (killed, cancelled, out of memory, node failure, a Python error) is
reported in one line; a job that pends for a reason that never resolves is cancelled and
reported; the points it left unfinished resume on the next run of the same command.

Jobs run in a shell that exports the submitting shell's values of ``JOB_ENV`` (the launcher's
``setup`` lines, plus ``export`` lines added here), so sites whose sbatch passes no environment
(``--export=NONE``) run the same.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from mtad.run.sweep.plan import Composer, Point, Sweep

try:
    from submitit.helpers import Checkpointable
except ImportError:  # launch() says how to install it
    Checkpointable = None

log = logging.getLogger(__name__)

#: What a job needs from the submitting shell: offline flags, caches, threads, the import path.
JOB_ENV = (
    "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_HUB_CACHE",
    "HF_DATASETS_CACHE", "MTAD_CACHE", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "PYTHONPATH", "WANDB_MODE", "WANDB_DIR",
)
#: Pending reasons that do not resolve while the job waits (the request exceeds what the
#: partition, QOS or account allows): such a job is cancelled, not waited for.
NEVER_RUNS = (
    "PartitionConfig", "BadConstraints", "PartitionNodeLimit", "PartitionTimeLimit", "InvalidQOS",
    "InvalidAccount", "QOSMaxMemoryPerJob", "QOSMaxCpuPerJobLimit", "QOSMaxGRESPerJob",
    "QOSMaxNodePerJobLimit", "QOSMaxWallDurationPerJobLimit", "AssocMaxWallDurationPerJobLimit",
    "AssocMaxCpuPerJobLimit", "AssocMaxNodePerJobLimit", "AssocMaxGRESPerJob", "AssocMaxMemPerJob",
)
#: A job absent from ``squeue`` whose end ``sacct`` still does not show after this long is
#: reported and no longer waited for.
GONE_AFTER_S = 120.0
_MIB_PER_GB = 1024  # Slurm's GB (sbatch --mem=<n>GB)


class SlurmRefused(Exception):
    """The sweep cannot go through Slurm as asked; the message is one line saying why and what to do."""


def _cmd(args: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


def check_accounting() -> None:
    """Refuse unless ``sacct`` answers: submitit sees a job's end only through it."""
    hint = ("the mtad_slurm launcher needs Slurm accounting: submitit reads job states with sacct, "
            "and without it a job that dies is never seen to end")
    if shutil.which("sacct") is None:
        raise SlurmRefused(f"{hint}; sacct is not on PATH (install slurm-client; accounting: slurmdbd, "
                           "docs/cluster.md) or run without --launcher / with --launcher mtad_joblib")
    try:
        out = _cmd(["sacct", "--noheader", "-X", "-S", "now", "-o", "JobID"], timeout=60)
    except subprocess.TimeoutExpired:
        raise SlurmRefused(f"{hint}; sacct did not answer within 60 s") from None
    if out.returncode != 0:
        msg = " ".join((out.stderr or out.stdout).split()) or f"exit {out.returncode}"
        raise SlurmRefused(f"{hint}; sacct fails here: {msg}")


@dataclass
class Partition:
    name: str
    default: bool
    cpus: int  # per node
    mem_mb: int  # per node
    gpus: int  # per node (gres gpu)
    time_min: float  # the partition's time limit (inf: none)
    nodes: int


def _minutes(limit: str) -> float:
    """Slurm's time limit (``infinite``, ``[days-]hours:minutes:seconds``, ``minutes``) in minutes."""
    limit = limit.strip()
    if limit in ("infinite", "UNLIMITED", "n/a", ""):
        return float("inf")
    days = 0
    if "-" in limit:
        d, limit = limit.split("-", 1)
        days = int(d)
    parts = [int(x) for x in limit.split(":")]
    h, m, s = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return days * 1440 + h * 60 + m + s / 60


def _gpus(gres: str) -> int:
    """GPUs per node from sinfo's %G (``gpu:2``, ``gpu:a100:4(S:0-1)``, ``(null)``)."""
    total = 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        if m:
            total += int(m.group(1))
    return total


def partitions(rows: str | None = None) -> list[Partition]:
    """The partitions ``sinfo`` lists, one entry per group of identical nodes."""
    if rows is None:
        if shutil.which("sinfo") is None:
            raise SlurmRefused("sinfo is not on PATH: this machine is not a Slurm submit host "
                               "(cluster/slurm/up.sh starts a one-node Slurm here; docs/cluster.md)")
        out = _cmd(["sinfo", "--noheader", "-o", "%P|%c|%m|%G|%l|%D"])
        if out.returncode != 0:
            raise SlurmRefused("sinfo fails: " + " ".join((out.stderr or out.stdout).split()))
        rows = out.stdout
    found = []
    for line in rows.splitlines():
        if not line.strip():
            continue
        name, cpus, mem, gres, limit, nodes = line.split("|")
        found.append(Partition(name=name.rstrip("*"), default=name.endswith("*"),
                               cpus=int(cpus.rstrip("+")), mem_mb=int(mem.rstrip("+")), gpus=_gpus(gres),
                               time_min=_minutes(limit), nodes=int(nodes)))
    return found


def request(params: Mapping[str, Any]) -> dict[str, Any]:
    """What one job asks of a node: CPUs, memory (MiB), GPUs, minutes, nodes (launcher fields)."""
    tasks = int(params.get("tasks_per_node") or 1)
    cpus = int(params.get("cpus_per_task") or 1) * tasks
    mem = params.get("mem_gb")
    return {"cpus": cpus, "mem_mb": None if mem is None else int(float(mem) * _MIB_PER_GB),
            "gpus": int(params.get("gpus_per_node") or 0), "time_min": float(params.get("timeout_min") or 0),
            "nodes": int(params.get("nodes") or 1)}


def unmet(req: Mapping[str, Any], part: Partition) -> list[str]:
    """The launcher fields of ``req`` that ``part``'s nodes cannot grant, each with both figures."""
    out = []
    if req["cpus"] > part.cpus:
        out.append(f"cpus_per_task x tasks_per_node = {req['cpus']} > {part.cpus} CPUs per node")
    if req["mem_mb"] is not None and req["mem_mb"] > part.mem_mb:
        out.append(f"mem_gb = {req['mem_mb'] / _MIB_PER_GB:g} > {part.mem_mb / _MIB_PER_GB:.1f} GB per node")
    if req["gpus"] > part.gpus:
        out.append(f"gpus_per_node = {req['gpus']} > {part.gpus} GPUs per node")
    if req["time_min"] > part.time_min:
        out.append(f"timeout_min = {req['time_min']:g} > the partition's {part.time_min:g} min time limit")
    if req["nodes"] > part.nodes:
        out.append(f"nodes = {req['nodes']} > {part.nodes} nodes")
    return out


def check_fits(params: Mapping[str, Any], parts: Sequence[Partition], what: str) -> None:
    """Refuse a job that no node of its partition (the one it names, else sinfo's default) can run."""
    req = request(params)
    wanted = params.get("partition")
    names = [n.strip() for n in str(wanted).split(",")] if wanted else None
    if names:
        candidates = [p for p in parts if p.name in names]
        if not candidates:
            raise SlurmRefused(f"{what}: partition {wanted!r} is not among sinfo's "
                               f"({', '.join(sorted({p.name for p in parts})) or 'none'}); set hydra.launcher.partition "
                               "(SLURM_ARGS='partition=...')")
    else:
        candidates = [p for p in parts if p.default] or list(parts)
    if not candidates:
        raise SlurmRefused(f"{what}: sinfo lists no partition")
    misses = [(p, unmet(req, p)) for p in candidates]
    if any(not m for _, m in misses):
        return
    where = ", ".join(dict.fromkeys(p.name for p in candidates))
    where = (f"partition {where!r}" if len({p.name for p in candidates}) == 1 else f"partitions {where}") + (
        "" if names else " (sinfo's default; name another with partition=...)")
    fix = "lower the request (hydra.launcher.<field>=..., SLURM_ARGS='<field>=...') or name a partition that has it"
    largest = Partition("largest", False, max(p.cpus for p in candidates), max(p.mem_mb for p in candidates),
                        max(p.gpus for p in candidates), max(p.time_min for p in candidates),
                        max(p.nodes for p in candidates))
    miss = unmet(req, largest)
    if miss:
        raise SlurmRefused(f"{what}: no node of {where} can run it ({'; '.join(miss)}): {fix}")
    part, miss = min(misses, key=lambda pm: len(pm[1]))
    raise SlurmRefused(f"{what}: no node of {where} has all it asks for (the closest, a node of {part.name!r}: "
                       f"{'; '.join(miss)}): {fix}")


def job_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """``export`` lines for the ``JOB_ENV`` variables set in ``environ`` (default: this process)."""
    environ = os.environ if environ is None else environ
    return [f"export {k}={shlex.quote(environ[k])}" for k in JOB_ENV if k in environ]


def launcher_config(sweep: Sweep, launcher: str, point: Point) -> dict[str, Any]:
    """The launcher's fields, resolved for ``point``'s model pair (and the sweep's hydra.* overrides)."""
    with Composer(sweep.path) as compose:
        cfg = compose([*point.overrides, f"hydra/launcher={launcher}", f"sweep.name={sweep.name}",
                       f"sweep.root={sweep.root.resolve()}", *sweep.hydra_overrides])
    return OmegaConf.to_container(cfg.hydra.launcher, resolve=True)


def is_slurm(params: Mapping[str, Any]) -> bool:
    return str(params.get("_target_", "")).endswith("SlurmLauncher")


def executor_for(params: Mapping[str, Any], environ: Mapping[str, str] | None = None):
    """A submitit executor with the launcher's fields, as hydra-submitit-launcher maps them."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    params = dict(params)
    params.pop("_target_", None)
    params["setup"] = [*(params.get("setup") or []), *job_env(environ)]
    ex = submitit.AutoExecutor(folder=params.pop("submitit_folder"), cluster="slurm",
                               slurm_max_num_timeout=int(params.pop("max_num_timeout", 0) or 0))
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    ex.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    return ex


def split(sweep: Sweep, jobs_per_pair: int) -> list[tuple[str, list[Point]]]:
    """(model pair, points) per job: each pair's unfinished points round-robin over at most N jobs."""
    store = sweep.store()
    todo: dict[str, list[Point]] = {}
    seen = set()
    for p in sweep.known():
        if p.hash in seen or sweep.folder(p, store).finished(p.hash, p.limit):
            continue
        seen.add(p.hash)
        todo.setdefault(p.choices.get("model", ""), []).append(p)
    out = []
    for model, points in todo.items():
        n = min(jobs_per_pair, len(points))
        out += [(model, points[i::n]) for i in range(n)]
    return out


def run_points(sweep_file: str, overrides: list[str], name: str, root: str, search: list[str],
               hashes: list[str]) -> dict[str, int]:
    """Inside a job: run the sweep's points ``hashes`` here (the pair loads once); status counts."""
    from mtad.run.sweep.execute import run
    from mtad.run.sweep.plan import load

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    sweep = load(sweep_file, overrides, name=name, root=root, search=search)
    mine = [p for p in sweep.known() if p.hash in set(hashes)]
    report = run(sweep, points=mine, progress=False)
    counts: dict[str, int] = {}
    for status in report.statuses.values():
        counts[status] = counts.get(status, 0) + 1
    log.info("job done: %s", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return counts


class PointsJob(Checkpointable or object):
    """A job's callable; on a time limit submitit requeues it with the same points (they resume)."""

    def __call__(self, *args: Any) -> dict[str, int]:
        return run_points(*args)


@dataclass
class Submitted:
    job: Any  # submitit.slurm.slurm.SlurmJob
    model: str
    points: list[Point]
    outcome: str | None = None  # None while waiting, else one line
    ok: bool = False
    gone_since: float | None = None

    def describe(self) -> str:
        return f"job {self.job.job_id} (pair {self.model}, {len(self.points)} points)"


def _queue(job_ids: Sequence[str]) -> dict[str, tuple[str, str]] | None:
    """{job id: (state, reason)} of those still in ``squeue``; None when squeue fails."""
    if not job_ids:
        return {}
    try:
        out = _cmd(["squeue", "--noheader", "-r", "-j", ",".join(sorted({j.split("_")[0] for j in job_ids})),
                    "-o", "%i|%T|%r"])
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        # squeue exits 1 for job ids it no longer knows
        return {} if "Invalid job id" in (out.stderr or "") else None
    rows = {}
    for line in out.stdout.splitlines():
        jid, state, reason = (line.split("|") + ["", ""])[:3]
        rows[jid.strip()] = (state.strip(), reason.strip())
    return rows


def _finish(s: Submitted) -> None:
    """Set ``s.outcome`` from the job's result file, else its state in accounting."""
    job = s.job
    if job.paths.result_pickle.exists():
        try:
            counts = job.result()
            s.ok = True
            s.outcome = f"{s.describe()}: finished ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})"
        except Exception as e:  # the callable raised: submitit keeps the traceback in the log
            last = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            s.outcome = f"{s.describe()}: failed: {last[-1].strip() if last else type(e).__name__} (log: {job.paths.stdout})"
        return
    state = job.watcher.get_state(job.job_id, mode="force")
    s.outcome = f"{s.describe()}: {state} before finishing its points (log: {job.paths.stdout})"


def wait(submitted: Sequence[Submitted], poll_s: float | None = None) -> None:
    """Wait until every job has an outcome; cancel those that can never start."""
    from submitit.slurm.slurm import SlurmJob

    start = time.time()
    while True:
        waiting = [s for s in submitted if s.outcome is None]
        if not waiting:
            return
        SlurmJob.watcher.update()  # one sacct call for every job
        queue = _queue([s.job.job_id for s in waiting])
        now = time.time()
        for s in waiting:
            row = queue.get(s.job.job_id) if queue is not None else None
            ended = s.job.paths.result_pickle.exists() or s.job.watcher.is_done(s.job.job_id, mode="cache")
            # a cancelled job's processes run on until Slurm kills them (KillWait): its points'
            # files are final once it has left the queue
            if ended and (row is None or row[0] not in ("COMPLETING", "RUNNING")):
                _finish(s)
                log.info("%s", s.outcome)
                continue
            if queue is None or ended:
                continue
            if row is None:
                s.gone_since = s.gone_since or now
                if now - s.gone_since > GONE_AFTER_S:
                    s.outcome = (f"{s.describe()}: left the queue {GONE_AFTER_S:.0f} s ago and accounting "
                                 f"(sacct) still says {s.job.watcher.get_state(s.job.job_id, mode='cache')}; "
                                 f"not waited for (log: {s.job.paths.stdout})")
                    log.warning("%s", s.outcome)
                continue
            s.gone_since = None
            state, reason = row
            if state == "PENDING" and reason in NEVER_RUNS:
                subprocess.run(["scancel", s.job.job_id], capture_output=True)
                s.outcome = f"{s.describe()}: pending with reason {reason}, which does not resolve by waiting: cancelled"
                log.warning("%s", s.outcome)
        interval = poll_s if poll_s is not None else min(60.0, max(5.0, (now - start) / 10))
        if any(s.outcome is None for s in submitted):
            time.sleep(interval)


def launch(sweep: Sweep, launcher: str, jobs_per_pair: int = 1, environ: Mapping[str, str] | None = None,
           poll_s: float | None = None) -> int:
    """Submit the sweep's unfinished points (one array per pair), wait for them; 0 when every job finished."""
    if Checkpointable is None:
        raise SlurmRefused("the mtad_slurm launcher needs submitit: pip install -e '.[cluster]'")
    plan = split(sweep, jobs_per_pair)
    if not plan:
        log.info("sweep %s: every point is finished; nothing submitted", sweep.name)
        return 0
    check_accounting()
    parts = partitions()
    by_model: dict[str, tuple[dict, list[tuple[str, list[Point]]]]] = {}
    for model, points in plan:
        if model not in by_model:
            params = launcher_config(sweep, launcher, points[0])
            check_fits(params, parts, f"the job of model pair {model} ({launcher})")
            by_model[model] = (params, [])
        by_model[model][1].append((model, points))
    search = [str(d.resolve()) for d in sweep.search]
    args = (str(sweep.path.resolve()), list(sweep.base_overrides), sweep.name, str(sweep.root.resolve()), search)
    submitted: list[Submitted] = []
    for model, (params, jobs) in by_model.items():
        ex = executor_for(params, environ)
        array = ex.map_array(PointsJob(), *zip(*[(*args, [p.hash for p in pts]) for _, pts in jobs]))
        for job, (_, pts) in zip(array, jobs):
            submitted.append(Submitted(job, model, pts))
        log.info("pair %s: %d points in %d jobs (array %s; %s CPUs, %s GB, %s GPUs each): %s", model,
                 sum(len(p) for _, p in jobs), len(jobs), array[0].job_id.split("_")[0],
                 params.get("cpus_per_task"), params.get("mem_gb"), params.get("gpus_per_node") or 0,
                 "; ".join(f"{j.job_id}: {','.join(p.hash for p in pts)}" for j, (_, pts) in zip(array, jobs)))
    try:
        wait(submitted, poll_s)
    except KeyboardInterrupt:
        print(f"interrupted: the {sum(s.outcome is None for s in submitted)} jobs still queued go on "
              "(squeue); rerun the same command to resume what they leave unfinished")
        return 130
    failed = [s for s in submitted if not s.ok]
    for s in failed:
        print(s.outcome)
    return 1 if failed else 0


__all__ = ["JOB_ENV", "Partition", "SlurmRefused", "check_accounting", "check_fits", "job_env", "launch",
           "partitions", "split"]

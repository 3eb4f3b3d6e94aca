"""Running a sweep's points here, one after the other, each under its folder's lock.

A point is computed once: a folder whose ``summary.json`` covers the requested examples and
whose ``samples.jsonl`` passes the self-check is cached; an interrupted point resumes at the
(example, turn) level; a point whose folder another process holds is reported ``busy`` (or
waited for). A point that a folder elsewhere under the sweep's ``search`` holds (another
sweep's) is run in that folder, under that folder's lock: read when it covers the requested
examples, resumed in place when it does not. ``sweep.json`` lists the points of the current
definition and their folders (relative to the sweep's folder).
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mtad.core.io import UnsafeResultsFile
from mtad.run.results import (
    BUSY,
    CACHED,
    DONE,
    ERROR_FILE,
    FAILED,
    INDEX_FILE,
    SKIPPED,
    SKIPPED_FILE,
    UNKNOWN,
    FolderBusy,
    PointFolder,
    now_utc,
    shown_path,
    write_json_atomic,
)
from mtad.run.sweep.plan import Sweep, check_task, find_cause

log = logging.getLogger(__name__)

#: Runs a checked point (``mtad.run.evaluate.Checked``) into a folder (``mtad.run.evaluate.run``).
Evaluate = Callable[[Any, Path], Any]


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
    folder: PointFolder,
    overrides: Sequence[str] = (),
    choices: dict[str, str] | None = None,
    evaluate: Evaluate | None = None,
    wait: bool = False,
) -> str:
    """Run one point into ``folder`` unless it is finished; returns its status.

    TaskUnavailable and model-load errors write ``skipped.json``; any other exception writes
    ``error.json`` and is re-raised. KeyboardInterrupt passes through untouched (resumable).
    Another process holding the folder: ``busy`` (with ``wait``, wait for it).
    """
    from mtad.run import evaluate as _evaluate
    from mtad.tasks.base import TaskUnavailable

    if evaluate is None:
        def evaluate(c, out):
            return _evaluate.run(c, out, overrides, choices)

    cfg = cfg.copy()
    OmegaConf.set_struct(cfg, False)
    cfg.output_dir = str(folder.path)
    point = _evaluate.check(cfg)  # checked and its identity read once, passed down to evaluate
    h, limit = point.hash, point.limit
    try:
        with folder.lock(wait):
            folder.claim(point.identity, overrides, choices)  # adopts a legacy folder's metadata
            if folder.finished(h, limit):
                return CACHED
            for stale in (SKIPPED_FILE, ERROR_FILE):
                folder.file(stale).unlink(missing_ok=True)
            try:
                available, reason, _, _ = check_task(cfg)
                if not available:
                    folder.write_reason(SKIPPED_FILE, h, reason, kind="task_unavailable")
                    log.warning("skipped %s: %s", folder.path.name, reason)
                    return SKIPPED
                evaluate(point, folder.path)
            except Exception as e:
                cause = find_cause(e, TaskUnavailable)
                model_reason = _model_load_error(e, cfg)
                if cause is not None or model_reason is not None:
                    reason = f"TaskUnavailable: {cause}" if cause is not None else model_reason
                    kind = "task_unavailable" if cause is not None else "model_unavailable"
                    folder.write_reason(SKIPPED_FILE, h, reason, kind=kind)
                    log.warning("skipped %s: %s", folder.path.name, reason)
                    return SKIPPED
                folder.write_reason(ERROR_FILE, h, f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
                raise
    except FolderBusy as e:
        if folder.finished(h, limit):
            return CACHED
        log.warning("%s", e)
        return BUSY
    return DONE


@dataclass
class Report:
    statuses: dict[str, str] = field(default_factory=dict)  # label -> status

    def count(self, status: str) -> int:
        return sum(1 for s in self.statuses.values() if s == status)

    @property
    def ok(self) -> bool:
        return self.count(FAILED) == 0 and self.count(BUSY) == 0


def write_index(sweep: Sweep) -> None:
    """``<root>/<name>/sweep.json``: the points of this definition, their folders and status."""
    store = sweep.store()
    rows = []
    for p in sweep.points:
        row: dict[str, Any] = {"overrides": p.overrides, "hash": p.hash, "choices": p.choices,
                               "limit": p.limit}
        if p.hash is None:
            row.update(status=UNKNOWN, reason=p.problem)
        else:
            folder = sweep.folder(p, store)
            row["dir"] = os.path.relpath(folder.path, sweep.dir)
            row["status"], row["reason"] = folder.status(p.hash, p.limit)
        rows.append(row)
    write_json_atomic(
        sweep.dir / INDEX_FILE,
        {
            "name": sweep.name,
            "file": shown_path(sweep.path),
            "overrides": sweep.base_overrides,
            "examples": sweep.meta.get("examples", "all"),  # what a rendering shows (plan.EXAMPLES_POLICIES)
            "render": sweep.render,  # how (plan.RENDER_OPTIONS)
            "updated_utc": now_utc(),
            "points": rows,
        },
    )


def run(
    sweep: Sweep,
    *,
    fail_fast: bool = False,
    progress: bool = True,
    evaluate: Evaluate | None = None,
    wait: bool = False,
    points: Sequence | None = None,
) -> Report:
    """Run the known points of ``sweep`` (or ``points``, a subset) here, one after the other."""
    from mtad.run.progress import Progress

    report = Report()
    for p in sweep.points:
        if p.hash is None and points is None:
            report.statuses[p.label] = UNKNOWN
            log.warning("not run (%s): %s", p.label, p.problem)
    write_index(sweep)
    todo = list(points) if points is not None else sweep.known()
    bar = Progress(len(todo), f"sweep {sweep.name}", "pt", log, enabled=progress)
    try:
        for p in todo:
            bar.note(p.label[:60])
            try:
                folder = sweep.folder(p)
                status = run_point(p.cfg, folder, p.overrides, p.choices, evaluate=evaluate, wait=wait)
            except UnsafeResultsFile:
                raise  # a link or special file in a results folder: the sweep is refused in one line
            except Exception as e:
                status = FAILED
                log.error("point %s (%s) failed: %s", p.hash, p.label, e)
                if fail_fast:
                    raise
            finally:
                write_index(sweep)
            report.statuses[p.label] = status
            bar.update(
                1,
                point=p.label,
                done=report.count(DONE) + report.count(CACHED),
                skipped=report.count(SKIPPED),
                busy=report.count(BUSY),
                failed=report.count(FAILED),
            )
    finally:
        bar.close()
    return report


def unfinished(sweep: Sweep) -> list[tuple[Any, str, str | None]]:
    """(point, status, detail) of the sweep's runnable points that are neither done nor skipped."""
    store = sweep.store()
    out = []
    for p in sweep.known():
        status, detail = sweep.folder(p, store).status(p.hash, p.limit)
        if status not in (DONE, SKIPPED):
            out.append((p, status, detail))
    return out

"""Rescore stored outputs: recompute every record's score from its text, never regenerating.

    python -m mtad.analysis.rescore <run dir | sweep dir> [--scorer-version new|old|<version>] [key=value ...]

For each point folder (a run directory, or every point of a sweep or multirun directory),
the task and its scorer are rebuilt from ``conf/task/<name>.yaml`` by the task's name and
data identity the folder describes (``mtad.run.results.described``), with this command's
``key=value`` overrides (e.g. ``task.scorer.isolation=rlimits``, ``task.judge.url=...``):
the sandbox, its limits, judge endpoints and data files come from this invocation and the
project's defaults, never from the folder (a stored value that differs is reported in one
line). The task's examples are loaded and matched to the records by ``example_id``, and each example's last-turn record is scored as ``mtad.run.evaluate`` does:
on the text, or on the list of the turns' texts for a multi-turn task. The records' score
fields (``score``, ``scorer``, ``scorer_version``) and the summary's ``score`` block are
rewritten atomically, under the folder's lock; nothing else changes, so a point keeps its
identity and its generation results.

``--scorer-version``: ``new`` (default, the scorer's current version), ``old`` (the one
before it, e.g. to compare numbers with an earlier report) or a version string the
scorer lists in ``versions``.

The results-folder format belongs to ``mtad.run.results``; this module only reads and writes
through it (:func:`_read_point` and :func:`_write_point`).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from mtad.core.records import SCORE_FIELDS  # noqa: F401  (the record fields this module rewrites)
from mtad.run.config import ConfigError, check_scorer
from mtad.run.results import (
    SAMPLES_FILE,
    SUMMARY_FILE,
    BadResultsFile,
    PointFolder,
    point_dirs,
    read_json,
    read_jsonl,
    read_summary,
    rewrite_jsonl,
    write_json_atomic,
)
from mtad.run.results.described import describe, rebuild, report
from mtad.run.results.targets import UntrustedConfig

log = logging.getLogger(__name__)



# ------------------------------------------------------------------ the folder format
def _read_point(path: Path, overrides: Sequence[str] = ()) -> tuple[Any, dict, list[dict]]:
    """(rebuilt config, summary, records) of a finished point folder (``_stored_config``)."""
    cfg, summary = _stored_config(path, overrides)
    return cfg, summary, read_jsonl(path / SAMPLES_FILE)


def _stored_config(path: Path, overrides: Sequence[str] = ()) -> tuple[Any, dict]:
    """(the task config this invocation scores with, summary) of a finished point folder:
    ``conf/task/<name>`` with the folder's described data identity and ``overrides``
    (``mtad.run.results.described``); UntrustedConfig or ConfigError in one line, before
    anything is imported or built, when the folder is more than data or names no task."""
    summary = read_summary(path / SUMMARY_FILE)
    if summary is None:
        raise FileNotFoundError(f"{path} has no {SUMMARY_FILE}: not a finished run")
    described = describe(path)
    rebuilt = rebuild(described, overrides, sections=("task",))
    check_scorer(rebuilt.cfg)  # e.g. bubblewrap missing: one line, before anything is built
    report(rebuilt, path)
    return rebuilt.cfg, summary


def _write_point(path: Path, summary: dict, records: list[dict]) -> None:
    rewrite_jsonl(path / SAMPLES_FILE, records)
    write_json_atomic(path / SUMMARY_FILE, summary)


# ------------------------------------------------------------------ scoring
def resolve_version(scorer_cfg: dict, wanted: str | None, where: object = "conf") -> str | None:
    """The version string for ``new`` / ``old`` / an explicit version; None keeps the config's.
    ``scorer_cfg`` is a scorer node of ``conf/`` (its ``_target_`` a project scorer)."""
    if wanted is None:
        return None
    cls = get_class(scorer_cfg["_target_"])
    versions = tuple(getattr(cls, "versions", (cls.version,)))
    current = str(cls.version)
    if wanted == "new":
        return current
    if wanted == "old":
        i = versions.index(current)
        if i == 0:
            raise ValueError(f"{cls.__name__} has no version older than {current}")
        return versions[i - 1]
    if wanted not in versions:
        raise ValueError(f"{cls.__name__} has versions {versions}, not {wanted!r}")
    return wanted


def build_scoring(cfg: Any, scorer_version: str | None = None, where: object = "conf"):
    """(task, scorer, examples) built from a rebuilt config (``_stored_config``: ``conf/``
    members, never a folder's own settings)."""
    task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
    scorer_cfg = task_cfg.pop("scorer", None)
    task = instantiate(task_cfg)
    if scorer_cfg:
        version = resolve_version(scorer_cfg, scorer_version, where)
        takes = "version" in inspect.signature(get_class(scorer_cfg["_target_"])).parameters
        if version is not None and takes:  # a scorer with one version takes none
            scorer_cfg["version"] = version
        scorer = instantiate(scorer_cfg)
    else:
        scorer = getattr(task, "scorer", None)
    if scorer is None:
        raise ConfigError(f"{where}: task {task_cfg.get('name')} has no scorer here (an MT-Bench judge "
                          "runs only when this command names it: task.judge.url=... task.judge.model=...)")
    examples = task.load()
    if cfg.get("limit") is not None:
        examples = examples[: int(cfg.limit)]
    return task, scorer, examples


def rescore_records(task, scorer, examples, records: list[dict]) -> list[float | None]:
    """Rewrite the score fields of ``records`` in place; the scores of the covered examples."""
    by_id = {ex.id: ex for ex in examples}
    turns: dict[str, dict[int, dict]] = {}
    for r in records:
        turns.setdefault(r["example_id"], {})[int(r["turn"])] = r
    scores = []
    for example_id, by_turn in turns.items():
        ex = by_id.get(example_id)
        if ex is None:
            continue  # outside the run's examples: left as it is
        n = task.num_turns(ex)
        last = by_turn.get(n - 1)
        if last is None:
            continue  # unfinished example
        answer = [by_turn[t]["text"] for t in range(n)] if n > 1 else last["text"]
        value = scorer.score(ex, answer)
        last.update(scorer.record_fields(value))
        scores.append(value)
    return scores


def rescore_point(path: str | Path, scorer_version: str | None = None,
                  overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Rescore one finished point folder; returns its new ``score`` block."""
    path = Path(path)
    folder = PointFolder(path)
    _stored_config(path, overrides)  # refused before the lock file is written
    with folder.lock():
        cfg, summary, records = _read_point(path, overrides)
        task, scorer, examples = build_scoring(cfg, scorer_version, path)
        scores = rescore_records(task, scorer, examples, records)
        summary["score"] = scorer.aggregate([s for s in scores if s is not None])
        _write_point(path, summary, records)
    return summary["score"]


def rescore(root: str | Path, scorer_version: str | None = None,
            overrides: Sequence[str] = ()) -> dict[Path, dict]:
    """Rescore a run folder or every finished point under a sweep folder."""
    out = {}
    for path in point_dirs(root, only_current=False):
        if read_json(path / SUMMARY_FILE) is None:
            log.info("%s: not finished, skipped", path)
            continue
        out[path] = rescore_point(path, scorer_version, overrides)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mtad.analysis.rescore", description=__doc__.split("\n")[0])
    parser.add_argument("root", help="a run folder, or a sweep / multirun folder of points")
    parser.add_argument("--scorer-version", default=None,
                        help="new (current, the default), old, or a version the scorer lists")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="this machine's settings, e.g. task.scorer.isolation=rlimits, task.data_dir=DIR, "
                             "task.judge.url=URL task.judge.model=NAME (never taken from the folder)")
    args = parser.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        done = rescore(args.root, args.scorer_version or "new", args.overrides)
    except (UntrustedConfig, BadResultsFile, ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not done:
        print(f"no finished points under {args.root}", file=sys.stderr)
        return 1
    for path, block in done.items():
        print(f"{path}: {block['metric']} v{block['version']} = {block['value']:.4f} (n={block['n']})")
    return 0


def cli() -> None:
    """The console script (``[project.scripts]`` in pyproject.toml)."""
    raise SystemExit(main())


if __name__ == "__main__":
    cli()

"""Rescore stored outputs: recompute every record's score from its text, never regenerating.

    python -m mtad.analysis.rescore <run dir | sweep dir> [--scorer-version new|old|<version>]

For each point folder (a run directory, or every point of a sweep or multirun directory),
the task and its scorer are rebuilt from the stored resolved config (``config["task"]``,
its ``scorer`` entry), the task's examples are loaded and matched to the records by
``example_id``, and each example's last-turn record is scored as ``mtad.run.evaluate`` does:
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
import logging
import sys
from pathlib import Path
from typing import Any

from hydra.utils import instantiate

from mtad.core.records import SCORE_FIELDS  # noqa: F401  (the record fields this module rewrites)
from mtad.run.results import (
    CONFIG_FILE,
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
from mtad.run.results.targets import UntrustedConfig, stored_object, trusted_config

log = logging.getLogger(__name__)



# ------------------------------------------------------------------ the folder format
def _read_point(path: Path) -> tuple[dict, dict, list[dict]]:
    """(resolved config, summary, records) of a finished point folder; UntrustedConfig (before
    anything is imported or built) when the config names code outside the project's classes."""
    config, summary = _stored_config(path)
    return config, summary, read_jsonl(path / SAMPLES_FILE)


def _stored_config(path: Path) -> tuple[dict, dict]:
    """(checked resolved config, summary) of a finished point folder."""
    summary = read_summary(path / SUMMARY_FILE)
    if summary is None:
        raise FileNotFoundError(f"{path} has no {SUMMARY_FILE}: not a finished run")
    config = read_json(path / CONFIG_FILE) or summary.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("task"), dict):
        raise FileNotFoundError(f"{path} holds no resolved config with a task ({CONFIG_FILE} or summary)")
    config = trusted_config(config, path)
    trusted_config(config["task"], path, resolve=True, place="task")  # the classes rescoring builds
    return config, summary


def _write_point(path: Path, summary: dict, records: list[dict]) -> None:
    rewrite_jsonl(path / SAMPLES_FILE, records)
    write_json_atomic(path / SUMMARY_FILE, summary)


# ------------------------------------------------------------------ scoring
def resolve_version(scorer_cfg: dict, wanted: str | None, where: object = "stored config") -> str | None:
    """The version string for ``new`` / ``old`` / an explicit version; None keeps the config's."""
    if wanted is None:
        return None
    cls = stored_object(scorer_cfg["_target_"], "task.scorer", where)
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


def build_scoring(config: dict, scorer_version: str | None = None, where: object = "stored config"):
    """(task, scorer, examples) rebuilt from a stored resolved config; only the project's own
    task and scorer classes are built (``mtad.run.results.targets``)."""
    config = trusted_config(config, where)
    task_cfg = dict(trusted_config(config["task"], where, resolve=True, place="task"))
    scorer_cfg = task_cfg.pop("scorer", None)
    task = instantiate(task_cfg)
    if scorer_cfg:
        scorer_cfg = dict(scorer_cfg)
        version = resolve_version(scorer_cfg, scorer_version, where)
        if version is not None:
            scorer_cfg["version"] = version
        scorer = instantiate(scorer_cfg)
    else:
        scorer = getattr(task, "scorer", None)
    if scorer is None:
        raise ValueError(f"task {task_cfg.get('_target_')} has no scorer")
    examples = task.load()
    if config.get("limit") is not None:
        examples = examples[: int(config["limit"])]
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


def rescore_point(path: str | Path, scorer_version: str | None = None) -> dict[str, Any]:
    """Rescore one finished point folder; returns its new ``score`` block."""
    path = Path(path)
    folder = PointFolder(path)
    _stored_config(path)  # refused before the lock file is written
    with folder.lock():
        config, summary, records = _read_point(path)
        task, scorer, examples = build_scoring(config, scorer_version, path)
        scores = rescore_records(task, scorer, examples, records)
        summary["score"] = scorer.aggregate([s for s in scores if s is not None])
        _write_point(path, summary, records)
    return summary["score"]


def rescore(root: str | Path, scorer_version: str | None = None) -> dict[Path, dict]:
    """Rescore a run folder or every finished point under a sweep folder."""
    out = {}
    for path in point_dirs(root, only_current=False):
        if read_json(path / SUMMARY_FILE) is None:
            log.info("%s: not finished, skipped", path)
            continue
        out[path] = rescore_point(path, scorer_version)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mtad.analysis.rescore", description=__doc__.split("\n")[0])
    parser.add_argument("root", help="a run folder, or a sweep / multirun folder of points")
    parser.add_argument("--scorer-version", default=None,
                        help="new (current, the default), old, or a version the scorer lists")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        done = rescore(args.root, args.scorer_version or "new")
    except (UntrustedConfig, BadResultsFile) as e:
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

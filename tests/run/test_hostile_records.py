"""Records that parse badly or hold wrong contents are repaired like a torn line (one warning,
recomputed), whatever makes them fail; summaries and point files with wrong types are refused
in one line naming the file; a long line is repaired in memory below its own size."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtad.run.results import BadResultsFile, NotAPointFile, PointFolder, read_json, scan_jsonl

ROOT = Path(__file__).resolve().parents[2]
TINY = ["+experiment=debug", "limit=2", "max_new_tokens=4", "perplexity=false", "~task.scorer", "decoder=spd"]


def _replace(record: dict, **fields) -> str:
    return json.dumps({**record, **fields})


#: label -> the second line of samples.jsonl made from its first record
HOSTILE_LINES = {
    "deep_nesting": lambda r: "[" * 200_000,  # RecursionError in the parser
    "long_integer": lambda r: _replace(r, steps=0).replace('"steps": 0', '"steps": ' + "9" * 5000),
    "nan": lambda r: _replace(r).replace(f'"wall_time": {json.dumps(r["wall_time"])}', '"wall_time": NaN'),
    "infinity": lambda r: _replace(r).replace(f'"wall_time": {json.dumps(r["wall_time"])}', '"wall_time": -Infinity'),
    "float_overflow": lambda r: _replace(r).replace(f'"wall_time": {json.dumps(r["wall_time"])}', '"wall_time": 1e400'),
    "huge_integer": lambda r: _replace(r, new_tokens=10**400),
    "wrong_elements": lambda r: _replace(r, accepted_per_step=["a"]),
    "float_ids": lambda r: _replace(r, output_ids=[1.5]),
    "bool_count": lambda r: _replace(r, steps=True),
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    from mtad.run.cli import compose_config
    from mtad.run.evaluate import run

    out = tmp_path_factory.mktemp("finished") / "run"
    run(compose_config(TINY), out)
    return out


@pytest.mark.parametrize("label", HOSTILE_LINES)
def test_a_hostile_record_line_is_recomputed_with_one_warning(tmp_path, finished, label, caplog):
    from mtad.run.cli import compose_config
    from mtad.run.evaluate import run

    out = tmp_path / "run"
    shutil.copytree(finished, out)
    lines = (out / "samples.jsonl").read_text().splitlines()
    first, second = json.loads(lines[0]), json.loads(lines[1])
    (out / "samples.jsonl").write_text(lines[0] + "\n" + HOSTILE_LINES[label](second) + "\n")
    (out / "summary.json").unlink()
    with caplog.at_level(logging.WARNING, logger="mtad.run.results"):
        summary = run(compose_config(TINY), out)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("repaired"), warnings
    assert summary["metrics"]["examples"] == 2
    again = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["output_ids"] for r in again] == [first["output_ids"], second["output_ids"]]


@pytest.mark.parametrize("summary,field", [
    ({"limit": "x"}, "limit"), ({"config": [1, 2]}, "config"), ({"records": 10**400}, "records"),
    ({"metrics": {"examples": "2"}}, "metrics.examples"), ({"score": {"value": "high"}}, "score.value"),
])
def test_a_summary_with_wrong_types_is_refused_naming_the_file(tmp_path, finished, summary, field):
    from mtad.run.results import load_point

    out = tmp_path / "run"
    shutil.copytree(finished, out)
    stored = {**read_json(out / "summary.json"), **summary}
    if field.startswith("score."):
        stored["score"] = {"metric": "m", "version": "1", "n": 1, **summary["score"]}
    (out / "summary.json").write_text(json.dumps(stored))
    folder = PointFolder(out)
    for read in (lambda: folder.status(stored["identity_hash"], 2), lambda: load_point(out),
                 folder.summary_limit):
        with pytest.raises(BadResultsFile) as e:
            read()
        assert str(out / "summary.json") in str(e.value) and field in str(e.value)
        assert "\n" not in str(e.value)


def test_a_deeply_nested_point_file_is_not_a_point_file(tmp_path):
    (tmp_path / "point.json").write_text("[" * 200_000)
    with pytest.raises(NotAPointFile, match="is not a point file"):
        PointFolder(tmp_path).point()
    (tmp_path / "point.json").write_text(json.dumps(
        {"format": 2, "identity_hash": "abc", "identity": {}, "overrides": [1, 2]}))
    with pytest.raises(NotAPointFile):
        PointFolder(tmp_path).point()


_MEMORY = """
import sys, tracemalloc
from mtad.run.results import PointFolder
folder = PointFolder(sys.argv[1])
tracemalloc.start()
check = folder.check(repair=True)
peak = tracemalloc.get_traced_memory()[1]
print(len(check.records), int(check.clean), peak >> 20)
"""


@pytest.mark.slow
@pytest.mark.parametrize("size_mb", [12, 300])
def test_repairing_a_long_line_costs_less_memory_than_the_line(tmp_path, finished, size_mb):
    """A line of ``size_mb`` MB (under and over ``MAX_LINE_BYTES``) between two records: the
    repair keeps the records, and its peak of Python allocations (tracemalloc) stays within
    about twice the line under the limit and far below the line over it."""
    lines = (finished / "samples.jsonl").read_text().splitlines()
    with open(tmp_path / "samples.jsonl", "w") as f:
        f.write(lines[0] + "\n" + '{"text": "' + "x" * (size_mb << 20) + '"}\n' + lines[1] + "\n")
    proc = subprocess.run([sys.executable, "-c", _MEMORY, str(tmp_path)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kept, clean, peak_mb = map(int, proc.stdout.split())
    assert kept == 2 and not clean, proc.stdout
    assert peak_mb < (2.5 * size_mb if size_mb < 16 else 40), proc.stdout
    assert len(scan_jsonl(tmp_path / "samples.jsonl").records) == 2

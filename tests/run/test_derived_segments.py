"""Every committed record names the segment that made it: its run's own, or one derived from the
repository's history (``mtad.run.results.derive_segments``); adding the ``segment`` field is the
only change ever made to a committed record."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mtad.run.results.derive_segments import (
    UNKNOWN,
    main,
    plan_file,
    provenance_counts,
    read_history,
    samples_files,
    unchanged_but_segment,
    with_segment,
    without_segment,
)
from mtad.run.results.segments import SEGMENTS_FILE, describe_provenance

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
HAS_HISTORY = shutil.which("git") is not None and (ROOT / ".git").exists()


def _segments(folder: Path) -> dict[str, dict]:
    path = folder / SEGMENTS_FILE
    if not path.exists():
        return {}
    return {s["segment"]: s for s in map(json.loads, path.read_text().splitlines())}


def test_every_committed_record_has_a_segment_of_its_folder():
    files = samples_files([RESULTS])
    assert files, "no committed samples.jsonl"
    missing = []
    for path in files:
        known = _segments(path.parent)
        for i, line in enumerate(path.read_text().splitlines()):
            if json.loads(line).get("segment") not in known:
                missing.append(f"{path.relative_to(ROOT)}:{i + 1}")
    assert not missing, f"{len(missing)} records name no line of their segments.jsonl, e.g. {missing[:3]}"


@pytest.mark.skipif(not HAS_HISTORY, reason="needs the repository's git history (derived segments come from it)")
def test_committed_derived_segments_are_what_the_history_gives_and_records_changed_only_by_it():
    """The derivation run again over the history gives the committed segments, and every
    committed record with its segment field taken out is byte for byte a line the history
    added (``--check``: the only rewrite of committed records is the segment field)."""
    hist = read_history(ROOT)
    cache: dict = {}
    for path in samples_files([RESULTS]):
        plan = plan_file(path, ROOT, hist, cache)
        assert plan.new_lines == plan.lines, f"{path}: segments differ from what the history gives"
        for line in plan.lines:
            assert hist.exact.get(_digest_without_segment(line)) is not None, \
                f"{path}: a record that, without its segment, is no line the history ever added"
    assert main(["--check", "--repo", str(ROOT), str(RESULTS)]) == 0


def _digest_without_segment(line: str) -> str:
    import hashlib

    return hashlib.sha256(without_segment(line).encode()).hexdigest()


def test_the_segment_field_is_appended_and_nothing_else_changes():
    old = '{"example_id": "a-1", "turn": 0, "text": "x, \\"segment\\": \\"y\\"}"}'
    new = with_segment(old, "d123456789")
    assert new == old[:-1] + ', "segment": "d123456789"}'
    assert without_segment(new) == old and without_segment(old) == old
    assert unchanged_but_segment(old, new)
    assert not unchanged_but_segment(old, new.replace('"a-1"', '"a-2"'))
    with pytest.raises(ValueError, match="not a record line"):
        with_segment("[1, 2]", "d1")


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


def _rec(i: int, wall: float) -> str:
    return json.dumps({"example_id": f"e-{i}", "turn": 0, "index": i, "output_ids": [i, 7],
                       "wall_time": wall, "prefill_time": 0.1, "target_forward_time": 0.2})


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_derived_from_the_commit_that_added_each_record_and_unknown_where_nothing_recorded(tmp_path):
    """Two commits add records to one folder: the first with a summary beside them (its
    provenance becomes the segment's), the second without one (unknown, with the later summary
    as a hint only); a record copied into another folder keeps its origin."""
    repo = tmp_path / "repo"
    pt = repo / "results" / "s" / "p1"
    pt.mkdir(parents=True)
    _git(repo, "init", "-q")
    prov = {"time_utc": "2026-01-01T00:00:00+00:00", "git": {"commit": "ab" * 20, "dirty": True},
            "packages": {"torch": "2.0"}, "device": {"cpu_count": 2}, "seed": 42, "torch_threads": 1}
    (pt / "samples.jsonl").write_text(_rec(0, 1.5) + "\n")
    (pt / "summary.json").write_text(json.dumps({"provenance": prov}))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    (pt / "samples.jsonl").write_text(_rec(0, 1.5) + "\n" + _rec(1, 2.5) + "\n")
    (pt / "summary.json").unlink()
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "second, no summary")
    copy = repo / "results" / "s" / "p2"
    copy.mkdir()
    (copy / "samples.jsonl").write_text(_rec(1, 2.5) + "\n")
    (pt / "summary.json").write_text(json.dumps({"provenance": {**prov, "seed": 43}}))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "copy")
    before = (pt / "samples.jsonl").read_text().splitlines()

    assert main(["--repo", str(repo), str(repo / "results")]) == 0
    after = (pt / "samples.jsonl").read_text().splitlines()
    assert all(unchanged_but_segment(a, b) for a, b in zip(before, after))
    segs = _segments(pt)
    first, second = (segs[json.loads(line)["segment"]] for line in after)
    assert first["git"] == prov["git"] and first["device"] == prov["device"] and first["seed"] == 42
    assert first["derived"]["provenance_from"].endswith(":results/s/p1/summary.json")
    assert describe_provenance(first).startswith("derived: abababab (dirty) on machine not recorded")
    assert all(second[k] == UNKNOWN for k in ("git", "device", "packages", "torch_threads", "seed"))
    assert second["derived"]["provenance_from"] == UNKNOWN
    assert "next_summary" in second["derived"] and second["derived"]["added_as"] == "results/s/p1/samples.jsonl"
    copied = _segments(copy)[json.loads((copy / "samples.jsonl").read_text())["segment"]]
    assert copied["derived"]["added_in"] == second["derived"]["added_in"]
    assert copied["derived"]["added_as"] == "results/s/p1/samples.jsonl"
    counts = provenance_counts([repo / "results"])
    assert counts == {"records": 3, "recorded": 0, "derived": 0, "derived_partly_unknown": 1, "unknown": 2}
    # written once: a second run changes nothing, and --check agrees
    snapshot = {p: p.read_bytes() for p in repo.rglob("*.jsonl")}
    assert main(["--repo", str(repo), str(repo / "results")]) == 0
    assert {p: p.read_bytes() for p in repo.rglob("*.jsonl")} == snapshot
    assert main(["--check", "--repo", str(repo), str(repo / "results")]) == 0


def test_the_docs_state_the_provenance_counts_of_the_committed_records():
    """docs/results.md's counts of records by provenance are the committed records' own."""
    text = (ROOT / "docs" / "results.md").read_text()
    m = re.search(r"<!-- provenance-counts -->(.*?)<!-- /provenance-counts -->", text, re.S)
    assert m, "docs/results.md has no provenance-counts block"
    c = provenance_counts([RESULTS])
    stated = {k: int(v.replace(",", "")) for v, k in re.findall(r"\*\*([\d,]+)\*\* (\w+)", m.group(1))}
    assert stated == c, f"docs/results.md states {stated}, the records give {c}"

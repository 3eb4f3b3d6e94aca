"""``mtad-rerun``: a committed point rerun by today's code into a staging folder, resumably, and
swapped in only when complete and the same point."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mtad.run.rerun import main as rerun_main
from mtad.run.rerun import replaced_of, staging_of
from mtad.run.results.segments import SEGMENTS_FILE

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "results/sweeps/table2_smoke/22805486e9c6"  # SpD on the tiny pair (2 records)


def _records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines()]


def test_rerun_stages_resumes_and_swaps_only_a_complete_rerun(tmp_path, capsys):
    point = tmp_path / "results" / "p"
    shutil.copytree(SMOKE, point)
    before = _records(point)
    staging = tmp_path / "staging"
    stage = staging_of(point, staging)
    # a swap with nothing staged is refused in one line, and the point is untouched
    assert rerun_main([str(point), "--staging", str(staging), "--swap"]) == 2
    assert "2 of its 2 records are not staged" in capsys.readouterr().err
    assert _records(point) == before
    # a half-finished rerun (one record staged, as if interrupted) is refused too ...
    assert rerun_main([str(point), "--staging", str(staging), "--allow-dirty"]) == 0
    staged = _records(stage)
    assert len(staged) == len(before)
    (stage / "samples.jsonl").write_text(json.dumps(staged[0]) + "\n")
    (stage / "summary.json").unlink()
    assert rerun_main([str(point), "--staging", str(staging), "--swap"]) == 2
    assert "1 of its 2 records are not staged" in capsys.readouterr().err
    # ... and resumes: only the missing record is made, in a second segment
    assert rerun_main([str(point), "--staging", str(staging), "--allow-dirty"]) == 0
    resumed = _records(stage)
    assert resumed[0] == staged[0] and len(resumed) == 2
    assert len((stage / SEGMENTS_FILE).read_text().splitlines()) == 2
    assert rerun_main([str(point), "--staging", str(staging), "--status"]) == 0
    assert "2 of 2 records staged" in capsys.readouterr().out
    # swapped: the point's records are the rerun's, each with a segment that resolves to a line
    # of its segments.jsonl; point.json is the point's own; the staging folder is gone
    point_json = (point / "point.json").read_text()
    assert rerun_main([str(point), "--staging", str(staging), "--swap"]) == 0
    after = _records(point)
    segs = {json.loads(x)["segment"] for x in (point / SEGMENTS_FILE).read_text().splitlines()}
    assert all(r["segment"] in segs for r in after) and len(after) == len(before)
    assert (point / "point.json").read_text() == point_json and not stage.exists()
    kept = replaced_of(point, staging)  # the replaced records, for a before/after comparison
    assert [json.loads(x) for x in (kept / "samples.jsonl").read_text().splitlines()] == before
    assert json.loads((point / "config.json").read_text())["output_dir"] == str(point)
    # --compare pairs the replaced records with the swapped-in ones
    assert rerun_main([str(point), "--staging", str(staging), "--compare", str(tmp_path / "cmp.md")]) == 0
    row = (tmp_path / "cmp.md").read_text().splitlines()[-1]
    assert "| swapped in | 2 | 2 of 2 |" in row and "too few examples" in row
    # the tiny pair's draws did not change: today's code makes the committed tokens
    key = lambda r: (r["index"], r["turn"])  # noqa: E731
    assert sorted((key(r), r["output_ids"]) for r in after) == sorted((key(r), r["output_ids"]) for r in before)


def test_rerun_refuses_a_point_todays_config_does_not_rebuild(tmp_path, capsys):
    point = tmp_path / "p"
    shutil.copytree(SMOKE, point)
    stored = json.loads((point / "point.json").read_text())
    stored["identity_hash"] = "000000000000"  # another point's identity than today's config builds
    (point / "point.json").write_text(json.dumps(stored))
    assert rerun_main([str(point), "--staging", str(tmp_path / "s"), "--allow-dirty"]) == 2
    assert "identity differs" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_rerun_refuses_a_folder_that_is_no_point(tmp_path, capsys):
    assert rerun_main([str(tmp_path), "--staging", str(tmp_path / "s")]) == 2
    assert "is not a committed point folder" in capsys.readouterr().err


def test_the_rerun_candidates_count_the_staged_records(tmp_path, monkeypatch):
    from mtad.run.audit import made_before_draw_changes, staged_records

    point = tmp_path / "results" / "p"
    shutil.copytree(SMOKE, point)
    monkeypatch.chdir(tmp_path)
    staging = Path("reruns")
    assert staged_records(point, staging) == 0
    stage = staging_of(point, staging)
    stage.mkdir(parents=True)
    first = (point / "samples.jsonl").read_text().splitlines()[0]
    (stage / "samples.jsonl").write_text(first + "\n")
    assert staged_records(point, staging) == 1
    row = next(x for x in made_before_draw_changes([point], staging) if x.startswith("| `"))
    assert row.endswith("| 2 | 2 | 0 | 1 |")  # 2 records, both made before b32eec4, 1 staged


def test_a_stored_thread_count_is_a_hint_capped_at_this_machines_cpus(caplog):
    import os

    from mtad.run.results.described import recorded_threads

    assert recorded_threads({"provenance": {"torch_threads": 1}}) == 1
    for bad in (None, {}, {"provenance": "x"}, {"provenance": {"torch_threads": "8"}},
                {"provenance": {"torch_threads": 0}}, {"provenance": {"torch_threads": True}}):
        assert recorded_threads(bad) is None
    huge = {"provenance": {"torch_threads": 10**6}}
    assert recorded_threads(huge, "p") == (os.cpu_count() or 1)
    assert "this machine has" in caplog.text


def test_the_committed_rerun_comparison_is_what_the_committed_records_say(monkeypatch):
    """reruns/compare.md is re-rendered from the committed records and reruns: a rerun's new
    records need a re-render in the same commit."""
    from mtad.run.rerun import render_compare, rerun_points

    monkeypatch.chdir(ROOT)
    points = rerun_points(Path("reruns"))
    assert points, "reruns/ holds no rerun"
    assert render_compare(points, Path("reruns")) == (ROOT / "reruns/compare.md").read_text()


def test_a_swap_gives_other_folders_of_the_point_the_rerun_records_made_before_a_draw_change(tmp_path, capsys):
    from mtad.run.rerun import replaced_of

    results = tmp_path / "results"
    a, b = results / "claims" / "a", results / "table" / "b"
    shutil.copytree(SMOKE, a)
    shutil.copytree(SMOKE, b)
    # b's second record made after the change of draws (its own segment, on today's commit)
    import subprocess

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    recs = _records(b)
    recs[1]["segment"] = "after00000"
    (b / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    with open(b / SEGMENTS_FILE, "a") as f:
        f.write(json.dumps({"segment": "after00000", "git": {"commit": head, "dirty": False}}) + "\n")
    before_b = _records(b)
    staging = tmp_path / "staging"
    assert rerun_main([str(a), "--staging", str(staging), "--allow-dirty"]) == 0
    assert rerun_main([str(a), "--staging", str(staging), "--swap", "--share-with", str(results)]) == 0
    assert "1 records made before a change of draws replaced" in capsys.readouterr().out
    after_b, after_a = _records(b), {(r["index"], r["turn"]): r for r in _records(a)}
    assert after_b[0] == after_a[(after_b[0]["index"], after_b[0]["turn"])]  # the rerun's record
    assert after_b[1] == before_b[1]  # made after the change: kept
    segs = {json.loads(x)["segment"] for x in (b / SEGMENTS_FILE).read_text().splitlines()}
    assert {r["segment"] for r in after_b} <= segs
    assert [json.loads(x) for x in (replaced_of(b, staging) / "samples.jsonl").read_text().splitlines()] == before_b
    assert json.loads((b / "summary.json").read_text())["records"] == 2


def test_a_rerun_refuses_a_checkout_with_uncommitted_changes(tmp_path, capsys, monkeypatch):
    import mtad.run.provenance as provenance

    point = tmp_path / "p"
    shutil.copytree(SMOKE, point)
    staging = tmp_path / "s"
    monkeypatch.setattr(provenance, "git_info", lambda: {"commit": "x", "dirty": True,
                                                         "changed": ["mtad/core/engine.py"]})
    assert rerun_main([str(point), "--staging", str(staging)]) == 2
    assert "uncommitted changes (mtad/core/engine.py)" in capsys.readouterr().err
    assert not staging.exists()
    # the rerun's own staged files are no such change
    monkeypatch.setattr(provenance, "git_info", lambda: {"commit": "x", "dirty": True,
                                                         "changed": [str(staging_of(point, staging) / "samples.jsonl")]})
    from mtad.run.rerun import uncommitted

    assert uncommitted(staging) == []


def test_a_swap_never_follows_a_link_in_the_point_or_its_staging_folder(tmp_path, capsys):
    point = tmp_path / "p"
    shutil.copytree(SMOKE, point)
    staging = tmp_path / "s"
    stage = staging_of(point, staging)
    shutil.copytree(SMOKE, stage)
    secret = tmp_path / "secret.json"
    secret.write_text('{"x": 1}')
    (stage / "config.json").unlink()
    (stage / "config.json").symlink_to(secret)
    before = (point / "config.json").read_text()
    assert rerun_main([str(point), "--staging", str(staging), "--swap"]) == 2
    assert "config.json" in capsys.readouterr().err
    assert (point / "config.json").read_text() == before
    # the same for a link in the point itself (the file a swap would keep aside)
    (stage / "config.json").unlink()
    shutil.copyfile(SMOKE / "config.json", stage / "config.json")
    (point / "summary.json").unlink()
    (point / "summary.json").symlink_to(secret)
    assert rerun_main([str(point), "--staging", str(staging), "--swap"]) == 2
    assert not (staging / "replaced").exists()

"""Table cells say where their point's records stand (``mtad.analysis.provenance_marks``)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from mtad.analysis.provenance_marks import (
    audit_folder,
    diverging_points,
    mark_cells,
    marks_footnote,
    point_marks,
)


def _point(folder: Path, segs: list[dict], rec_segs: list[str]) -> Path:
    folder.mkdir(parents=True)
    (folder / "segments.jsonl").write_text("".join(json.dumps(s) + "\n" for s in segs))
    (folder / "samples.jsonl").write_text("".join(json.dumps({"index": i, "turn": 0, "segment": s}) + "\n"
                                                  for i, s in enumerate(rec_segs)))
    return folder


def test_marks_say_several_commits_unknown_commit_dirty_tree_and_audit_divergence(tmp_path):
    clean = {"segment": "s1", "git": {"commit": "a" * 40, "dirty": False}}
    dirty = {"segment": "s2", "git": {"commit": "b" * 40, "dirty": True}}
    unknown = {"segment": "d3", "git": "unknown", "derived": {"added_in": "c" * 40}}
    one = _point(tmp_path / "results" / "s" / "one", [clean], ["s1", "s1"])
    mixed = _point(tmp_path / "results" / "s" / "mixed", [clean, dirty, unknown], ["s1", "s2", "d3"])
    assert point_marks(one) == ""
    assert point_marks(mixed) == "cud"
    # an audit row that differs marks its point; identical rows and errors do not
    audit = tmp_path / "results" / "audit"
    audit.mkdir()
    rows = [{"point": "results/s/one", "result": "diverged at token 2"},
            {"point": "results/s/mixed", "result": "identical"},
            {"point": "results/s/mixed", "result": "error: OSError: no model"}]
    (audit / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert audit_folder(tmp_path / "results" / "s") == audit
    div = diverging_points(audit)
    assert div == {one.resolve()}
    assert point_marks(one, div) == "a" and point_marks(mixed, div) == "cud"
    # the marks go after the point's first cell in its task; other cells unchanged
    cols = pd.MultiIndex.from_tuples([("spider", "n"), ("spider", "PPL"), ("humaneval", "n")])
    text = pd.DataFrame([["30", "1.2", "30"], ["30", "1.3", "–"]], index=["spd", "mtad"], columns=cols)
    points = pd.DataFrame([{"label": "spd", "task": "spider", "_dir": one},
                           {"label": "mtad", "task": "spider", "_dir": mixed},
                           {"label": "spd", "task": "humaneval", "_dir": tmp_path / "missing"}])
    shown, used = mark_cells(text, points, div)
    assert shown.loc["spd", ("spider", "n")] == "30 [a]" and shown.loc["mtad", ("spider", "n")] == "30 [cud]"
    assert shown.loc["spd", ("humaneval", "n")] == "30" and shown.loc["spd", ("spider", "PPL")] == "1.2"
    assert text.loc["spd", ("spider", "n")] == "30"  # the CSV's frame is left alone
    assert used == ["c", "u", "d", "a"]
    note = marks_footnote(used)
    assert "c: records made by runs at more than one commit" in note and "d: records made from a checkout" in note
    assert marks_footnote([]) is None


def test_r_marks_records_made_before_a_change_of_draws_unless_an_identical_regeneration_shows_them_unaffected(tmp_path):
    import subprocess

    root = Path(__file__).resolve().parents[2]
    old, new = (subprocess.run(["git", "-C", str(root), "rev-parse", rev], capture_output=True, text=True,
                               check=True).stdout.strip() for rev in ("b32eec4^", "HEAD"))
    before = {"segment": "s1", "git": {"commit": old, "dirty": False}}
    after = {"segment": "s2", "git": {"commit": new, "dirty": False}}
    added_before = {"segment": "d3", "git": "unknown", "derived": {"added_in": old}}
    p_old = _point(tmp_path / "old", [before], ["s1", "s1"])
    p_new = _point(tmp_path / "new", [after], ["s2"])
    p_added = _point(tmp_path / "added", [added_before], ["d3"])
    assert point_marks(p_old) == "r" and point_marks(p_new) == "" and point_marks(p_added) == "ur"
    # a whole-record audit that found one of its pre-change records identical: shown unaffected
    audit = tmp_path / "results" / "audit"
    audit.mkdir(parents=True)
    (audit / "a.jsonl").write_text(json.dumps({"point": "old", "index": 1, "turn": 0, "result": "identical"}) + "\n"
                                   + json.dumps({"point": "added", "index": 0, "turn": 0,
                                                 "result": "identical through token 16"}) + "\n")
    from mtad.analysis.provenance_marks import identical_records

    same = identical_records(audit)
    assert same == {(p_old.resolve(), 1, 0)}  # a prefix that agreed is not a whole record
    assert point_marks(p_old, frozenset(), same) == "" and point_marks(p_added, frozenset(), same) == "ur"


def test_marks_say_records_from_more_than_one_machine_kind(tmp_path):
    cpu = lambda native: {"cpu_info": {"model": "AMD EPYC", "native_bf16": native,  # noqa: E731
                                       "torch_capability": "AVX512" if native else "AVX2"}}
    git = {"commit": "a" * 40, "dirty": False}
    native = {"segment": "s1", "git": git, "device": cpu(True)}
    emulated = {"segment": "s2", "git": git, "device": cpu(False)}
    unrecorded = {"segment": "s3", "git": git, "device": {"cpu": "x86_64"}}
    assert point_marks(_point(tmp_path / "one", [native], ["s1", "s1"])) == ""
    assert point_marks(_point(tmp_path / "two", [native, emulated], ["s1", "s2"])) == "k"
    assert point_marks(_point(tmp_path / "unrecorded", [native, unrecorded], ["s1", "s3"])) == "k"

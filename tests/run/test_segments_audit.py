"""Records say which run made them (segments), and ``mtad-audit`` regenerates a sample of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mtad.run.audit import (
    code_group,
    compare_records,
    first_difference,
    machine_group,
    result_line,
    sample_records,
)
from mtad.run.audit import main as audit_main
from mtad.run.cli import compose_config
from mtad.run.results import PointFolder
from mtad.run.results.segments import (
    SEGMENTS_FILE,
    UNKNOWN_SEGMENT,
    describe_provenance,
    describe_segments,
    segment_of,
    segments,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = ["+experiment=debug", "max_new_tokens=4", "perplexity=false", "~task.scorer", "decoder=spd"]


def _records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines()]


def test_each_run_that_writes_records_is_a_segment_with_its_provenance(tmp_path):
    from mtad.run.evaluate import run

    out = tmp_path / "run"
    run(compose_config([*TINY, "limit=1"]), out)
    first = segments(PointFolder(out))
    assert len(first) == 1
    run(compose_config([*TINY, "limit=1"]), out)  # nothing to generate: no new segment
    assert segments(PointFolder(out)) == first
    summary = run(compose_config([*TINY, "limit=2"]), out)
    segs = segments(PointFolder(out))
    assert len(segs) == 2 and len((out / SEGMENTS_FILE).read_text().splitlines()) == 2
    recs = _records(out)
    assert len({r["segment"] for r in recs}) == 2 and all(r["segment"] in segs for r in recs)
    for s in segs.values():
        assert s["git"]["commit"] and "changed" in s["git"] and s["packages"]["torch"]
        assert s["device"]["cpu_info"]["model"] is not None
    assert summary["segments"]["count"] == 2 and summary["segments"]["records_before_segments"] == 0
    assert describe_segments(summary["segments"]).startswith("made in 2 segments: 1 by ")


def test_records_before_segments_read_as_unknown(tmp_path):
    folder = PointFolder(tmp_path)
    assert segment_of(folder, {"example_id": "a"}) is None
    assert describe_provenance(None) == UNKNOWN_SEGMENT
    info = {"count": 2, "segments": [{"segment": "x", "records": 3, "made_by": "abc on CPU"}],
            "records_before_segments": 2}
    assert describe_segments(info) == f"made in 2 segments: 3 by abc on CPU; 2 {UNKNOWN_SEGMENT}"
    assert describe_segments({"count": 1, "segments": [], "records_before_segments": 5}) is None


def test_first_difference_and_sampling():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2  # the shorter one ends there
    recs = [{"index": i, "turn": 0} for i in range(10)]
    a, b = sample_records(recs, 3, 0, "p"), sample_records(recs, 3, 0, "p")
    assert a == b and len(a) == 3 and sample_records(recs, 3, 1, "p") != a


SMOKE = ROOT / "results/sweeps/table2_smoke/22805486e9c6"  # SpD on the tiny pair: any CPU reproduces it


def test_audit_finds_identical_and_planted_divergent_records(tmp_path):
    point = tmp_path / "point"
    shutil.copytree(SMOKE, point)
    out, table = tmp_path / "audit.jsonl", tmp_path / "audit.md"
    assert audit_main([str(point), "--n", "2", "--out", str(out), "--table", str(table)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["result"] for r in rows] == ["identical", "identical"]
    # the whole record is compared: tokens, steps, accepted per step, NLL, perplexity, score
    assert all(set(r["fields"].values()) == {"same"} and r["first_field"] is None for r in rows)
    # committed before segments: a segment derived from the repository's history
    assert all(r["made_by"].startswith("derived: ") for r in rows)
    # plant a change at token 3 of one record, and in the NLL alone of another: the audit says
    # which field differs first (and where the tokens diverge)
    recs = _records(point)
    picked = sorted((r["index"], r["turn"]) for r in rows)
    by_key = {(r["index"], r["turn"]): r for r in recs}
    by_key[picked[0]]["output_ids"][3] = (by_key[picked[0]]["output_ids"][3] + 1) % 40
    by_key[picked[1]]["nll_sum"] *= 1 + 1e-4
    (point / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    out2 = tmp_path / "audit2.jsonl"
    assert audit_main([str(point), "--n", "2", "--out", str(out2), "--table", str(table)]) == 0
    rows2 = {(r["index"], r["turn"]): r for r in map(json.loads, out2.read_text().splitlines())}
    assert rows2[picked[0]]["result"] == "diverged at token 3" and rows2[picked[0]]["first_field"] == "tokens"
    assert rows2[picked[1]]["result"] == "nll_sum differs"
    assert rows2[picked[1]]["fields"] == {"tokens": "same", "steps": "same", "accepted_per_step": "same",
                                         "nll_sum": "differs", "perplexity": "same", "score": "same"}
    assert "Points with a record not reproduced" in table.read_text()
    # a rerun resumes: nothing left to audit, nothing appended
    assert audit_main([str(point), "--n", "2", "--out", str(out2)]) == 0
    assert len(out2.read_text().splitlines()) == 2


def test_audit_refuses_a_folder_without_records(tmp_path, capsys):
    assert audit_main([str(tmp_path)]) == 2
    assert "holds no samples.jsonl" in capsys.readouterr().err


def test_compare_records_reports_the_first_differing_field_in_order():
    rec = {"output_ids": [1, 2, 3], "steps": 2, "accepted_per_step": [1, 0], "nll_sum": 3.0,
           "perplexity": 2.718281828, "score": 1.0}
    same = compare_records(rec, dict(rec))
    assert same["first_field"] is None and result_line(same) == "identical"
    # within the stated relative tolerance (1e-6) a float is the same; beyond it, it differs
    assert compare_records(rec, {**rec, "nll_sum": 3.0 * (1 + 1e-8)})["first_field"] is None
    assert result_line(compare_records(rec, {**rec, "perplexity": 2.72})) == "perplexity differs"
    # steps before accepted per step before NLL before score; tokens first of all
    both = compare_records(rec, {**rec, "steps": 3, "score": 0.0})
    assert both["first_field"] == "steps" and both["fields"]["score"] == "differs"
    assert result_line(compare_records(rec, {**rec, "output_ids": [1, 9, 3], "steps": 5})) == "diverged at token 1"
    # a field the record does not hold is not compared, and never decides the result
    bare = {k: rec[k] for k in ("output_ids", "steps", "accepted_per_step")}
    c = compare_records(bare, {**rec, "score": 0.0})
    assert c["fields"]["score"] == "not compared" and c["first_field"] is None


def test_audit_groups_records_by_the_code_and_the_machine_that_made_them():
    """The commit of the record's segment against a draw change, not the point's last run; a
    derived segment without a run's commit counts as before the change only when the commit that
    added the record precedes it."""
    before, after = "7d2faf40e7b165f6ab7bcf3b379ecb293ab5e176", "673256e73140466cb00bad92d622a6c2fda5e274"
    assert code_group({"git": {"commit": before, "dirty": False}}, "b32eec4") == "run on a commit before b32eec4"
    assert code_group({"git": {"commit": after, "dirty": True}}, "b32eec4") == \
        "run on a commit after b32eec4 (dirty tree)"
    assert code_group({"git": "unknown", "derived": {"added_in": "3f09e558e745106e68afc1297e3fd00bf5bb770b"}},
                      "b32eec4") == "added before b32eec4 (run's commit not recorded)"
    assert code_group({"git": "unknown", "derived": {"added_in": after}}, "b32eec4") == "run's commit not recorded"
    cpu = {"cpu_info": {"model": "AMD EPYC", "native_bf16": True, "torch_capability": "AVX512"}}
    audit = "abc on AMD EPYC (native bf16, AVX512), torch 2.13.0"
    assert machine_group({"device": cpu}, audit) == "same machine kind as the audit"
    assert machine_group({"device": {"cpu_count": 2}}, audit) == "machine not recorded"
    assert machine_group({"device": cpu}, "abc on AMD EPYC (no native bf16, AVX2)").startswith("another machine kind")


def test_audit_all_takes_every_point_folder_under_a_root(tmp_path, capsys):
    assert audit_main(["--all", str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert audit_main([]) == 2
    assert "--all" in capsys.readouterr().err
    from mtad.run.audit import committed_points

    shutil.copytree(SMOKE, tmp_path / "r" / "s" / "a")
    (tmp_path / "r" / "s" / "b").mkdir()
    assert committed_points(tmp_path / "r") == [tmp_path / "r" / "s" / "a"]

"""Records say which run made them (segments), and ``mtad-audit`` regenerates a sample of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mtad.run.audit import first_difference, sample_records
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
    assert all(r["made_by"] == UNKNOWN_SEGMENT for r in rows)  # committed before segments
    # plant a change at token 3 of one record: the audit says where it diverges
    recs = _records(point)
    recs[0]["output_ids"][3] = (recs[0]["output_ids"][3] + 1) % 40
    (point / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    out2 = tmp_path / "audit2.jsonl"
    assert audit_main([str(point), "--n", "2", "--out", str(out2), "--table", str(table)]) == 0
    rows2 = {(r["index"], r["turn"]): r["result"] for r in map(json.loads, out2.read_text().splitlines())}
    assert rows2[(recs[0]["index"], recs[0]["turn"])] == "diverged at token 3"
    assert "Points with a record not reproduced" in table.read_text()
    # a rerun resumes: nothing left to audit, nothing appended
    assert audit_main([str(point), "--n", "2", "--out", str(out2)]) == 0
    assert len(out2.read_text().splitlines()) == 2


def test_audit_refuses_a_folder_without_records(tmp_path, capsys):
    assert audit_main([str(tmp_path)]) == 2
    assert "holds no samples.jsonl" in capsys.readouterr().err

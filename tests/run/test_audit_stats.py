"""The statistical audit (``mtad.run.audit_stats``): regenerated metrics against committed ones,
paired by example, with a stated criterion."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from mtad.run.audit import main as audit_main
from mtad.run.audit_stats import compare_point, render

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "results/sweeps/table2_smoke/22805486e9c6"  # SpD on the tiny pair: any CPU reproduces it


def _smoke_point() -> Path:
    return SMOKE


def _rows(n: int, shift_ppl: float = 0.0, shift_be: float = 0.0, flip: int = 0, seed: int = 0) -> list[dict]:
    """Audit rows of ``n`` examples whose regenerated records are independent draws from the
    committed ones' distribution, plus planted shifts."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        def draw(shift_p=0.0, shift_b=0.0, score=None):
            tokens = 64
            steps = max(1, round(tokens / (3.0 + shift_b + rng.gauss(0, 0.3))))
            nll = tokens * max(0.01, 0.2 + shift_p + rng.gauss(0, 0.05))
            return {"new_tokens": tokens, "steps": steps, "nll_sum": nll, "perplexity": None,
                    "score": score if score is not None else float(rng.random() < 0.6)}
        rec = draw()
        now = draw(shift_ppl, shift_be, score=(1.0 if i < flip else None))
        rows.append({"point": "p", "decoder": "spd", "task": "t", "example_id": f"ex{i}", "index": i, "turn": 0,
                     "result": "diverged at token 0", "point_last_run": "x", "audited_on": "y",
                     "metrics": {"recorded": rec, "regenerated": now}})
    return rows


def test_same_distribution_is_consistent_and_planted_shifts_are_not():
    assert compare_point(_rows(40))["verdict"] == "consistent"
    shifted = compare_point(_rows(40, shift_ppl=0.1))
    assert shifted["verdict"] == "not consistent: perplexity"
    assert shifted["metrics"]["perplexity"]["low"] > 1.0  # regenerated perplexity higher
    assert compare_point(_rows(40, shift_be=1.5))["verdict"] == "not consistent: block efficiency"


def test_identical_records_agree_without_an_interval():
    rows = _rows(5)
    for r in rows:
        r["metrics"]["regenerated"] = dict(r["metrics"]["recorded"])
        r["result"] = "identical"
        r["fields"] = {"tokens": "same"}
    c = compare_point(rows)
    assert c["verdict"] == "consistent" and c["identical"] == 5
    # every pair differing alike (a constant shift) is a difference, not "no spread, so fine"
    for r in rows:
        r["metrics"]["regenerated"]["steps"] += 1
    assert compare_point(rows)["verdict"] == "not consistent: block efficiency"


def test_turns_are_pooled_per_example():
    rows = _rows(3)
    second = json.loads(json.dumps(rows[0]))
    second["turn"] = 1
    rows.append(second)
    c = compare_point(rows)
    assert c["examples"] == 3 and c["records"] == 4


def test_audit_keeps_both_records_metrics_and_writes_the_statistical_table(tmp_path):
    point = tmp_path / "point"
    shutil.copytree(_smoke_point(), point)
    out, stat = tmp_path / "audit.jsonl", tmp_path / "stat.md"
    assert audit_main([str(point), "--records", "0,1", "--out", str(out), "--stat-table", str(stat)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows and all(set(r["metrics"]) == {"recorded", "regenerated"} for r in rows)
    assert all(r["metrics"]["recorded"]["new_tokens"] == r["metrics"]["regenerated"]["new_tokens"] for r in rows)
    text = stat.read_text()
    # two identical records: the point's two examples, too few for a verdict (tested above on more)
    assert "| 2 (2) | 2 of 2 |" in text and "too few examples for a verdict" in text and "--records 0,1" in text
    assert render(rows, [rows[0]["point"], "other"], {}).count("| not audited |") == 1


def test_prefix_audit_compares_the_steps_it_ran_and_the_committed_records_whole(tmp_path):
    point = tmp_path / "point"
    shutil.copytree(SMOKE, point)
    out, table = tmp_path / "prefix.jsonl", tmp_path / "prefix.md"
    assert audit_main([str(point), "--records", "0,1,2", "--prefix", "2", "--out", str(out), "--table", str(table)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    stopped = [r for r in rows if r.get("compared_tokens") is not None]
    assert stopped, "a 2-token prefix of a longer record stops early"
    for r in stopped:
        assert r["result"] == f"identical through token {r['compared_tokens']}"
        assert r["fields"]["steps"] == "not compared" and r["fields"]["nll_sum"] == "same"
        assert 2 <= r["compared_tokens"] < r["recorded_tokens"]
    # a change planted past the prefix is not seen in the tokens; one in the NLL is
    recs = [json.loads(x) for x in (point / "samples.jsonl").read_text().splitlines()]
    target = next(x for x in recs if x["index"] == stopped[0]["index"])
    target["output_ids"][-1] = (target["output_ids"][-1] + 1) % 40
    (point / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    out2 = tmp_path / "prefix2.jsonl"
    assert audit_main([str(point), "--records", str(stopped[0]["index"]), "--prefix", "2", "--out", str(out2)]) == 0
    row = json.loads(out2.read_text().splitlines()[0])
    assert row["fields"]["tokens"] == "same" and row["result"] == "nll_sum differs"
    assert "audited over a prefix" in table.read_text()
    from mtad.analysis.provenance_marks import diverging_points
    audit_dir = tmp_path / "results" / "audit"
    audit_dir.mkdir(parents=True)
    (audit_dir / "a.jsonl").write_text(json.dumps({"point": "p1", "result": "identical through token 4"}) + "\n"
                                       + json.dumps({"point": "p2", "result": "nll_sum differs"}) + "\n")
    assert diverging_points(audit_dir) == {(tmp_path / "p2").resolve()}


def test_too_few_examples_get_no_verdict_and_same_tokens_are_counted_by_field():
    rows = _rows(4, shift_ppl=0.5)
    for r in rows[:2]:
        r["fields"] = {"tokens": "same"}
    c = compare_point(rows)
    assert c["verdict"].startswith("too few examples") and c["identical"] == 2


def test_a_forged_longer_record_gets_no_teacher_forced_pass_and_an_audit_fifo_is_refused(tmp_path):
    import os
    import signal

    import pytest

    from mtad.analysis.provenance_marks import diverging_points, identical_records
    from mtad.core.io import UnsafeResultsFile

    point = tmp_path / "point"
    shutil.copytree(SMOKE, point)
    recs = [json.loads(x) for x in (point / "samples.jsonl").read_text().splitlines()]
    recs[0]["output_ids"] = recs[0]["output_ids"] * 5000  # far past the point's max_new_tokens
    (point / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    out = tmp_path / "p.jsonl"
    assert audit_main([str(point), "--records", str(recs[0]["index"]), "--prefix", "1", "--out", str(out)]) == 0
    row = json.loads(out.read_text().splitlines()[0])
    assert row["result"].startswith("error: ValueError: the record holds") and "max_new_tokens" in row["result"]
    audit = tmp_path / "results" / "audit"
    audit.mkdir(parents=True)
    os.mkfifo(audit / "a.jsonl")
    signal.alarm(5)  # a hang fails the test
    try:
        for reader in (diverging_points, identical_records):
            with pytest.raises(UnsafeResultsFile):
                reader(audit)
    finally:
        signal.alarm(0)

"""What ``docs/results.md`` says about which code makes the tree-MTAD/Spider records is what the
committed regeneration rows say (``bench/regen_at_commit.py``, ``results/audit/code/``)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / "results/audit/code/tree_spider_73ed108fddbb.jsonl"
POINT = ROOT / "results/claims/claims/73ed108fddbb"
#: Where ``mtad-rerun --swap`` keeps the point's records from before its rerun (the ones the rows
#: regenerate), once the rerun is swapped in.
REPLACED = ROOT / "reruns/replaced/results/claims/claims/73ed108fddbb"
MADE = REPLACED if (REPLACED / "samples.jsonl").is_file() else POINT


def _rows() -> list[dict]:
    return [json.loads(x) for x in ROWS.read_text().splitlines()]


def _commit(prefix: str, rows: list[dict]) -> str:
    (full,) = {r["code_commit"] for r in rows if r["code_commit"].startswith(prefix)}
    return full


def test_the_code_that_made_the_records_regenerates_them_and_todays_does_not():
    rows = _rows()
    committed = {r["index"]: r for r in map(json.loads, (MADE / "samples.jsonl").read_text().splitlines())
                 if r["turn"] == 0}
    made_by = {json.loads(x)["git"]["commit"] for x in (MADE / "segments.jsonl").read_text().splitlines()}
    old = _commit("7d2faf40", rows)
    assert old in made_by  # the commit the point's segments name
    whole = [r for r in rows if r["kernel"] == "bfloat16" and r["max_new"] is None]
    at_old = {r["index"]: r for r in whole if r["code_commit"] == old}
    assert set(at_old) == {14, 15}
    for i, r in at_old.items():  # bit for bit: tokens and steps
        assert r["first_difference_vs_committed"] is None and r["tokens"] == committed[i]["output_ids"]
        assert r["steps"] == committed[i]["steps"] and r["accepted_per_step"] == committed[i]["accepted_per_step"]
        assert not r["settings_not_in_commit_conf"]
    today = {r["index"]: r["first_difference_vs_committed"] for r in whole if r["code_commit"] != old}
    assert today == {14: 1, 15: 3}


def test_the_bisection_boundary_is_b32eec4():
    rows = [r for r in _rows() if r["kernel"] == "float32" and r["max_new"] == 8 and r["index"] == 14]
    first = {r["code_commit"][:7]: r["first_difference_vs_committed"] for r in rows}
    assert first["14f95e2"] is None and first["b32eec4"] == 1
    from mtad.run.audit import DRAW_CHANGES

    assert DRAW_CHANGES[0][0] == "b32eec4"


def test_the_docs_state_it():
    text = " ".join((ROOT / "docs/results.md").read_text().split())
    assert "results/audit/code/tree_spider_73ed108fddbb.jsonl" in text
    assert "regenerates records 14 and 15 bit for bit" in text and "at tokens 1 and 3" in text
    assert "`14f95e2` still makes the committed tokens and `b32eec4` is the first commit" in text


def _staged_or_swapped() -> Path:
    """The rerun's records of the point: staged (``reruns/<point>``) or swapped in."""
    staged = ROOT / "reruns/results/claims/claims/73ed108fddbb"
    return staged if (staged / "samples.jsonl").is_file() else POINT


def test_the_nll_depends_on_the_machine_not_on_the_code():
    nll = [json.loads(x) for x in (ROOT / "results/audit/code/tree_spider_73ed108fddbb_nll.jsonl").read_text().splitlines()]
    assert {r["code_commit"][:8] for r in nll} >= {"7d2faf40"} and len({r["code_commit"] for r in nll}) >= 2
    values = {round(r["nll_sum_of_committed_tokens"], 12) for r in nll}
    assert len(values) == 1  # every commit, every thread count: one NLL on this machine
    (value,) = values
    assert round(value, 4) == 0.4284 and round(nll[0]["committed_nll_sum"], 4) == 0.4768
    committed = {r["index"]: r for r in map(json.loads, (MADE / "samples.jsonl").read_text().splitlines())}
    assert round(committed[0]["prefill_time"], 1) == 10.3
    rerun = {r["index"]: r for r in map(json.loads, (_staged_or_swapped() / "samples.jsonl").read_text().splitlines())}
    assert set(rerun) >= {0, 1, 2, 5}
    diffs = []
    for i in (0, 1, 2, 5):
        assert rerun[i]["output_ids"] == committed[i]["output_ids"]
        diffs.append(rerun[i]["nll_sum"] - committed[i]["nll_sum"])
    assert (round(min(diffs), 3), round(max(diffs), 3)) == (-0.070, 0.045)
    assert 100 < rerun[0]["prefill_time"] < 130  # this machine's prefill of the same prompt

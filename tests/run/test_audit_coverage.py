"""``mtad-audit --coverage``: every committed point with the audits that reached it, and counts
grouped by what they say they are grouped by."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtad.models.kernels import BF16_IN_FLOAT32
from mtad.run.audit import committed_points
from mtad.run.audit import main as audit_main
from mtad.run.audit_coverage import PREFIX, TOKENS, WHOLE, coverage, kind, outcome, render

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "mtad-audit --all results --audits results/audit --coverage results/audit/coverage.md"
FIELDS = ("tokens", "steps", "accepted_per_step", "nll_sum", "perplexity", "score")


def _row(point, result, first=None, prefix=None, fields=True, on="abc on CPU (no native bf16, AVX2)"):
    r = {"point": point, "decoder": "spd", "task": "humaneval", "result": result, "audited_on": on}
    if fields:
        r["fields"] = {f: "same" for f in FIELDS}
        r["first_field"] = first
    if prefix is not None:
        r["prefix"] = prefix
    return r


def test_rows_are_classified_by_comparison_and_first_differing_field():
    assert (kind(_row("p", "identical")), outcome(_row("p", "identical"))) == (WHOLE, "identical")
    assert kind(_row("p", "x", prefix=16)) == PREFIX
    assert outcome(_row("p", "identical through token 19", prefix=16)) == "identical through the prefix"
    assert outcome(_row("p", "nll_sum differs", first="nll_sum")) == "nll_sum"
    assert outcome(_row("p", "diverged at token 3", first="tokens")) == "tokens"
    old = _row("p", "diverged at token 1", fields=False)
    assert (kind(old), outcome(old)) == (TOKENS, "tokens")
    assert outcome(_row("p", "error: ValueError: example 3 is x today")) == "error"


def test_every_point_is_listed_and_the_counts_add_up():
    files = {"a.jsonl": [_row("p1", "identical"), _row("p1", "diverged at token 1", fields=False),
                         _row("elsewhere", "identical")],
             "b.jsonl": [_row("p2", "nll_sum differs", first="nll_sum", prefix=16,
                              on=f"abc on CPU (no native bf16, AVX2; {BF16_IN_FLOAT32})"),
                         _row("p3", "identical", fields=False)]}
    text = "\n".join(coverage(["p1", "p2", "p3", "p4"], files))
    assert text.startswith("2 of 4 committed points have a whole-record or prefix audit (1 whole record at widest, "
                           "1 prefix), 1 only token-only rows, 1 none.")
    assert "| whole record | identical | 1 |" in text and "| tokens only | tokens | 1 |" in text
    assert "| prefix | nll_sum | 1 |" in text and "elsewhere" not in text
    assert f"| prefix 16 | 1 nll_sum (prefix) | {BF16_IN_FLOAT32} |" in text
    assert "| `p4` | – | 0 | not audited | – | – |" in text


def test_committed_coverage_rerenders_identically(monkeypatch):
    """results/audit/coverage.md is what the committed audit files say: a new audit row needs a
    re-render (the command on its second line) in the same commit."""
    monkeypatch.chdir(ROOT)
    new = render(committed_points(Path("results")), Path("results/audit"), COMMAND)
    assert COMMAND in (ROOT / "results/audit/coverage.md").read_text()
    assert new == (ROOT / "results/audit/coverage.md").read_text()


def test_the_cli_writes_it_and_refuses_a_missing_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert audit_main(["--all", "results", "--audits", str(tmp_path / "nowhere"), "--coverage",
                       str(tmp_path / "c.md")]) == 2
    assert "--audits" in capsys.readouterr().err
    (tmp_path / "x.jsonl").write_text(json.dumps(_row("results/sweeps/table2_smoke/22805486e9c6", "identical")) + "\n")
    assert audit_main(["--all", "results", "--audits", str(tmp_path), "--coverage", str(tmp_path / "c.md")]) == 0
    n = len(committed_points(Path("results")))
    assert f"1 of {n} committed points have a whole-record or prefix audit" in (tmp_path / "c.md").read_text()


def test_the_docs_claim_of_full_coverage_is_the_committed_tables():
    """docs/results.md says every committed point has a whole-record or prefix audit: the committed
    coverage table must say so too (N of N, none left)."""
    doc = " ".join((ROOT / "docs/results.md").read_text().split())
    if "Every committed point has a whole-record or prefix audit there." in doc:
        n = len(committed_points(ROOT / "results"))
        assert (f"{n} of {n} committed points have a whole-record or prefix audit"
                in (ROOT / "results/audit/coverage.md").read_text())


def test_rows_of_records_a_rerun_replaced_no_longer_count(tmp_path):
    """An audit row speaks for the committed record only while that record carries the segment
    the row audited: after a rerun is swapped in, the coverage table, the marks and the
    statistical table (which names the point) no longer read the row as the committed record's."""
    import json

    from mtad.analysis.provenance_marks import current_audit_rows, diverging_points
    from mtad.run.audit_coverage import audit_rows, replaced

    point = tmp_path / "results" / "p" / "abc"
    point.mkdir(parents=True)
    (point / "samples.jsonl").write_text(
        json.dumps({"index": 0, "turn": 0, "segment": "new"}) + "\n"
        + json.dumps({"index": 1, "turn": 0, "segment": "old"}) + "\n")
    audits = tmp_path / "results" / "audit"
    audits.mkdir()
    rows = [{"point": "results/p/abc", "index": 0, "turn": 0, "segment": "old", "result": "diverged at token 1"},
            {"point": "results/p/abc", "index": 1, "turn": 0, "segment": "old", "result": "identical"},
            {"point": "results/p/abc", "index": 0, "turn": 0, "result": "tokens differ"}]
    (audits / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache: dict = {}
    assert [replaced(r, tmp_path, cache) for r in rows] == [True, False, False]
    assert audit_rows(audits)["a.jsonl"] == rows[1:]
    assert current_audit_rows(audits) == rows[1:]
    assert diverging_points(audits) == {point.resolve()}  # the row without a segment still counts
    rows[2]["result"] = "identical"
    (audits / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert diverging_points(audits) == set()  # the replaced record's divergence no longer marks it


def test_an_audit_rows_point_never_leads_the_reader_outside_the_checkout(tmp_path):
    """A stored ``point`` of ``../`` or an absolute path reads nothing outside the checkout, and a
    point whose samples file is a FIFO or a link is refused in one line, never waited on."""
    import json
    import os
    import signal

    from mtad.core.io import UnsafeResultsFile
    from mtad.run.audit_coverage import audit_rows, replaced

    checkout, outside = tmp_path / "checkout", tmp_path / "outside"
    (outside / "p").mkdir(parents=True)
    (outside / "p" / "samples.jsonl").write_text(json.dumps({"index": 0, "turn": 0, "segment": "new"}) + "\n")
    audits = checkout / "results" / "audit"
    audits.mkdir(parents=True)
    rows = [{"point": "../outside/p", "index": 0, "segment": "old"},
            {"point": str(outside / "p"), "index": 0, "segment": "old"}]
    assert [replaced(r, checkout, {}) for r in rows] == [False, False]  # not read: kept as current
    (audits / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert audit_rows(audits)["a.jsonl"] == rows
    fifo = checkout / "results" / "q"
    fifo.mkdir()
    os.mkfifo(fifo / "samples.jsonl")
    signal.alarm(5)  # a hang fails the test
    try:
        with pytest.raises(UnsafeResultsFile):
            replaced({"point": "results/q", "index": 0, "segment": "old"}, checkout, {})
    finally:
        signal.alarm(0)
    (fifo / "samples.jsonl").unlink()
    (fifo / "samples.jsonl").symlink_to(outside / "p" / "samples.jsonl")
    with pytest.raises(UnsafeResultsFile):
        replaced({"point": "results/q", "index": 0, "segment": "old"}, checkout, {})

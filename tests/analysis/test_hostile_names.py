"""Names from a results folder, rendered by the real commands: each output escapes them for
its format (CSV formulas, Markdown rows, HTML, LaTeX, matplotlib's mathtext, file names).

One synthetic sweep whose decoder, task, pair and knob names and failure reasons are hostile
is rendered once by ``python -m mtad.analysis.render`` (a module fixture); the claims report
and the audit table get the same names through their writers.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mtad.run.provenance import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]

#: Decoder names of the sweep, each aimed at one format.
DECODERS = ["=cmd|' /C calc'!A0", "+1", "@SUM(A1:A2)", "-2+3", "a|b", "a\nb", "a\n| forged | row |",
            "<script>alert(1)</script>", r"\textbf{x}", "$x$", r"$\textbf{x}$", "$^$", "%", "&",
            "_", "#", "a/b", "../x"]
#: Task names: one ordinary, the others would be a path, a formula and mathtext.
TASKS = ["humaneval", "a/b", "../x=t|$^$\nx"]
PAIR = "=pair|<b>$^$"
KNOB = "../k$^$"  # an identity key that varies between two points: an ablation axis
REASON = "=HYPERLINK(\"http://x\")\n| forged | row |\n<img src=x onerror=alert(1)>"
FORMULA = ("=", "+", "-", "@", "\t", "\r", "\n")


def _point(sweep: Path, h: str, task: str, decoder: str, *, failed: str | None = None, **ident) -> None:
    d = sweep / h
    identity = {"model": {"name": PAIR}, "decoder": {"_target_": "mtad.decoders.x.X"},
                "task": {"name": task}, "seed": 0, "temperature": 1.0, "max_new_tokens": 8,
                "limit": 2, **ident}
    write_json_atomic(d / "point.json", {"hash": h, "identity": identity,
                                         "choices": {"model": PAIR, "task": task, "decoder": decoder}})
    if failed:
        write_json_atomic(d / "error.json", {"hash": h, "reason": failed})
        return
    write_json_atomic(d / "summary.json", {
        "decoder": decoder, "task": task, "model": {"pair": PAIR}, "config": identity,
        "metrics": {"examples": 2, "perplexity": 2.0 + len(h) / 10, "tokens_per_s": 10.0 + len(h),
                    "block_efficiency": 1.5},
        "score": {"metric": "pass@1|<i>", "value": 0.5, "stderr": 0.1}})


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    base = tmp_path_factory.mktemp("hostile")
    sweep = base / "sweeps" / "demo"
    hashes = []
    for i, dec in enumerate(DECODERS):
        _point(sweep, f"d{i:02d}", "humaneval", dec)
        hashes.append(f"d{i:02d}")
    for i, task in enumerate(TASKS[1:]):
        _point(sweep, f"t{i}", task, "spd")
        _point(sweep, f"u{i}", task, "multinomial")
        hashes += [f"t{i}", f"u{i}"]
    for i, value in enumerate((1, 2)):
        _point(sweep, f"k{i}", "humaneval", "mtad", **{KNOB: value})
        hashes.append(f"k{i}")
    _point(sweep, "f0", "humaneval", "tree_mtad", failed=REASON)
    hashes.append("f0")
    write_json_atomic(sweep / "sweep.json", {"name": "demo", "points": [{"hash": h} for h in hashes]})
    out = base / "out"
    proc = subprocess.run([sys.executable, "-m", "mtad.analysis.render", str(sweep), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=base,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"})
    return out, proc


def test_render_exits_0_with_every_figure(rendered):
    out, proc = rendered
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = {p.name for p in out.iterdir()}
    # a figure per task, each file right in --out (no '/' or '..' from a name), named apart
    pareto = sorted(n for n in names if n.startswith("pareto_"))
    assert len(pareto) == len(TASKS) and "pareto_humaneval.png" in pareto and "pareto.png" in names
    assert len([n for n in names if n.startswith("ablation_")]) == 1
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", n) for n in names), names
    assert sorted(p.name for p in out.parent.iterdir()) == ["out", "sweeps"]  # nothing written beside


def test_csv_cells_are_never_formulas(rendered):
    out, proc = rendered
    assert proc.returncode == 0, proc.stderr[-3000:]
    for fname in ("table2.csv", "points.csv"):
        rows = list(csv.reader((out / fname).open(newline="")))
        header, body = rows[0], rows[1:]
        for row in rows:
            assert len(row) == len(header)
            for cell in row:
                number = re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", cell)
                assert number or not cell.startswith(FORMULA), (fname, cell)
        text = "\n".join(",".join(r) for r in body)
        assert "'=cmd|' /C calc'!A0" in text and "'+1" in text and "'@SUM(A1:A2)" in text
    points = list(csv.DictReader((out / "points.csv").open(newline="")))
    assert len(points) == len(DECODERS) + 2 * (len(TASKS) - 1) + 3  # one row per point
    assert {p["decoder"] for p in points} >= {"'=cmd|' /C calc'!A0", "a\nb", "$x$"}  # quoted, kept


def _table_rows(md: str, task_heading: str) -> list[str]:
    return md.split(task_heading + "\n", 1)[1].strip().split("\n\n", 1)[0].splitlines()


def _columns(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line.replace("\\\\", "")))


def test_markdown_keeps_its_rows_and_opens_no_html(rendered):
    out, proc = rendered
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "table2.md").read_text()
    rows = _table_rows(md, "### humaneval (score: pass@1|&lt;i>)")
    # header, rule, a row per label of the pair: the decoders, two mtad variants, the failed
    # tree_mtad, and multinomial and spd (run on the other tasks)
    assert len(rows) == 2 + len(DECODERS) + 2 + 1 + 2, rows
    assert len({_columns(r) for r in rows}) == 1, rows
    assert not re.search(r"<[A-Za-z/!?]", md)  # <script>, <b>, <img>, <i>: no HTML opened
    assert "&lt;script>alert(1)&lt;/script>" in md
    for line in md.splitlines():  # no line break from a name started a row or a list item
        assert not line.startswith(("| forged", "| row", "<img")), line
    notes = md.split("Notes:", 1)[1]
    assert "failed (humaneval: tree_mtad): =HYPERLINK" in notes and "&lt;img" in notes


def test_latex_escapes_every_special(rendered):
    out, proc = rendered
    assert proc.returncode == 0, proc.stderr[-3000:]
    tex = (out / "table2.tex").read_text()
    body = tex.split("\n", 1)[1]  # after the "% needs ..." comment line
    body = body.replace(r"$\times$", "")  # the renderer's own maths
    assert r"\textbackslash textbf\{x\}" in body and r"\$x\$" in body and "\\textbf{x}" not in body
    for ch in "%$#_^~":
        assert not re.search(rf"(?<!\\){re.escape(ch)}", body.replace(r"\textasciicircum ", "")
                             .replace(r"\textasciitilde ", "")), ch
    rows = [line for line in body.splitlines() if line.rstrip().endswith(r"\\")]
    assert len({len(re.findall(r"(?<!\\)&", r)) for r in rows}) == 1, rows  # no forged cell
    caption = re.search(r"\\caption\{(.*)\}", body).group(1)
    assert r"=pair\textbar" not in caption and r"\$\textasciicircum \$" in caption


def test_claims_report_and_audit_escape_names(tmp_path):
    from mtad.analysis import claims_report
    from mtad.analysis.claims import Row
    from mtad.run.audit import render_table

    row = Row(1, "=t|x\ny", "a vs b", "perplexity", "-1%", estimate=0.9, ci_low=0.8, ci_high=1.0,
              n=10, headline=True, detail="=cmd\n| forged | <script>")
    claims_report.write_csv([row], tmp_path / "claims.csv")
    (rec,) = csv.DictReader((tmp_path / "claims.csv").open(newline=""))
    assert rec["task"] == "'=t|x\ny" and rec["detail"].startswith("'=cmd") and rec["paper"] == "-1%"
    claims_report.write_markdown([row], ["=d on a|b\n- forged item <b>"], tmp_path / "claims.md",
                                 data={"a|b\nc": [("src|<i>", True)]})
    md = (tmp_path / "claims.md").read_text()
    assert not re.search(r"<[A-Za-z/!?]", md) and "\n- forged item" not in md
    assert "\n| forged" not in md and "| a\\|b c | src\\|&lt;i> | yes |" in md
    audit = render_table([{"point": "p|q\n| x |", "decoder": "<b>", "task": "a|b", "index": 0,
                           "turn": 0, "result": "identical", "made_by": "x\ny", "point_last_run": "m",
                           "audited_on": "m"}], ["p|q\n| x |"])
    assert "\n| x |" not in audit and "<b>" not in audit and "`p\\|q \\| x \\|`" in audit


def test_names_stored_as_other_json_values_are_text():
    """A name stored as a number, list or mapping is its JSON text (pandas could not group
    rows by a mapping: the renderer stopped with a traceback)."""
    from mtad.analysis.names import decoder_name, pair_name, task_name

    assert task_name({"task": {"x": 1}}, {}) == '{"x": 1}'
    assert decoder_name({"decoder": ["a", 2]}, {}) == '["a", 2]'
    assert pair_name({"model": 5}, {}) == "5" and task_name({}, {"task": {}}) is None

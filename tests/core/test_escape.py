"""Escaping text from results folders for each output format (mtad.core.escape)."""

from __future__ import annotations

import csv
import io
import re

import pandas as pd
import pytest

from mtad.core import escape

#: Names a results folder may hold, each aimed at one format.
HOSTILE = ["=cmd|' /C calc'!A0", "+1", "-2+3", "@SUM(A1:A2)", "\t=1", "\r=1", "a|b", "a\nb", "a\r\n| x | y |",
           "<script>alert(1)</script>", r"\textbf{x}", "$x$", r"$\textbf{x}$", "$^$", "a/b", "../x",
           "%", "&", "_", "#", "~^", "a\x00b", "\ud800", "x" * 5000]
#: Names of the committed tables: no function may change them (latex escapes "_" only).
ORDINARY = ["tree_mtad", "mtad (gamma=2, tau=0.5)", "qwen_coder_offline", "cnn_dailymail", "pass@1",
            "spd", "1.23 [1.10, 1.30]", "–", "n/a", "2.00×", "-0.5", "+1.5e-3", "12"]


@pytest.mark.parametrize("name", ORDINARY)
def test_ordinary_names_pass_unchanged(name):
    assert escape.csv_cell(name, numbers=True) == name
    assert escape.csv_cell(name) == (name if name[0] not in "+-" else "'" + name)
    assert escape.md_cell(name) == escape.md_text(name) == name
    assert escape.plot_text(name) == name
    assert escape.latex(name) == name.replace("_", r"\_")


@pytest.mark.parametrize("name", HOSTILE)
def test_csv_cells_are_never_formulas(name):
    cell = escape.csv_cell(name)
    assert not cell.startswith(("=", "+", "-", "@", "\t", "\r", "\n")) and "\x00" not in cell
    buf = io.StringIO()
    csv.writer(buf).writerow([cell, "next"])
    buf.getvalue().encode("utf-8")  # writable
    (back, nxt), = csv.reader(io.StringIO(buf.getvalue()))
    assert back == cell and nxt == "next"
    assert escape.csv_cell(-0.5) == -0.5 and escape.csv_cell(None) is None
    assert escape.csv_cell("-0.5", numbers=True) == "-0.5"  # a formatted number in a number column
    if name.startswith(("=", "+", "-", "@", "\t", "\r")) and not re.fullmatch(r"[+-]\d+", name):
        assert escape.csv_cell(name, numbers=True).startswith("'")


@pytest.mark.parametrize("name", HOSTILE)
def test_markdown_cells_keep_the_table_shape(name):
    cell, line = escape.md_cell(name), escape.md_text(name)
    for text in (cell, line):
        assert "\n" not in text and "\r" not in text and "\x00" not in text
        assert not re.search(r"<[A-Za-z/!?]", text)  # opens no HTML
        text.encode("utf-8")
    row = f"| {cell} | 1 |"
    assert len(re.findall(r"(?<!\\)\|", row.replace("\\\\", ""))) == 3  # no forged column


@pytest.mark.parametrize("name", HOSTILE)
def test_html_and_latex_escape_every_special(name):
    h = escape.html(name)
    assert "<" not in h and ">" not in h and '"' not in h and "\n" not in h
    tex = escape.latex(name)
    bare = tex.replace(r"\textbackslash ", "").replace(r"\textasciitilde ", "").replace(
        r"\textasciicircum ", "").replace(r"\space ", "")
    for ch in "&%$#_{}":
        assert not re.search(rf"(?<!\\){re.escape(ch)}", bare), (name, tex)
    assert "\\" not in re.sub(r"\\[&%$#_{}]", "", bare), (name, tex)
    assert "\n" not in tex and "\r" not in tex


def test_latex_agrees_with_pandas_styler():
    values = ["a_b", r"\x y", "~ z", "^ w", "50% & $1 #2 {3}"]
    frame = pd.DataFrame({"v": values})
    tex = frame.style.format(escape="latex").hide(axis="index").to_latex()
    for v in values:
        assert escape.latex(v) in tex


@pytest.mark.parametrize("name", HOSTILE)
def test_plot_labels_draw_as_plain_text(name):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = escape.plot_text(name)
    assert len(label) <= escape.PLOT_CHARS + 1  # "\$" counts two
    fig, ax = plt.subplots()
    try:
        ax.set_title(label)
        ax.plot([0, 1], label="x" + label)
        ax.legend()
        fig.canvas.draw()  # mathtext would raise on "$\textbf{x}$" or "$^$"
        shown = ax.title.get_text()
    finally:
        plt.close(fig)
    assert shown == label and escape.plot_text("$x$") == r"\$x\$"


def test_file_parts_are_safe_bounded_and_distinct(tmp_path):
    names = HOSTILE + ORDINARY + ["a_b", "A_B", ".", "..", ""]
    parts = escape.unique_file_parts(names)
    assert len({p.lower() for p in parts.values()}) == len(parts)
    for name, part in parts.items():
        assert re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", part), (name, part)
        assert len(part) <= escape.FILE_CHARS + 3 and ".." not in part.split("-")[0][:2]
        (tmp_path / f"pareto_{part}.png").write_bytes(b"")
    assert {p.name for p in tmp_path.iterdir()} == {f"pareto_{p}.png" for p in parts.values()}
    assert escape.file_part("humaneval") == "humaneval" and escape.file_part("a/b") != escape.file_part("a_b")

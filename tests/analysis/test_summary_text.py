"""The README and the notes say what the committed report and tables say.

The README's claims summary is generated from ``results/claims/claims.csv``
(``mtad.analysis.summary_text``) and must be what the committed csv gives; every decimal number
in the notes appended to the report and the tables must be one the rendered output (or the
file the note cites) shows, to the digits the note gives.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtad.analysis.summary_text import block, current_block, summary

ROOT = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+(?![\w.]*\d)")


def test_readme_claims_summary_is_generated_from_the_committed_report():
    readme = (ROOT / "README.md").read_text()
    found = current_block(readme)
    assert found is not None, "README.md lost its claims-summary block"
    assert found == block(summary(ROOT / "results/claims/claims.csv")), (
        "README.md's claims summary differs from results/claims/claims.csv: run "
        "python -m mtad.analysis.summary_text README.md")


def numbers(text: str) -> list[str]:
    return NUMBER.findall(text)


def backed(number: str, source: str) -> bool:
    """Whether ``source`` shows ``number`` to its digits (a longer number rounding to it counts)."""
    digits = len(number.split(".")[1])
    want = float(number)
    return any(abs(round(float(x), digits) - want) < 1e-9 for x in numbers(source))


def _body(path: Path, cut: str) -> str:
    text = path.read_text()
    return text.split(cut, 1)[0]


NOTES = [
    ("experiments/claims_notes.md", ["results/claims/claims.md"], "\n## Notes\n"),
    ("experiments/table2_cpu_notes.md", ["results/table2_cpu/table2.md"], "## About this table"),
    ("experiments/ablations_cpu_notes.md",
     ["results/ablation_tau_cpu/table2.md", "results/ablation_gamma_cpu/table2.md",
      "results/ablation_width_cpu/table2.md", "results/approx_error/approx_error.md"],
     "## About this table"),
]


@pytest.mark.parametrize("notes,sources,cut", NOTES, ids=[n for n, _, _ in NOTES])
def test_every_number_in_the_notes_is_in_the_rendered_output(notes, sources, cut):
    source = "\n".join(_body(ROOT / s, cut) for s in sources)
    missing = [x for x in numbers((ROOT / notes).read_text()) if not backed(x, source)]
    assert not missing, f"{notes} states numbers its rendered output does not show: {missing}"


def test_backed_matches_to_the_digits_given():
    assert backed("3.76", "joint perplexity 3.7604")
    assert not backed("3.77", "joint perplexity 3.7604")
    assert numbers("ratio 0.788 and v1.2.3 and -0.05") == ["0.788", "-0.05"]


def test_percentages_are_claims_csv_values_never_rounded_again():
    """A percentage in the summary is claims.csv's value itself (times 100), with the digits the
    CSV holds: rounding the CSV's rounded value again could move the last digit."""
    from mtad.analysis.summary_text import _pct

    assert _pct(0.1095) == "+10.95%" and _pct(0.1075) == "+10.75%" and _pct(-0.08453) == "-8.453%"
    for x in (0.1095, 0.1075, -0.05183, 0.004258):
        assert f"{float(_pct(x).rstrip('%')) / 100:.4g}" == f"{x:.4g}"  # the CSV's digits, all of them

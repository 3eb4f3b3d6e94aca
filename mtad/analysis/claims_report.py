"""The claims report's outputs: ``claims.csv``, ``claims.md`` and ``perplexity_ratio.png``.

Writes the rows ``mtad.analysis.claims`` computed; knows how to show them (the headline table, one
table per claim, the sample-size sections, the task data, the multiplicity summary) and
nothing about records or statistics. Text that can come from records (task names, data
sources, details, the notes on the points read) is escaped for each format
(``mtad.core.escape``).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from mtad.analysis.claims import (
    ALL,
    ALPHA,
    CONTRADICTED,
    EQUIVALENCE,
    FIELDS,
    HOLDS,
    MIN_PAIRS,
    NON_INFERIORITY,
    OPEN,
    PAPER_PPL_EFFECT,
    PPL_EQUIVALENCE,
    TASKS,
    Row,
    _nan,
)
from mtad.core import stats
from mtad.core.escape import csv_cell, md_cell, md_text, plot_text
from mtad.core.io import replacing, save_figure, write_text_atomic

NAMES = {
    1: "MTAD / tree-MTAD perplexity lower than multinomial and SpD",
    2: "tree-MTAD block efficiency higher than SpD, SpecInfer and MCSS",
    3: "MTAD / tree-MTAD task scores at least SpD's and multinomial's (non-inferiority)",
    4: "tree-MTAD faster than SpD and MCSS (interleaved CPU speed benchmark)",
    5: "SpD and multinomial equivalent (perplexity and scores)",
    6: "MTAD / tree-MTAD task scores higher than multinomial's and the lossless baselines'",
    7: "tree-MTAD uses less energy than SpD and MCSS",
}


def needed_n(row: Row, width: float = PAPER_PPL_EFFECT) -> int | None:
    """Pairs needed for a ratio interval narrower than ``width`` (interval width ~ 1/sqrt(n))."""
    w = row.ci_high - row.ci_low
    if _nan(w) or row.n < 2 or w <= 0:
        return None
    return max(row.n, math.ceil(row.n * (w / width) ** 2))


def equivalence_band_width(metric: str) -> float:
    """Width of claim 5's equivalence band for a metric (perplexity ratio, binary, Rouge-L)."""
    if metric.startswith("perplexity"):
        return PPL_EQUIVALENCE[1] - PPL_EQUIVALENCE[0]
    return 2 * EQUIVALENCE["rouge" if "rouge" in metric.lower() else "binary"]


def _fmt(x) -> str:
    if isinstance(x, float):
        return "" if math.isnan(x) else f"{x:.4g}"
    return str(x)


def _ci(r: Row) -> str:
    return f"[{_fmt(r.ci_low)}, {_fmt(r.ci_high)}]" if not _nan(r.ci_low, r.ci_high) else ""


#: Fields written as this module states them, not from records: the paper's figures
#: ("-21.2% (ratio 0.788)"), which ``csv_cell`` would mark as text.
AUTHORED = ("paper",)


def write_csv(rows: Sequence[Row], path: Path) -> None:
    with replacing(path, newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(v) if k in AUTHORED else csv_cell(_fmt(v), numbers=not isinstance(v, str))
                        for k, v in asdict(r).items() if k in FIELDS})


def verdict_counts(rows: Sequence[Row], key: str = "verdict") -> dict[str, int]:
    counts = dict.fromkeys((HOLDS, CONTRADICTED, OPEN), 0)
    for r in rows:
        counts[getattr(r, key)] += 1
    return counts


def _headline(rows: Sequence[Row]) -> list[str]:
    out = [
        "## Headline: the paper's figures",
        "",
        "The pooled row of every claim and the paper's per-task figures. Direction: does the "
        "interval lie on the claimed side; size: is the paper's figure inside the interval, one "
        "that tells it from no effect (`consistent`) or one too wide to (`inconclusive`: it also "
        "holds no effect, or is wider than the figure's distance from no effect), or does the "
        "interval show a `smaller` / `larger` effect (blank: the "
        "paper states no size); Holm: the direction verdict after Holm's adjustment over the "
        "report's tests (section Multiplicity).",
        "",
        "| claim | task | comparison | metric | paper | estimate | 95% CI | n | direction | size | Holm |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in rows if r.headline):
        out.append(_row(r.claim, r.task, r.comparison, r.metric, r.paper, _fmt(r.estimate), _ci(r),
                        _n(r), r.verdict, r.size, r.holm_verdict))
    return out + [""]


def _n(r: Row) -> str:
    """n, with the provenance marks of the row's points (``30 [cd]``, as the tables show them)."""
    return f"{r.n} [{r.marks}]" if r.marks else str(r.n)


def _marks_note(rows: Sequence[Row]) -> list[str]:
    from mtad.analysis.provenance_marks import MARKS, marks_footnote

    note = marks_footnote((m for m in MARKS if any(m in r.marks for r in rows)), where="a row's n",
                          whose="the records of the points it compares (any of them)")
    return [md_text(note), ""] if note else []


def _row(*cells) -> str:
    """A Markdown table row, every cell escaped (``md_cell``)."""
    return "| " + " | ".join(md_cell(c) for c in cells) + " |"


def _multiplicity(rows: Sequence[Row]) -> list[str]:
    tested = [r for r in rows if not _nan(r.p_value)]
    bh = stats.benjamini_hochberg([r.p_value for r in tested])
    raw = sum(r.verdict == HOLDS for r in tested)
    holm = sum(r.holm_verdict == HOLDS for r in tested)
    bh_holds = sum(r.verdict == HOLDS and q < ALPHA for r, q in zip(tested, bh))
    return [
        "## Multiplicity",
        "",
        f"Each verdict-bearing row is one one-sided test at level {ALPHA} (the bound of its 95% "
        "interval; equivalence: two one-sided tests, the larger p); its p-value inverts the same "
        "bootstrap (`mtad.core.stats.p_value`). One family: every such row of this report, per task "
        f"and pooled, all claims ({len(tested)} tests). Holm's step-down adjustment controls the "
        f"family-wise error at {ALPHA} under any dependence; Benjamini-Hochberg, shown for "
        f"comparison, the false discovery rate. `holds`: {raw} raw, {holm} after Holm, "
        f"{bh_holds} after Benjamini-Hochberg. `contradicted` verdicts are shown unadjusted.",
        "",
    ]


def _task_data(data: dict[str, list[tuple[str, bool | None]]]) -> list[str]:
    out = ["## Task data", "",
           "Data each task's records were generated from (`data_source` in the points' "
           "summaries); a stand-in (`data_substitute: true`) is not the paper's data set.", "",
           "| task | data | stand-in |", "|---|---|---|"]
    for task, sources in data.items():
        for source, sub in sources:
            out.append(_row(task, source, "yes" if sub else "no" if sub is False else "?"))
    return out + [""]


def write_markdown(rows: Sequence[Row], notes: Sequence[str], path: Path, extra: str = "",
                   data: dict | None = None) -> None:
    out = [
        "# The paper's claims on paired records",
        "",
        "Generated by `python -m mtad.analysis.claims`; definitions and verdict rules in `docs/claims.md` "
        "and `mtad/analysis/claims.py`. Intervals: 95% paired bootstrap (percentile, 9999 resamples, "
        "fixed seed); n = paired examples.",
        "",
        "Declared margins: non-inferiority (claim 3) "
        f"{NON_INFERIORITY['binary']:+g} for EX and pass@1, {NON_INFERIORITY['rouge']:+g} for "
        f"Rouge-L; equivalence (claim 5) perplexity ratio in {list(PPL_EQUIVALENCE)}, scores "
        f"within +-{EQUIVALENCE['binary']:g} (binary) and +-{EQUIVALENCE['rouge']:g} (Rouge-L).",
        "",
    ]
    counts, holm = verdict_counts(rows), verdict_counts(rows, "holm_verdict")
    out += ["Direction verdicts: " + ", ".join(f"{v}: {counts[v]}" for v in counts)
            + "; after Holm: " + ", ".join(f"{v}: {holm[v]}" for v in holm), ""]
    out += _marks_note(rows)
    out += _headline(rows)
    if data:
        out += _task_data(data)
    for claim, title in NAMES.items():
        out += [
            f"## Claim {claim}: {title}",
            "",
            "| task | comparison | metric | paper | estimate | 95% CI | n | direction | size | p | Holm | detail |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in rows if r.claim == claim):
            p = f"{r.p_value:.2g}" if not _nan(r.p_value) else ""
            out.append(_row(r.task, r.comparison, r.metric, r.paper, _fmt(r.estimate), _ci(r), _n(r),
                            r.verdict, r.size, p, r.holm_verdict, r.detail))
        out.append("")
    out += _multiplicity(rows)
    out += [
        "## Sample size for claim 1",
        "",
        "Interval width at the current n, and the n that makes it narrower than the paper's "
        f"effect ({PAPER_PPL_EFFECT:.1%}), assuming width ~ 1/sqrt(n).",
        "",
        "| task | comparison | n | width | n needed |",
        "|---|---|---|---|---|",
    ]
    for r in (r for r in rows if r.claim == 1):
        need = needed_n(r)
        out.append(_row(r.task, r.comparison, r.n, _fmt(r.ci_high - r.ci_low),
                        need if need is not None else ""))
    out += [
        "",
        "## Sample size for claim 5",
        "",
        "Equivalence holds only when the whole interval lies inside the band, so even with no "
        "true difference the interval must be narrower than the band: the n that makes it so "
        "(width ~ 1/sqrt(n)); more is needed when the estimate is off-centre.",
        "",
        "| task | metric | n | width | band width | n needed |",
        "|---|---|---|---|---|---|",
    ]
    for r in (r for r in rows if r.claim == 5):
        band = equivalence_band_width(r.metric)
        need = needed_n(r, band)
        out.append(_row(r.task, r.metric, r.n, _fmt(r.ci_high - r.ci_low), f"{band:g}",
                        need if need is not None else ""))
    out += ["", "## Points read", ""] + ([f"- {md_text(n)}" for n in notes] or ["- none"])
    if extra:
        out += ["", "## Notes", "", extra.strip()]
    write_text_atomic(path, "\n".join(out) + "\n")


def plot_perplexity(rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"text.usetex": False}):  # labels are plain text (plot_text)
        _draw_perplexity(rows, path, plt)


def _draw_perplexity(rows: Sequence[Row], path: Path, plt) -> None:
    ppl = [r for r in rows if r.metric.startswith("perplexity")]
    comparisons = list(dict.fromkeys(r.comparison for r in ppl))
    fig, ax = plt.subplots(figsize=(12, 5.2))
    ax.axhspan(*PPL_EQUIVALENCE, color="0.9", label=f"equivalence band {list(PPL_EQUIVALENCE)}")
    ax.axhline(1.0, color="0.4", lw=1)
    ax.axhline(
        1 - PAPER_PPL_EFFECT,
        color="black",
        ls=":",
        lw=1,
        label=f"paper: {1 - PAPER_PPL_EFFECT:.3f} (-{PAPER_PPL_EFFECT:.1%} vs multinomial)",
    )
    width = 0.8 / max(len(comparisons), 1)
    for j, comp in enumerate(comparisons):
        xs, ys, lo, hi = [], [], [], []
        for i, task in enumerate((*TASKS, ALL)):
            r = next((r for r in ppl if r.task == task and r.comparison == comp), None)
            if r is None or _nan(r.estimate) or r.n < MIN_PAIRS:
                continue  # too few pairs for an interval worth drawing (no verdict either)
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(r.estimate)
            lo.append(r.estimate - r.ci_low if not _nan(r.ci_low) else 0)
            hi.append(r.ci_high - r.estimate if not _nan(r.ci_high) else 0)
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, label=plot_text(comp))

    def label(task: str) -> str:
        ns = sorted({r.n for r in ppl if r.task == task})
        lo, hi = (ns[0], ns[-1]) if ns else (0, 0)
        n = f"n={lo}" if lo == hi else f"n={lo}-{hi}"
        name = "all tasks, equal weights" if task == ALL else plot_text(task)
        return f"{name}\n({n}{f'; < {MIN_PAIRS} not drawn' if lo < MIN_PAIRS else ''})"

    ax.axvline(len(TASKS) - 0.5, color="0.6", lw=0.8)
    ax.set_xticks(range(len(TASKS) + 1), [label(t) for t in (*TASKS, ALL)])
    ax.set_ylabel("perplexity ratio a / b (geometric means)")
    ax.set_title("Perplexity ratio per task and pooled, 95% paired bootstrap intervals (below 1: a is lower)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)

"""The README's summary of the claims report, generated from ``claims.csv``.

    python -m mtad.analysis.summary_text README.md [--csv results/claims/claims.csv]

rewrites the block between ``<!-- claims-summary:begin -->`` and ``<!-- claims-summary:end -->``
of the file; ``tests/analysis/test_summary_text.py`` checks that the committed README holds what
the committed ``claims.csv`` gives. Every finding is worded by its Holm-adjusted verdict (the
raw one beside it where they differ) and, where the paper states a figure, its size verdict.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from pathlib import Path

from mtad.core.escape import md_text

BEGIN, END = "<!-- claims-summary:begin -->", "<!-- claims-summary:end -->"
CSV = Path("results/claims/claims.csv")


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open()))


def _f(x: str) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _get(rows: list[dict], claim: int, task: str, comparison: str, metric: str | None = None) -> dict:
    for r in rows:
        if (int(r["claim"]) == claim and r["task"] == task and r["comparison"] == comparison
                and (metric is None or r["metric"] == metric)):
            return r
    raise KeyError(f"claims.csv has no row for claim {claim}, {task}, {comparison}")


def _num(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def _pct(x: float) -> str:
    """``x`` as a percentage with the significant digits claims.csv holds, never rounded twice."""
    return f"{x * 100:+.4g}%"


def _iv(r: dict, digits: int = 3, pct: bool = False) -> str:
    e, lo, hi = _f(r["estimate"]), _f(r["ci_low"]), _f(r["ci_high"])
    if pct:  # at claims.csv's own precision (4 significant digits): rounding again could move a digit
        return f"{_pct(e)} [{_pct(lo)}, {_pct(hi)}]"
    return f"{_num(e, digits)} [{_num(lo, digits)}, {_num(hi, digits)}]"


def _verdict(r: dict) -> str:
    """The Holm-adjusted verdict, with the raw one when they differ, and the size verdict."""
    holm, raw, size = r["holm_verdict"], r["verdict"], r.get("size") or ""
    text = holm + (f" after Holm, {raw} unadjusted" if holm != raw else " after Holm")
    return text + (f"; size {size}" if size else "")


def _sizes(rows: list[dict], comparison: str) -> str:
    """Per-task size verdicts of claim 1 vs multinomial, grouped: "consistent on a, b; smaller on c"."""
    by: dict[str, list[str]] = {}
    for r in rows:
        if int(r["claim"]) == 1 and r["comparison"] == comparison and r["task"] != "all" and r["size"]:
            by.setdefault(r["size"], []).append(r["task"])
    return "; ".join(md_text(f"{k} on {', '.join(v)}") for k, v in sorted(by.items()))


def summary(path: Path = CSV) -> str:
    rows = _rows(path)
    family = [r for r in rows if not math.isnan(_f(r["p_value"]))]
    raw = sum(r["verdict"] == "holds" for r in family)
    holm = sum(r["holm_verdict"] == "holds" for r in family)
    contra = sum(r["verdict"] == "contradicted" for r in rows)
    ppl = "perplexity ratio (geometric means)"
    m1, t1 = _get(rows, 1, "all", "mtad vs multinomial"), _get(rows, 1, "all", "tree_mtad vs multinomial")
    he = _get(rows, 1, "humaneval", "mtad vs multinomial")
    g_m = _get(rows, 6, "all", "mtad vs multinomial")
    g_l = next(r for r in rows if int(r["claim"]) == 6 and r["task"] == "all" and r["comparison"].startswith("tree_mtad vs lossless"))
    be = {b: _get(rows, 2, "all", f"tree_mtad vs {b}") for b in ("spd", "specinfer", "mcss")}
    be_tasks = [r for r in rows if int(r["claim"]) == 2 and r["task"] != "all"]
    be_not = [md_text(f"{r['task']} vs {r['comparison'].split(' vs ')[1]}") for r in be_tasks
              if r["holm_verdict"] != "holds"]
    s_spd, s_mcss = _get(rows, 4, "all", "tree_mtad vs spd"), _get(rows, 4, "all", "tree_mtad vs mcss")
    eq = _get(rows, 5, "spider", "spd vs multinomial", ppl)
    eq_all = [r for r in rows if int(r["claim"]) == 5]
    eq_holds = [r for r in eq_all if r["holm_verdict"] == "holds"]
    lines = [
        f"Of the report's {len(family)} tests (the Holm family), {raw} hold unadjusted and {holm} "
        f"after Holm; {contra} contradicted. On Qwen2.5-Coder 1.5B / 0.5B:",
        "",
        f"- Perplexity, paper -21.2% vs multinomial (ratio 0.788): pooled MTAD {_iv(m1)} "
        f"({_verdict(m1)}), tree-MTAD {_iv(t1)} ({_verdict(t1)}). Per task, MTAD's size is "
        f"{_sizes(rows, 'mtad vs multinomial')}; tree-MTAD's {_sizes(rows, 'tree_mtad vs multinomial')} "
        f"(HumanEval MTAD {_iv(he)}, {he['holm_verdict']} after Holm, n = {he['n']}).",
        f"- Downstream, paper +43%: MTAD vs multinomial {_iv(g_m, pct=True)} pooled ({_verdict(g_m)}); "
        f"tree-MTAD vs the lossless baselines (paper +42.7%) {_iv(g_l, pct=True)} ({_verdict(g_l)}).",
        "- Block efficiency, tree-MTAD minus each baseline, pooled: "
        + ", ".join(f"{b} {_iv(r, 2)}" for b, r in be.items())
        + f" (every pooled row {'holds' if all(r['holm_verdict'] == 'holds' for r in be.values()) else 'does not hold'} after Holm"
        + (f"; per task not resolved after Holm: {', '.join(be_not)})." if be_not else "; so does every per-task row)."),
        f"- Speed (claim 4's interleaved CPU benchmark, `{CLAIM4_FILE}`): tree-MTAD/SpD {_iv(s_spd)}, paper "
        f"1.42x ({_verdict(s_spd)}); tree-MTAD/MCSS {_iv(s_mcss)}, paper +21.1% ({_verdict(s_mcss)}). "
        "Energy: not measurable on this machine (no power counters).",
        f"- SpD and multinomial equivalent (claim 5): {len(eq_holds)} of {len(eq_all)} rows hold after Holm; "
        f"closest, Spider's perplexity ratio {_iv(eq)} at n = {eq['n']} ({_verdict(eq)}).",
    ]
    return "\n".join(lines)


CLAIM4_FILE = "results/bench/speed_claim4_cpu.json"


def block(text: str) -> str:
    return (f"{BEGIN}\n<!-- generated from {CSV} by `python -m mtad.analysis.summary_text README.md`; "
            f"tests/analysis/test_summary_text.py checks it -->\n{text}\n{END}")


def current_block(readme: str) -> str | None:
    m = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), readme, re.S)
    return m.group(0) if m else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mtad.analysis.summary_text", description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path, help="the file holding the block (README.md)")
    ap.add_argument("--csv", type=Path, default=CSV)
    args = ap.parse_args(argv)
    text = args.file.read_text()
    old = current_block(text)
    if old is None:
        print(f"{args.file}: no {BEGIN} ... {END} block; add the two markers where the summary goes",
              file=sys.stderr)
        return 2
    args.file.write_text(text.replace(old, block(summary(args.csv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

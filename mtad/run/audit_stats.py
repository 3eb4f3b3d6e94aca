"""The statistical audit: do regenerated records give the metrics the committed ones gave?

Records made on another kind of machine (another bfloat16 kernel, another thread count) cannot
regenerate bit for bit: a rounding difference changes a draw, and the sequences part. What can
still be checked is whether today's code draws from the same distribution: regenerate a point's
examples (``mtad-audit --records ...``, which keeps both records' metrics in each row,
``mtad.run.audit.record_metrics``) and compare the metrics example by example.

Per example (its turns pooled, as the tables pool them, ``docs/results.md``):

* log-perplexity = sum of NLL / sum of new tokens; compared as the ratio of geometric means,
  regenerated / committed (``mtad.core.stats.perplexity_ratio``);
* block efficiency = sum of new tokens / sum of steps; compared as the mean difference;
* score = mean over the turns that hold one; compared as the difference of means (0/1 scores:
  ``binary_difference``, with McNemar's exact p).

Each comparison is paired by example, with a percentile bootstrap interval over examples at
``LEVEL`` = 1 - 0.05 / 3 (95% with a Bonferroni correction over the three metrics of a point).
**Criterion:** a point is *consistent* when every interval holds "no difference" (ratio 1,
difference 0) and *not consistent* otherwise (the metrics named); with fewer than
``MIN_EXAMPLES`` (5) audited examples it gets no verdict. Consistent says the audit
found no disagreement at its sample size, not that the metrics are equal: the intervals say how
large a difference it could have missed. A metric whose paired differences are all equal has
no bootstrap interval: all zero is "no difference" (the records agree); all equal and non-zero
counts as a difference.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from mtad.core.escape import md_cell

#: The interval level: 95% with a Bonferroni correction over the three metrics of a point.
LEVEL = 1 - 0.05 / 3
METRIC_NAMES = ("perplexity", "block efficiency", "score")
#: Fewer paired examples than this get no verdict: a bootstrap over so few pairs is no interval.
MIN_EXAMPLES = 5


def per_example(rows: list[dict], which: str) -> dict[str, dict[str, float | None]]:
    """example id -> pooled metrics of the ``which`` (``recorded`` / ``regenerated``) records."""
    acc: dict[str, dict[str, Any]] = defaultdict(lambda: {"nll": 0.0, "tokens": 0, "steps": 0, "scores": [],
                                                          "nll_missing": False})
    for r in rows:
        m = (r.get("metrics") or {}).get(which) or {}
        a = acc[r["example_id"]]
        a["tokens"] += int(m.get("new_tokens") or 0)
        a["steps"] += int(m.get("steps") or 0)
        if m.get("nll_sum") is None:
            a["nll_missing"] = True
        else:
            a["nll"] += float(m["nll_sum"])
        if m.get("score") is not None:
            a["scores"].append(float(m["score"]))
    out = {}
    for ex, a in acc.items():
        out[ex] = {
            "log_ppl": None if a["nll_missing"] or not a["tokens"] else a["nll"] / a["tokens"],
            "be": a["tokens"] / a["steps"] if a["steps"] else None,
            "score": sum(a["scores"]) / len(a["scores"]) if a["scores"] else None,
        }
    return out


def _holds_none(iv, ref: float, diffs: list[float]) -> bool | None:
    """Whether the interval holds ``ref`` (no difference); without an interval (no spread):
    whether every paired difference is zero. None: nothing compared."""
    if iv.n == 0:
        return None
    if math.isnan(iv.low) or math.isnan(iv.high):
        return all(abs(d) == 0 for d in diffs)
    return iv.low <= ref <= iv.high


def compare_point(rows: list[dict]) -> dict[str, Any]:
    """The three paired comparisons of one point's audited rows (those that kept metrics)."""
    from mtad.core import stats

    rec, now = per_example(rows, "recorded"), per_example(rows, "regenerated")
    exs = sorted(rec)
    result: dict[str, Any] = {"examples": len(exs), "records": len(rows),
                              "identical": sum((r.get("fields") or {}).get("tokens") == "same" for r in rows),
                              "metrics": {}}
    pairs = {
        "perplexity": [(rec[e]["log_ppl"], now[e]["log_ppl"]) for e in exs],
        "block efficiency": [(rec[e]["be"], now[e]["be"]) for e in exs],
        "score": [(rec[e]["score"], now[e]["score"]) for e in exs],
    }
    for name, ps in pairs.items():
        ps = [(a, b) for a, b in ps if a is not None and b is not None]
        if not ps:
            result["metrics"][name] = None
            continue
        a = [p[1] for p in ps]  # regenerated
        b = [p[0] for p in ps]  # committed
        diffs = [x - y for x, y in zip(a, b)]
        if name == "perplexity":
            iv = stats.perplexity_ratio(a, b, level=LEVEL)
            entry = {"committed": math.exp(sum(b) / len(b)), "regenerated": math.exp(sum(a) / len(a)),
                     "estimate": iv.estimate, "low": iv.low, "high": iv.high, "statistic": "ratio of geometric means"}
            holds = _holds_none(iv, 1.0, diffs)
        else:
            binary = name == "score" and all(v in (0.0, 1.0) for v in a + b)
            iv = (stats.binary_difference(a, b, level=LEVEL) if binary
                  else stats.mean_difference(a, b, level=LEVEL))
            entry = {"committed": sum(b) / len(b), "regenerated": sum(a) / len(a), "estimate": iv.estimate,
                     "low": iv.low, "high": iv.high, "statistic": "difference of means",
                     **({"p_mcnemar": iv.p_value} if binary else {})}
            holds = _holds_none(iv, 0.0, diffs)
        entry.update(n=len(ps), consistent=holds)
        result["metrics"][name] = entry
    differing = [k for k, v in result["metrics"].items() if v is not None and v["consistent"] is False]
    compared = [k for k, v in result["metrics"].items() if v is not None]
    result["verdict"] = ("nothing compared" if not compared else
                         f"too few examples for a verdict (fewer than {MIN_EXAMPLES})" if len(exs) < MIN_EXAMPLES else
                         "consistent" if not differing else "not consistent: " + ", ".join(differing))
    return result


def _cell(entry: dict | None, digits: int = 3) -> str:
    if entry is None:
        return "–"
    if math.isnan(entry["low"]):
        span = "no spread" if entry["consistent"] else "no spread, all differ alike"
        return f"{entry['committed']:.{digits}f} → {entry['regenerated']:.{digits}f}; {entry['estimate']:+.{digits}f} ({span})" \
            if entry["statistic"] != "ratio of geometric means" else \
            f"{entry['committed']:.{digits}f} → {entry['regenerated']:.{digits}f}; ×{entry['estimate']:.{digits}f} ({span})"
    if entry["statistic"] == "ratio of geometric means":
        return (f"{entry['committed']:.{digits}f} → {entry['regenerated']:.{digits}f}; "
                f"×{entry['estimate']:.{digits}f} [{entry['low']:.{digits}f}, {entry['high']:.{digits}f}]")
    return (f"{entry['committed']:.{digits}f} → {entry['regenerated']:.{digits}f}; "
            f"{entry['estimate']:+.{digits}f} [{entry['low']:+.{digits}f}, {entry['high']:+.{digits}f}]")


def render(rows: list[dict], points: list[str], total_examples: dict[str, int], command: str | None = None,
           notes: str | None = None, replaced: frozenset[str] | set[str] = frozenset()) -> str:
    """Markdown: one row per point given (rows without ``metrics``, audited before metrics were
    kept, are left out and counted). ``replaced``: points whose audited records a rerun has since
    replaced: their row says so (its comparison is of the replaced records)."""
    lines = ["# Statistical audit: do regenerated records give the committed metrics?", ""]
    if command:
        lines += [f"Made by `{command}` (`mtad.run.audit_stats`).", ""]
    lines += [(__doc__ or "").split("\n\n", 1)[1].strip(), ""]
    machines = sorted({r["audited_on"] for r in rows if r["point"] in points})
    if machines:
        lines += ["Regenerated on: " + "; ".join(f"`{md_cell(m)}`" for m in machines), ""]
    lines += ["Each cell: committed → regenerated over the audited examples; the paired estimate "
              f"[{LEVEL:.1%} interval] (perplexity: geometric mean and ratio; block efficiency and score: "
              "means and difference).", "",
              "| point | decoder | task | examples audited (of) | records with the same tokens | made by (point's last run) | "
              "perplexity | block efficiency | score | verdict |",
              "|:--|:--|:--|--:|--:|:--|:--|:--|:--|:--|"]
    by_point: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["point"] in points and r.get("metrics"):
            by_point[r["point"]].append(r)
    verdicts = []
    for point in points:
        rs = by_point.get(point)
        if not rs:
            lines.append(f"| `{md_cell(point)}` | – | – | 0 ({total_examples.get(point, '?')}) | – | – | – | – | – | not audited |")
            continue
        c = compare_point(rs)
        verdicts.append(c["verdict"])
        lines.append("| " + " | ".join(md_cell(x) for x in [
            f"`{point}`", rs[0]["decoder"], rs[0]["task"], f"{c['examples']} ({total_examples.get(point, '?')})",
            f"{c['identical']} of {c['records']}",
            rs[0]["point_last_run"] + ("; these records since replaced by a rerun (reruns/compare.md)"
                                       if point in replaced else ""),
            _cell(c["metrics"]["perplexity"]), _cell(c["metrics"]["block efficiency"]),
            _cell(c["metrics"]["score"]), c["verdict"]]) + " |")
    lines += ["", f"{sum(v == 'consistent' for v in verdicts)} of {len(verdicts)} audited points consistent; "
              f"{sum(v.startswith('not consistent') for v in verdicts)} not consistent; "
              f"{sum(v.startswith('too few') for v in verdicts)} with too few examples; "
              f"{len(points) - len(verdicts)} not audited."]
    if notes:
        lines += ["", "## About this audit", "", notes.strip()]
    return "\n".join(lines) + "\n"

"""The paper's claims, tested on paired per-example records: ``python -m mtad.claims``.

    python -m mtad.claims results/claims --out results/claims

reads every point under the records root (sweeps ``claims``, ``claims_tree`` and
``claims_spider``, through ``mtad.results``), pairs decoders by (example_id, turn) and writes ``claims.csv``,
``claims.md`` and ``perplexity_ratio.png``. One row per (claim, task, decoder pair) with
``claim, task, comparison, metric, paper, estimate, ci_low, ci_high, n, verdict, detail``;
``n`` counts paired examples; intervals are 95% paired bootstraps (``mtad.stats``).

Per-example values (a multi-turn example pools its turns that both decoders have):
log-perplexity = sum of turn NLLs / sum of turn tokens; block efficiency = (accepted +
steps) / steps; score = the example's scored record (Spider EX and HumanEval pass@1 0/1,
CNN/DM Rouge-L).

Claims and verdicts, declared here before any data is read (``EPS`` absorbs float rounding
of the data; NaN intervals are ``not resolved``):

1. MTAD and tree-MTAD have lower perplexity than multinomial and SpD (paper: -21.2% vs
   single-token sampling). Ratio of geometric means a / b: ``holds`` if ci_high < 1,
   ``contradicted`` if ci_low >= 1 (the interval excludes the claimed direction).
2. tree-MTAD has higher block efficiency than SpD and SpecInfer. Mean paired difference:
   ``holds`` if ci_low > 0, ``contradicted`` if ci_high <= 0.
3. MTAD / tree-MTAD task scores are at least SpD's: non-inferiority, difference a - b with
   margin ``NON_INFERIORITY`` (-0.05 for EX and pass@1, -0.01 for Rouge-L): ``holds`` if
   ci_low > margin, ``contradicted`` if ci_high < margin.
4. tree-MTAD is faster than SpD (paper: 1.42x on GPU). From the interleaved speed benchmark
   ``results/bench/speed_cpu.json`` (``bench/speed.py``), not from sweep timings: rows with
   ``mode == "sample"``, decoders ``tree_mtad`` and ``spd``, paired by (task, prompt,
   repeat); ratio of geometric-mean tokens/s: ``holds`` if ci_low > 1, ``contradicted`` if
   ci_high <= 1.
5. SpD and multinomial are equivalent: perplexity ratio inside ``PPL_EQUIVALENCE`` [0.97,
   1.03] and score differences inside +-``EQUIVALENCE`` (0.05 binary, 0.01 Rouge-L):
   ``holds`` if the interval lies inside, ``contradicted`` if it lies wholly outside.

Claims 1, 2 and claim 5's perplexity also have a pooled row, task ``all``: the mean over tasks
of each task's mean paired difference (equal task weights), with a bootstrap stratified by task;
it gets a verdict only when every task has ``MIN_PAIRS`` pairs. Claim-1 rows against
multinomial say in ``detail`` whether the paper's ratio 0.788 lies inside, below or above the
interval (the paper's magnitude, next to the direction the verdict tests).

A decoder or task without records gives rows with n = 0, ``not resolved`` ("no records").
This module knows the claims and the verdict rules; ``mtad.results`` owns the folder format
and ``mtad.stats`` the intervals.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from mtad import stats

TASKS = ("spider", "humaneval", "cnn_dailymail", "chatgpt_prompts", "mt_bench")
ALL = "all"  # the pooled rows: every task with equal weight
# task -> (metric name, kind): kind "binary" (0/1) or "rouge" (continuous in [0, 1])
SCORED = {
    "spider": ("EX", "binary"),
    "humaneval": ("pass@1", "binary"),
    "cnn_dailymail": ("Rouge-L", "rouge"),
}
NON_INFERIORITY = {"binary": -0.05, "rouge": -0.01}  # claim 3 margins (a - b)
EQUIVALENCE = {"binary": 0.05, "rouge": 0.01}  # claim 5 score margins (|a - b|)
PPL_EQUIVALENCE = (0.97, 1.03)  # claim 5 perplexity ratio
#: fewest pairs that get a verdict: a percentile bootstrap over fewer (a partial point, a few
#: benchmark prompts) has far below its nominal coverage; the row shows its interval, not resolved
MIN_PAIRS = 10
PAPER_PPL_EFFECT = 0.212  # claim 1: -21.2% perplexity vs single-token sampling
SPEED_FILE = Path("results/bench/speed_claim4_cpu.json")  # make bench-claim4
SPEED_MODE = "sample"
EPS = 1e-9
HOLDS, CONTRADICTED, OPEN = "holds", "contradicted", "not resolved"
FIELDS = (
    "claim",
    "task",
    "comparison",
    "metric",
    "paper",
    "estimate",
    "ci_low",
    "ci_high",
    "n",
    "verdict",
    "detail",
)

Records = dict[tuple[str, str], dict[tuple[str, int], dict]]  # (decoder, task) -> key -> record


@dataclass
class Row:
    claim: int
    task: str
    comparison: str
    metric: str
    paper: str
    estimate: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    n: int = 0
    verdict: str = OPEN
    detail: str = ""


# ------------------------------------------------------------------------------ verdicts
def _nan(*xs: float) -> bool:
    return any(x is None or math.isnan(x) for x in xs)


def direction(low: float, high: float, ref: float, claimed: str) -> str:
    """The claimed side of ``ref`` ("below" / "above"): holds if the whole interval is strictly
    on it; contradicted if the interval excludes it (touching ``ref`` included)."""
    if _nan(low, high):
        return OPEN
    if claimed == "below":
        return HOLDS if high < ref - EPS else CONTRADICTED if low >= ref - EPS else OPEN
    return HOLDS if low > ref + EPS else CONTRADICTED if high <= ref + EPS else OPEN


def non_inferiority(low: float, high: float, margin: float) -> str:
    if _nan(low, high):
        return OPEN
    return HOLDS if low > margin + EPS else CONTRADICTED if high < margin - EPS else OPEN


def equivalence(low: float, high: float, lo: float, hi: float) -> str:
    if _nan(low, high):
        return OPEN
    if low >= lo - EPS and high <= hi + EPS:
        return HOLDS
    return CONTRADICTED if high < lo - EPS or low > hi + EPS else OPEN


# ------------------------------------------------------------------------------ records
def read_records(root: str | Path) -> tuple[Records, list[str]]:
    """Every point's records under ``root``, by (decoder, task); and notes on what was read.

    The only function that touches results folders (through ``mtad.results``). A point's
    decoder and task are its config-group choices, else its resolved config's names. Two
    points with the same (decoder, task): the one with more records is used, the other noted.
    """
    from mtad.results import INDEX_FILE, PointFolder, is_point_folder, load_point, point_dirs

    root = Path(root)
    if not root.is_dir():
        return {}, [f"{root}: no such folder"]
    if is_point_folder(root) or (root / INDEX_FILE).exists():
        dirs = point_dirs(root)
    else:
        dirs = [
            d
            for sub in sorted(root.iterdir())
            if sub.is_dir() and not sub.name.startswith(".")
            for d in point_dirs(sub)
        ]
    out: Records = {}
    notes: list[str] = []
    for d in dirs:
        if not d.is_dir():
            continue
        point = load_point(d)
        cfg, choices = point["config"], point["choices"]
        dec_cfg = cfg.get("decoder") or {}
        target = str(dec_cfg.get("_target_", ""))
        decoder = (
            choices.get("decoder")
            or dec_cfg.get("name")
            or (target.rsplit(".", 2)[-2] if target.count(".") >= 2 else target)
        )
        task = choices.get("task") or (cfg.get("task") or {}).get("name")
        records = {
            (str(r["example_id"]), int(r["turn"])): r for r in PointFolder(d).check().records
        }
        notes.append(f"{decoder} on {task}: {len(records)} records, {point['status']} ({d})")
        if not decoder or not task:
            notes[-1] += " -- skipped: decoder or task unknown"
            continue
        if (decoder, task) in out and len(out[(decoder, task)]) >= len(records):
            notes[-1] += " -- ignored: another point of this decoder and task has more records"
            continue
        out[(decoder, task)] = records
    return out, notes


# ------------------------------------------------------------------------------ per example
def log_perplexity(turns: list[dict]) -> float | None:
    nll = tokens = 0.0
    for r in turns:
        n = r.get("new_tokens") or 0
        if r.get("nll_sum") is not None:
            nll += float(r["nll_sum"])
        elif r.get("perplexity") is not None and n:
            nll += math.log(float(r["perplexity"])) * n
        else:
            return None
        tokens += n
    return nll / tokens if tokens else None


def block_efficiency(turns: list[dict]) -> float | None:
    steps = sum(int(r.get("steps") or 0) for r in turns)
    accepted = sum(sum(r.get("accepted_per_step") or r.get("accepted") or []) for r in turns)
    return (accepted + steps) / steps if steps else None


def score(turns: list[dict]) -> float | None:
    scored = [r["score"] for r in turns if r.get("score") is not None]
    return float(scored[-1]) if scored else None


def paired(a: dict, b: dict, value: Callable[[list[dict]], float | None]):
    """Per-example values of two decoders over their common (example_id, turn) keys."""
    by_example: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for key in sorted(set(a) & set(b), key=lambda k: (k[0], k[1])):
        by_example[key[0]].append(key)
    xs, ys = [], []
    for keys in by_example.values():
        x, y = value([a[k] for k in keys]), value([b[k] for k in keys])
        if x is not None and y is not None and math.isfinite(x) and math.isfinite(y):
            xs.append(x)
            ys.append(y)
    return xs, ys


# ------------------------------------------------------------------------------ claims
@dataclass(frozen=True)
class Spec:
    """One comparison: decoders a vs b on a task, a per-example value, an interval, a rule."""

    claim: int
    task: str
    a: str
    b: str
    metric: str
    paper: str
    value: Callable[[list[dict]], float | None]
    interval: Callable[..., stats.Interval]  # (xs, ys, seed=) -> Interval; task "all": (groups, seed=)
    rule: Callable[[float, float], str]  # (ci_low, ci_high) -> verdict


RATIO = "perplexity ratio (geometric means)"


def _ppl(claim: int, task: str, a: str, b: str, paper: str, rule) -> Spec:
    interval = stats.stratified_ratio if task == ALL else stats.perplexity_ratio
    return Spec(claim, task, a, b, RATIO, paper, log_perplexity, interval, rule)


def _block_efficiency(task: str, b: str) -> Spec:
    interval = stats.stratified_mean_difference if task == ALL else stats.mean_difference
    return Spec(2, task, "tree_mtad", b, "block efficiency difference", "higher", block_efficiency,
                interval, lambda lo, hi: direction(lo, hi, 0.0, "above"))


def _score(claim: int, task: str, a: str, b: str, paper: str, rule) -> Spec:
    metric, kind = SCORED[task]
    diff = stats.binary_difference if kind == "binary" else stats.mean_difference
    return Spec(claim, task, a, b, f"{metric} difference", paper, score, diff, rule)


def specs() -> list[Spec]:
    """Every comparison of claims 1, 2, 3 and 5 (claim 4 reads the speed benchmark).

    Claims 1, 2 and claim 5's perplexity also get a pooled row (task ``all``: every task with
    equal weight, a bootstrap stratified by task; the paper's -21.2% is such an average)."""
    out = []
    for t in (*TASKS, ALL):
        for a in ("mtad", "tree_mtad"):
            for b in ("multinomial", "spd"):
                paper = "-21.2% (ratio 0.788)" if b == "multinomial" else "lower"
                out.append(_ppl(1, t, a, b, paper, lambda lo, hi: direction(lo, hi, 1.0, "below")))
        for b in ("spd", "specinfer"):
            out.append(_block_efficiency(t, b))
    for t in SCORED:
        m = NON_INFERIORITY[SCORED[t][1]]
        for a in ("mtad", "tree_mtad"):
            out.append(
                _score(
                    3,
                    t,
                    a,
                    "spd",
                    f">= spd (margin {m:+g})",
                    lambda lo, hi, m=m: non_inferiority(lo, hi, m),
                )
            )
    lo_eq, hi_eq = PPL_EQUIVALENCE
    for t in (*TASKS, ALL):
        out.append(
            _ppl(
                5,
                t,
                "spd",
                "multinomial",
                f"equal (ratio in [{lo_eq}, {hi_eq}])",
                lambda lo, hi: equivalence(lo, hi, lo_eq, hi_eq),
            )
        )
    for t in SCORED:
        e = EQUIVALENCE[SCORED[t][1]]
        out.append(
            _score(
                5,
                t,
                "spd",
                "multinomial",
                f"equal (+-{e:g})",
                lambda lo, hi, e=e: equivalence(lo, hi, -e, e),
            )
        )
    return out


def _fill(row: Row, iv: stats.Interval, verdict: str, detail: str = "") -> Row:
    row.estimate, row.ci_low, row.ci_high, row.n = iv.estimate, iv.low, iv.high, iv.n
    row.verdict = verdict if iv.n >= MIN_PAIRS else OPEN
    if 0 < iv.n < MIN_PAIRS:
        detail = "; ".join(x for x in (detail, f"n < {MIN_PAIRS} pairs: no verdict from so few") if x)
    if iv.p_value is not None:
        detail = "; ".join(x for x in (detail, f"McNemar exact p = {iv.p_value:.3g}") if x)
    row.detail = "; ".join(x for x in (detail, iv.detail) if x)
    return row


def magnitude(row: Row) -> str:
    """Where the paper's claim-1 ratio (0.788 vs single-token sampling) lies from the interval."""
    if row.claim != 1 or not row.comparison.endswith("vs multinomial") or _nan(row.ci_low, row.ci_high):
        return ""
    paper = 1 - PAPER_PPL_EFFECT
    if paper < row.ci_low - EPS:
        return f"paper's {paper:.3f} below the interval: a smaller reduction here"
    if paper > row.ci_high + EPS:
        return f"paper's {paper:.3f} above the interval: a larger reduction here"
    return f"paper's {paper:.3f} inside the interval"


def compare(records: Records, spec: Spec, seed: int = 0) -> Row:
    if spec.task == ALL:
        return compare_pooled(records, spec, seed)
    row = Row(spec.claim, spec.task, f"{spec.a} vs {spec.b}", spec.metric, spec.paper)
    missing = [d for d in (spec.a, spec.b) if (d, spec.task) not in records]
    if missing:
        row.detail = f"no records: {', '.join(missing)} on {spec.task}"
        return row
    xs, ys = paired(records[(spec.a, spec.task)], records[(spec.b, spec.task)], spec.value)
    if not xs:
        row.detail = "no paired examples with this metric"
        return row
    iv = spec.interval(xs, ys, seed=seed)
    row = _fill(row, iv, spec.rule(iv.low, iv.high))
    row.detail = "; ".join(x for x in (magnitude(row), row.detail) if x)
    return row


def compare_pooled(records: Records, spec: Spec, seed: int = 0) -> Row:
    """Task ``all``: every task weighs the same, the bootstrap resamples within each task.

    A verdict needs every task of ``TASKS`` with at least ``MIN_PAIRS`` pairs; with fewer the
    row shows the pooled interval of the tasks that have them, ``not resolved``.
    """
    row = Row(spec.claim, ALL, f"{spec.a} vs {spec.b}", spec.metric, spec.paper)
    groups, used, short = [], [], []
    for t in TASKS:
        if (spec.a, t) in records and (spec.b, t) in records:
            xs, ys = paired(records[(spec.a, t)], records[(spec.b, t)], spec.value)
        else:
            xs, ys = [], []
        if len(xs) >= MIN_PAIRS:
            groups.append((xs, ys))
            used.append(f"{t} {len(xs)}")
        else:
            short.append(f"{t} {len(xs)}")
    if not groups:
        row.detail = f"no records: no task has {MIN_PAIRS} pairs or more of {spec.a} and {spec.b}"
        return row
    iv = spec.interval(groups, seed=seed)
    verdict = spec.rule(iv.low, iv.high) if not short else OPEN
    row = _fill(row, iv, verdict)
    pooled = f"equal weight per task, bootstrap within tasks; pairs: {', '.join(used)}"
    if short:
        pooled += f"; left out (< {MIN_PAIRS} pairs, no verdict): {', '.join(short)}"
    row.detail = "; ".join(x for x in (magnitude(row), pooled, row.detail) if x)
    return row


def speed_rows(path: Path, seed: int) -> list[Row]:
    """Claim 4 from the interleaved speed benchmark: per task and pooled over its tasks."""
    paper = "faster (1.42x, GPU)"
    metric = "tokens/s ratio (geometric means)"
    comparison = "tree_mtad vs spd"
    data = json.loads(path.read_text()) if path.is_file() else None
    if data is None:
        return [Row(4, ALL, comparison, metric, paper, detail=f"no records: {path} not found")]
    tps: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in data.get("rows", []):
        if (
            r.get("mode") == SPEED_MODE
            and r.get("decoder") in ("tree_mtad", "spd")
            and r.get("wall")
        ):
            tps[(r["task"], r["prompt"], r["repeat"])][r["decoder"]] = r["tokens"] / r["wall"]
    pairs = {k: v for k, v in tps.items() if len(v) == 2}
    rows = []
    for task in sorted({k[0] for k in pairs}) + [ALL]:
        keys = [k for k in sorted(pairs) if task in (ALL, k[0])]
        row = Row(4, task, comparison, metric, paper)
        iv = stats.ratio_of_geometric_means(
            [pairs[k]["tree_mtad"] for k in keys], [pairs[k]["spd"] for k in keys], seed=seed
        )
        src = (
            f"{path}: rows mode={SPEED_MODE}, decoder tree_mtad and spd, "
            f"{'every task' if task == ALL else 'task=' + task}, paired by (task, prompt, repeat)"
        )
        rows.append(_fill(row, iv, direction(iv.low, iv.high, 1.0, "above"), src))
    if not rows[:-1]:
        rows[-1].detail = f"no records: no {SPEED_MODE} rows of tree_mtad and spd in {path}"
    return rows


def evaluate_claims(records: Records, speed_file: Path = SPEED_FILE, seed: int = 0) -> list[Row]:
    rows = [compare(records, spec, seed) for spec in specs()]
    rows += speed_rows(Path(speed_file), seed)
    return sorted(rows, key=lambda r: r.claim)  # stable: claim 5's rows keep their order


# ------------------------------------------------------------------------------ outputs
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


def write_csv(rows: Sequence[Row], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(v) for k, v in asdict(r).items()})


def write_markdown(rows: Sequence[Row], notes: Sequence[str], path: Path, extra: str = "") -> None:
    names = {
        1: "MTAD / tree-MTAD perplexity lower than multinomial and SpD",
        2: "tree-MTAD block efficiency higher than SpD and SpecInfer",
        3: "MTAD / tree-MTAD task scores at least SpD's (non-inferiority)",
        4: "tree-MTAD faster than SpD (interleaved CPU speed benchmark)",
        5: "SpD and multinomial equivalent (perplexity and scores)",
    }
    out = [
        "# The paper's claims on paired records",
        "",
        "Generated by `python -m mtad.claims`; definitions and verdict rules in `docs/claims.md` "
        "and `mtad/claims.py`. Intervals: 95% paired bootstrap (percentile, 9999 resamples, "
        "fixed seed); n = paired examples.",
        "",
        "Declared margins: non-inferiority (claim 3) "
        f"{NON_INFERIORITY['binary']:+g} for EX and pass@1, {NON_INFERIORITY['rouge']:+g} for "
        f"Rouge-L; equivalence (claim 5) perplexity ratio in {list(PPL_EQUIVALENCE)}, scores "
        f"within +-{EQUIVALENCE['binary']:g} (binary) and +-{EQUIVALENCE['rouge']:g} (Rouge-L).",
        "",
    ]
    counts = verdict_counts(rows)
    out += ["Verdicts: " + ", ".join(f"{v}: {counts[v]}" for v in (HOLDS, CONTRADICTED, OPEN)), ""]
    for claim, title in names.items():
        out += [
            f"## Claim {claim}: {title}",
            "",
            "| task | comparison | metric | paper | estimate | 95% CI | n | verdict | detail |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in rows if r.claim == claim):
            ci = f"[{_fmt(r.ci_low)}, {_fmt(r.ci_high)}]" if not _nan(r.ci_low) else ""
            out.append(
                f"| {r.task} | {r.comparison} | {r.metric} | {r.paper} | {_fmt(r.estimate)} "
                f"| {ci} | {r.n} | {r.verdict} | {r.detail} |"
            )
        out.append("")
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
        out.append(
            f"| {r.task} | {r.comparison} | {r.n} | {_fmt(r.ci_high - r.ci_low)} "
            f"| {need if need is not None else ''} |"
        )
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
        out.append(
            f"| {r.task} | {r.metric} | {r.n} | {_fmt(r.ci_high - r.ci_low)} | {band:g} "
            f"| {need if need is not None else ''} |"
        )
    out += ["", "## Points read", ""] + ([f"- {n}" for n in notes] or ["- none"])
    if extra:
        out += ["", "## Notes", "", extra.strip()]
    path.write_text("\n".join(out) + "\n")


def verdict_counts(rows: Sequence[Row]) -> dict[str, int]:
    counts = dict.fromkeys((HOLDS, CONTRADICTED, OPEN), 0)
    for r in rows:
        counts[r.verdict] += 1
    return counts


def plot_perplexity(rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, label=comp)
    def label(task: str) -> str:
        ns = sorted({r.n for r in ppl if r.task == task})
        lo, hi = (ns[0], ns[-1]) if ns else (0, 0)
        n = f"n={lo}" if lo == hi else f"n={lo}-{hi}"
        name = "all tasks, equal weights" if task == ALL else task
        return f"{name}\n({n}{f'; < {MIN_PAIRS} not drawn' if lo < MIN_PAIRS else ''})"

    ax.axvline(len(TASKS) - 0.5, color="0.6", lw=0.8)
    ax.set_xticks(range(len(TASKS) + 1), [label(t) for t in (*TASKS, ALL)])
    ax.set_ylabel("perplexity ratio a / b (geometric means)")
    ax.set_title("Perplexity ratio per task and pooled, 95% paired bootstrap intervals (below 1: a is lower)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mtad.claims", description=__doc__.split("\n")[0])
    ap.add_argument("root", help="records root (e.g. results/claims: sweeps claims, claims_tree)")
    ap.add_argument("--out", required=True, help="output folder for claims.md/.csv and the figure")
    ap.add_argument(
        "--speed", default=str(SPEED_FILE), help="interleaved speed benchmark (claim 4)"
    )
    ap.add_argument(
        "--notes", help="a markdown file appended to claims.md (e.g. the pilot's N reasoning)"
    )
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = ap.parse_args(argv)
    records, notes = read_records(args.root)
    rows = evaluate_claims(records, Path(args.speed), args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "claims.csv")
    extra = Path(args.notes).read_text() if args.notes else ""
    write_markdown(rows, notes, out / "claims.md", extra)
    plot_perplexity(rows, out / "perplexity_ratio.png")
    counts = verdict_counts(rows)
    print(
        f"{len(rows)} rows ({', '.join(f'{v}: {c}' for v, c in counts.items())}) -> "
        f"{out / 'claims.md'}, {out / 'claims.csv'}, {out / 'perplexity_ratio.png'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

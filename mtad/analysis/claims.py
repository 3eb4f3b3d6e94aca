"""The paper's claims, tested on paired per-example records: ``python -m mtad.analysis.claims``.

    python -m mtad.analysis.claims results/claims --out results/claims --notes experiments/claims_notes.md \
        --speed results/bench/speed_claim4_cpu.json

reads every point under the records root (the sweeps of ``experiments/claims*.yaml``, through
``mtad.run.results``), pairs decoders by (example_id, turn) and writes ``claims.csv``, ``claims.md``
and ``perplexity_ratio.png`` (``mtad.analysis.claims_report``). One row per (claim, task, comparison);
``n`` counts paired examples; intervals are 95% paired bootstraps (``mtad.core.stats``).

Per-example values (a multi-turn example pools the turns that both decoders have):
log-perplexity = sum of turn NLLs / sum of turn tokens; block efficiency = emitted tokens /
steps (``mtad.core.metrics.block_efficiency``); score = the example's scored record (Spider EX and
HumanEval pass@1 0/1, CNN/DM Rouge-L).

Claims, declared here before any data is read (``EPS`` absorbs float rounding; a NaN interval
is ``not resolved``). Each row has a direction verdict (does the interval lie on the claimed
side?) and, where the paper states a size, a size verdict (``consistent``: the paper's figure
inside an interval that excludes no effect and is narrower than the figure's distance from no
effect; ``inconclusive``: inside an interval too wide to tell; ``smaller`` / ``larger``: the
interval lies wholly on the side of a smaller / larger effect):

1. MTAD and tree-MTAD have lower perplexity than multinomial and SpD (paper: -21.2% vs
   single-token sampling, ratio 0.788). Ratio of geometric means a / b below 1.
2. tree-MTAD has higher block efficiency than SpD, SpecInfer and MCSS. Difference above 0.
3. MTAD / tree-MTAD task scores are at least SpD's and multinomial's: non-inferiority, a - b
   above the margin ``NON_INFERIORITY`` (-0.05 for EX and pass@1, -0.01 for Rouge-L).
4. tree-MTAD is faster than SpD (paper: 1.42x) and than MCSS (paper: +21.1%): the fixed-length
   interleaved benchmark given with ``--speed`` (``make bench-claim4``, ``bench/speed.py``),
   ratio of geometric-mean tokens/s above 1.
5. SpD and multinomial are equivalent: perplexity ratio inside ``PPL_EQUIVALENCE`` and score
   differences inside +-``EQUIVALENCE``.
6. MTAD / tree-MTAD improve the task score over multinomial (paper: +43%; Spider EX 22.0 ->
   52.5 and HumanEval 15.9 -> 36.6 with Llama-3 and exact joint sampling) and tree-MTAD over
   the lossless baselines as a group (paper: +42.7%): relative change mean(a) / mean(b) - 1
   above 0. The group (multinomial, SpD, SpecInfer, MCSS) samples one distribution, the
   target's, so on each example their scores are draws of the same variable: the baseline
   value of an example is the mean of the group members that ran it at the same settings.
7. Energy (paper: 1.54x less than SpD, or 23.6% less in another summary; 23.4% less than
   MCSS): not measurable on this machine (no power counters); rows ``not resolved``.

Pooled rows (task ``all``): the mean over tasks of each task's statistic (equal weights), a
bootstrap stratified by task; a verdict only when every task has ``MIN_PAIRS`` pairs.

Two points are compared only when their settings agree (``settings``: the point's identity
without its decoder: model pair, sampling, seed, max new tokens, task config); a decoder with
points at several settings is compared at the settings its partner shares, otherwise the row
is ``not resolved`` ("settings differ"). A missing decoder or task gives n = 0, ``not
resolved`` ("no records").

Every verdict-bearing row also has a one-sided p-value of its claim (``mtad.core.stats.p_value``)
and a Holm-adjusted verdict over the family of all such rows of the report.
This module knows the claims and the verdict rules; ``mtad.run.results`` owns the folder format,
``mtad.core.stats`` the intervals and p-values, ``mtad.analysis.claims_report`` the outputs.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mtad.core import stats
from mtad.core.io import read_json
from mtad.core.metrics import example_block_efficiency, example_log_perplexity, example_score
from mtad.run.results.identity import _canonical  # one canonical form for identities and settings

# ------------------------------------------------------------------------------ names
# The tasks and decoders the claims compare, declared here once: their config-group names
# (conf/task/, conf/decoder/), which are the names ``read_records`` gives points
# (``mtad.analysis.names``). They are the axes of the claims' stage sweep files
# (experiments/claims_stages.yaml); tests/analysis/test_claims.py checks that they agree.
SPIDER, HUMANEVAL, CNN_DM, CHATGPT_PROMPTS, MT_BENCH = (
    "spider", "humaneval", "cnn_dailymail", "chatgpt_prompts", "mt_bench")
TASKS = (SPIDER, HUMANEVAL, CNN_DM, CHATGPT_PROMPTS, MT_BENCH)
MULTINOMIAL, SPD, SPECINFER, MCSS = "multinomial", "spd", "specinfer", "mcss"
MTAD, TREE_MTAD = "mtad", "tree_mtad"
OURS = (MTAD, TREE_MTAD)  # the multi-token decoders every claim is about
#: decoders that sample the target's distribution exactly (claim 6's group)
LOSSLESS = (MULTINOMIAL, SPD, SPECINFER, MCSS)
DECODERS = (*LOSSLESS, *OURS)

ALL = "all"  # the pooled rows: every task with equal weight
# task -> (metric name, kind): kind "binary" (0/1) or "rouge" (continuous in [0, 1])
SCORED = {
    SPIDER: ("EX", "binary"),
    HUMANEVAL: ("pass@1", "binary"),
    CNN_DM: ("Rouge-L", "rouge"),
}
NON_INFERIORITY = {"binary": -0.05, "rouge": -0.01}  # claim 3 margins (a - b)
EQUIVALENCE = {"binary": 0.05, "rouge": 0.01}  # claim 5 score margins (|a - b|)
PPL_EQUIVALENCE = (0.97, 1.03)  # claim 5 perplexity ratio
#: fewest pairs that get a verdict: a percentile bootstrap over fewer (a partial point, a few
#: benchmark prompts) has far below its nominal coverage; the row shows its interval, not resolved
MIN_PAIRS = 10
PAPER_PPL_EFFECT = 0.212  # claim 1: -21.2% perplexity vs single-token sampling
PAPER_SCORE_GAIN = 0.43  # claim 6: +43% downstream performance vs single-token sampling
PAPER_TASK_GAIN = {  # claim 6, per task (Llama-3, exact multi-token joint sampling)
    SPIDER: (22.0, 52.5),
    HUMANEVAL: (15.9, 36.6),
}
PAPER_LOSSLESS_GAIN = 0.427  # claim 6: tree-MTAD vs the lossless baselines, on average
PAPER_SPEEDUP = {SPD: 1.42, MCSS: 1.211}  # claim 4 (GPU): tree-MTAD vs each
SPEED_MODE = "sample"
ENERGY_UNAVAILABLE = "not measurable on this machine (no power counters)"
ALPHA = 0.025  # one-sided level of every test: the bound of a two-sided 95% interval
EPS = 1e-9
HOLDS, CONTRADICTED, OPEN = "holds", "contradicted", "not resolved"
CONSISTENT, INCONCLUSIVE, SMALLER, LARGER, NO_SIZE = "consistent", "inconclusive", "smaller", "larger", ""
REPRODUCED = CONSISTENT  # the former name of the verdict (it says no more than "consistent")
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
    "size",
    "p_value",
    "holm_p",
    "holm_verdict",
    "detail",
    "marks",
)


@dataclass
class Point:
    """One point's records and what they were generated with."""

    decoder: str
    task: str
    settings: dict  # identity without the decoder: pair, sampling, seed, max tokens, task config
    records: dict[tuple[str, int], dict]  # (example_id, turn) -> record
    where: str = ""
    data_source: str | None = None
    data_substitute: bool | None = None
    energy_reason: str | None = None


Records = dict[tuple[str, str], list[Point]]  # (decoder, task) -> its points, one per settings


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
    size: str = NO_SIZE
    p_value: float = math.nan
    holm_p: float = math.nan
    holm_verdict: str = OPEN
    detail: str = ""
    headline: bool = field(default=False, compare=False)
    #: the point folders the row compares (every task's, for a pooled row) and their provenance
    #: marks together (``mtad.analysis.provenance_marks``; ``mark_rows``)
    points: tuple[str, ...] = field(default=(), compare=False)
    marks: str = field(default="", compare=False)


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


def size_verdict(low: float, high: float, paper: float, claimed: str, null: float | None = None) -> str:
    """Where the paper's figure lies from the interval: the interval shows a ``smaller`` /
    ``larger`` effect (for a claimed "below", a smaller effect lies above), or it holds the
    figure: ``consistent`` when it can tell the figure from no effect (``null``), ``inconclusive``
    when it is too wide to (it also holds ``null``, or spans more than the figure's own distance
    from ``null``)."""
    if _nan(low, high):
        return OPEN
    if low - EPS <= paper <= high + EPS:
        if null is not None and (low - EPS <= null <= high + EPS or high - low > abs(paper - null)):
            return INCONCLUSIVE
        return CONSISTENT
    above = low > paper  # the interval lies above the paper's figure
    return (SMALLER if above else LARGER) if claimed == "below" else (LARGER if above else SMALLER)


@dataclass(frozen=True)
class Direction:
    ref: float
    claimed: str  # "above" / "below"

    def verdict(self, low: float, high: float) -> str:
        return direction(low, high, self.ref, self.claimed)

    def p_value(self, iv: stats.Interval) -> float:
        return stats.p_value(iv, self.ref, self.claimed)


@dataclass(frozen=True)
class NonInferiority:
    margin: float

    def verdict(self, low: float, high: float) -> str:
        return non_inferiority(low, high, self.margin)

    def p_value(self, iv: stats.Interval) -> float:
        return stats.p_value(iv, self.margin, "above")


@dataclass(frozen=True)
class Equivalence:
    lo: float
    hi: float

    def verdict(self, low: float, high: float) -> str:
        return equivalence(low, high, self.lo, self.hi)

    def p_value(self, iv: stats.Interval) -> float:  # two one-sided tests: the larger p
        return max(stats.p_value(iv, self.lo, "above"), stats.p_value(iv, self.hi, "below"))


@dataclass(frozen=True)
class Size:
    value: float  # the paper's figure on the row's scale
    claimed: str  # the claim's direction ("above" / "below"), which orients smaller / larger
    null: float  # no effect on the row's scale (1 for ratios, 0 for changes and differences)


Test = Direction | NonInferiority | Equivalence


# ------------------------------------------------------------------------------ records
SETTINGS_NOT = ("decoder", "decoder_version", "cost_prior")  # identity keys that are the decoder's


def settings(point_file: dict, config: dict) -> dict:
    """What two compared points must share: the stored identity without its decoder keys (the
    model pair, sampling, seed, max new tokens, the task config and whatever else the identity
    holds); from the resolved config for a folder without one."""
    ident = point_file.get("identity") if point_file.get("format") else None
    if isinstance(ident, dict) and ident:
        return _canonical({k: v for k, v in ident.items() if k not in SETTINGS_NOT})
    task = {k: v for k, v in (config.get("task") or {}).items() if k not in ("scorer", "limit")}
    return _canonical({
        "model": config.get("model"),
        "task": task,
        "sampling": {k: config.get(k) for k in ("temperature", "top_k", "top_p")},
        "seed": config.get("seed"),
        "max_new_tokens": config.get("max_new_tokens"),
    })


def settings_differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two settings."""
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += settings_differences(x, y, f"{prefix}{k}.")
        elif x != y:
            out.append(f"{prefix}{k}: {x!r} vs {y!r}")
    return out


def read_records(root: str | Path) -> tuple[Records, list[str]]:
    """Every point's records under ``root``, by (decoder, task); and notes on what was read.

    The only function that touches results folders (through ``mtad.run.results``). Every point
    folder is read, also one its sweep no longer lists (noted). A point's decoder and task are
    its config-group names (``mtad.analysis.names``, as the tables name them). Two
    points of one (decoder, task) at the same settings (a sweep's point and its extension in a
    sibling sweep): the one with more records is used, the other noted; at other settings both
    are kept and a comparison takes the one whose settings its partner shares.
    """
    from mtad.analysis.names import decoder_name, task_name
    from mtad.run.results import (
        INDEX_FILE,
        POINT_FILE,
        PointFolder,
        is_point_folder,
        load_point,
        point_dirs,
        read_json,
    )

    root = Path(root)
    if not root.is_dir():
        return {}, [f"{root}: no such folder"]
    sweeps = [root] if is_point_folder(root) or (root / INDEX_FILE).exists() else [
        sub for sub in sorted(root.iterdir()) if sub.is_dir() and not sub.name.startswith(".")]
    # every point folder on disk, not only those the sweep's index lists now: a point whose
    # identity changed (e.g. a new stop set) keeps its records, at its own settings, until it
    # is regenerated, and its rows compare it only with points at the same settings
    dirs, current = [], set()
    for sub in sweeps:
        current |= {d.resolve() for d in point_dirs(sub)}
        dirs += [d for d in point_dirs(sub, only_current=False) if d not in dirs]
    out: Records = {}
    notes: list[str] = []
    for d in dirs:
        if not d.is_dir():
            continue
        try:
            point = load_point(d)
            records = {
                (str(r["example_id"]), int(r["turn"])): r for r in PointFolder(d).check().records
            }
        except (OSError, ValueError, KeyError, TypeError) as e:  # unreadable: say so, go on
            notes.append(f"{d}: not read ({type(e).__name__}: {e})")
            continue
        cfg, choices = point["config"], point["choices"]
        summary = point.get("summary") or {}
        decoder, task = decoder_name(choices, cfg, summary), task_name(choices, cfg, summary)
        notes.append(f"{decoder} on {task}: {len(records)} records, {point['status']} ({d})")
        if d.resolve() not in current:
            notes[-1] += " -- not a point of its sweep's current definition (settings changed since)"
        if not decoder or not task:
            notes[-1] += " -- skipped: decoder or task unknown"
            continue
        new = Point(
            decoder,
            task,
            settings(read_json(d / POINT_FILE) or {}, cfg),
            records,
            str(d),
            summary.get("data_source"),
            summary.get("data_substitute"),
            summary.get("energy_unavailable_reason"),
        )
        points = out.setdefault((decoder, task), [])
        same = next((p for p in points if p.settings == new.settings), None)
        if same is None:
            if points:
                notes[-1] += " -- other settings than another point of this decoder and task"
            points.append(new)
        elif len(same.records) >= len(records):
            notes[-1] += " -- ignored: another point of this decoder and task has more records"
        else:
            notes.append(f"  ({same.where} ignored: this point has more records)")
            points[points.index(same)] = new
    return out, notes


# ------------------------------------------------------------------------------ per example
# the per-example values of every table, figure and this report: one definition each
log_perplexity = example_log_perplexity
block_efficiency = example_block_efficiency
score = example_score


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


def paired_group(a: dict, group: Sequence[dict], value: Callable[[list[dict]], float | None]):
    """Per-example values of a decoder and the mean of a group's values on that example: the
    members that have every (example_id, turn) key ``a`` has for it and a value there."""
    by_example: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for key in sorted(a, key=lambda k: (k[0], k[1])):
        by_example[key[0]].append(key)
    xs, ys = [], []
    for keys in by_example.values():
        x = value([a[k] for k in keys])
        members = [value([b[k] for k in keys]) for b in group if all(k in b for k in keys)]
        members = [y for y in members if y is not None and math.isfinite(y)]
        if x is not None and math.isfinite(x) and members:
            xs.append(x)
            ys.append(float(np.mean(members)))
    return xs, ys


# ------------------------------------------------------------------------------ claims
@dataclass(frozen=True)
class Spec:
    """One comparison: decoder a vs b (or vs a group of decoders) on a task, a per-example value,
    an interval (per task; pooled over ``tasks`` for task ``all``), a test and the paper's size."""

    claim: int
    task: str
    a: str
    b: tuple[str, ...]  # one decoder, or claim 6's group of lossless decoders
    metric: str
    paper: str
    value: Callable[[list[dict]], float | None]
    interval: Callable[..., stats.Interval]  # (xs, ys, seed=) -> Interval
    pooled: Callable[..., stats.Interval]  # (groups, seed=) -> Interval, for task "all"
    test: Test
    size: Size | None = None
    tasks: tuple[str, ...] = TASKS  # what task "all" pools
    headline: bool = False

    @property
    def comparison(self) -> str:
        if len(self.b) == 1:
            return f"{self.a} vs {self.b[0]}"
        return f"{self.a} vs lossless ({' + '.join(self.b)})"


RATIO = "perplexity ratio (geometric means)"
BELOW_1, ABOVE_0 = Direction(1.0, "below"), Direction(0.0, "above")


def _ppl(claim: int, task: str, a: str, b: str, paper: str, test: Test, size: Size | None = None,
         headline: bool = False) -> Spec:
    return Spec(claim, task, a, (b,), RATIO, paper, log_perplexity, stats.perplexity_ratio,
                stats.stratified_ratio, test, size, headline=headline)


def _score(claim: int, task: str, a: str, b: str, paper: str, test: Test) -> Spec:
    metric, kind = SCORED[task]
    diff = stats.binary_difference if kind == "binary" else stats.mean_difference
    return Spec(claim, task, a, (b,), f"{metric} difference", paper, score, diff,
                stats.stratified_mean_difference, test)


def _gain(task: str, a: str, b: tuple[str, ...]) -> Spec:
    """Claim 6: relative change of the task score, mean(a) / mean(b) - 1."""
    metric = "score" if task == ALL else SCORED[task][0]
    paper, size, headline = "higher", None, task == ALL
    if task == ALL:
        gain = PAPER_SCORE_GAIN if b == (MULTINOMIAL,) else PAPER_LOSSLESS_GAIN
        paper, size = f"{gain:+.1%} (average over tasks)", Size(gain, "above", 0.0)
    elif b == (MULTINOMIAL,) and task in PAPER_TASK_GAIN:
        lo, hi = PAPER_TASK_GAIN[task]
        paper = f"{hi / lo - 1:+.0%} ({metric} {lo} -> {hi}; Llama-3, exact joint sampling)"
        size, headline = Size(hi / lo - 1, "above", 0.0), a == MTAD
    return Spec(6, task, a, b, f"{metric} relative change", paper, score, stats.relative_change,
                stats.stratified_relative_change, ABOVE_0, size, tuple(SCORED), headline)


def specs() -> list[Spec]:
    """Every comparison of claims 1, 2, 3, 5 and 6 (claim 4 reads the speed benchmark, claim 7
    is energy). Per task, and pooled (task ``all``) where the claim is an average over tasks."""
    out = []
    paper_ratio = 1 - PAPER_PPL_EFFECT
    for t in (*TASKS, ALL):
        for a in OURS:
            for b in (MULTINOMIAL, SPD):
                if b == MULTINOMIAL:
                    out.append(_ppl(1, t, a, b, f"-21.2% (ratio {paper_ratio:.3f})", BELOW_1,
                                    Size(paper_ratio, "below", 1.0), headline=t == ALL))
                else:
                    out.append(_ppl(1, t, a, b, "lower", BELOW_1))
        for b in (SPD, SPECINFER, MCSS):
            out.append(Spec(2, t, TREE_MTAD, (b,), "block efficiency difference", "higher",
                            block_efficiency, stats.mean_difference,
                            stats.stratified_mean_difference, ABOVE_0, headline=t == ALL))
    for t in SCORED:
        m = NON_INFERIORITY[SCORED[t][1]]
        for b in (SPD, MULTINOMIAL):
            for a in OURS:
                out.append(_score(3, t, a, b, f">= {b} (margin {m:+g})", NonInferiority(m)))
    lo_eq, hi_eq = PPL_EQUIVALENCE
    for t in (*TASKS, ALL):
        out.append(_ppl(5, t, SPD, MULTINOMIAL, f"equal (ratio in [{lo_eq}, {hi_eq}])",
                        Equivalence(lo_eq, hi_eq)))
    for t in SCORED:
        e = EQUIVALENCE[SCORED[t][1]]
        out.append(_score(5, t, SPD, MULTINOMIAL, f"equal (+-{e:g})", Equivalence(-e, e)))
    for t in (*SCORED, ALL):
        for a in OURS:
            out.append(_gain(t, a, (MULTINOMIAL,)))
        out.append(_gain(t, TREE_MTAD, LOSSLESS))
    return out


def _fill(row: Row, iv: stats.Interval, test: Test, size: Size | None = None,
          detail: str = "") -> Row:
    row.estimate, row.ci_low, row.ci_high, row.n = iv.estimate, iv.low, iv.high, iv.n
    if iv.n >= MIN_PAIRS:
        row.verdict = test.verdict(iv.low, iv.high)
        row.p_value = test.p_value(iv)
        row.size = size_verdict(iv.low, iv.high, size.value, size.claimed, size.null) if size else NO_SIZE
    else:
        row.verdict, row.size = OPEN, OPEN if size else NO_SIZE
        if iv.n:
            detail = "; ".join(x for x in (detail, f"n < {MIN_PAIRS} pairs: no verdict from so few") if x)
    if iv.p_value is not None:
        detail = "; ".join(x for x in (detail, f"McNemar exact p = {iv.p_value:.3g}") if x)
    row.detail = "; ".join(x for x in (detail, iv.detail) if x)
    return row


def _choose(records: Records, spec: Spec, task: str) -> tuple[Point | None, list[Point], str]:
    """The points of ``spec.a`` and of its partners on ``task`` at one shared setting: the
    setting that pairs the most examples. An empty partner list says why in the detail."""
    missing = [d for d in (spec.a, *spec.b) if not records.get((d, task))]
    if spec.a in missing or all(b in missing for b in spec.b):
        return None, [], f"no records: {', '.join(missing)} on {task}"
    best: tuple[int, Point | None, list[Point]] = (-1, None, [])
    differ = ""
    for pa in records[(spec.a, task)]:
        partners = []
        for b in spec.b:
            same = [p for p in records.get((b, task), []) if p.settings == pa.settings]
            if same:
                partners.append(max(same, key=lambda p: len(p.records)))
            elif records.get((b, task)) and not differ:
                diffs = settings_differences(pa.settings, records[(b, task)][0].settings)
                differ = f"settings differ: {spec.a} vs {b} on {task}: " + "; ".join(diffs[:3])
        common = sum(len(set(pa.records) & set(p.records)) for p in partners)
        if partners and common > best[0]:
            best = (common, pa, partners)
    if best[1] is None:
        return None, [], differ
    notes = [differ] if differ and len(best[2]) < len(spec.b) else []
    gone = [d for d in spec.b if d in missing]
    if gone and len(spec.b) > 1:
        notes.append(f"no records: {', '.join(gone)} on {task}")
    return best[1], best[2], "; ".join(notes)


def _pairs(records: Records, spec: Spec, task: str, used: list[str] | None = None) -> tuple[list, list, str]:
    """Paired per-example values of ``spec`` on ``task``; ``used`` collects the point folders."""
    pa, partners, detail = _choose(records, spec, task)
    if pa is None:
        return [], [], detail
    if used is not None:
        used += [p.where for p in (pa, *partners) if p.where and p.where not in used]
    if len(spec.b) == 1:
        xs, ys = paired(pa.records, partners[0].records, spec.value)
    else:
        xs, ys = paired_group(pa.records, [p.records for p in partners], spec.value)
        used = ", ".join(p.decoder for p in partners)
        detail = "; ".join(x for x in (f"group: {used} (mean per example)", detail) if x)
    return xs, ys, detail


def compare(records: Records, spec: Spec, seed: int = 0) -> Row:
    if spec.task == ALL:
        return compare_pooled(records, spec, seed)
    row = Row(spec.claim, spec.task, spec.comparison, spec.metric, spec.paper, headline=spec.headline)
    if spec.size:
        row.size = OPEN
    used: list[str] = []
    xs, ys, detail = _pairs(records, spec, spec.task, used)
    row.points = tuple(used)
    if not xs:
        row.detail = detail or "no paired examples with this metric"
        return row
    return _fill(row, spec.interval(xs, ys, seed=seed), spec.test, spec.size, detail)


def pool(per_task: dict[str, tuple[list, list]], interval: Callable[..., stats.Interval],
         seed: int = 0) -> tuple[stats.Interval | None, str, bool]:
    """The pooled interval of per-task pairs (equal task weights, bootstrap within tasks), what
    it pooled, and whether it may carry a verdict: every task with ``MIN_PAIRS`` pairs. It pools
    the tasks that have ``MIN_PAIRS``; when none has, every task with two pairs or more, so the
    row still shows an interval (without a verdict)."""
    full = {t: g for t, g in per_task.items() if len(g[0]) >= MIN_PAIRS}
    some = full or {t: g for t, g in per_task.items() if len(g[0]) >= 2}
    if not some:
        return None, "", False
    short = [f"{t} {len(g[0])}" for t, g in per_task.items() if t not in full]
    what = "equal weight per task, bootstrap within tasks; pairs: " + ", ".join(
        f"{t} {len(g[0])}" for t, g in some.items())
    if short:
        what += f"; fewer than {MIN_PAIRS} pairs (no verdict): {', '.join(short)}"
    return interval(list(some.values()), seed=seed), what, not short


def _withhold(row: Row) -> Row:
    row.verdict, row.p_value = OPEN, math.nan
    row.size = OPEN if row.size != NO_SIZE else NO_SIZE
    return row


def compare_pooled(records: Records, spec: Spec, seed: int = 0) -> Row:
    """Task ``all``: every task of ``spec.tasks`` weighs the same, the bootstrap resamples within
    each task (``pool``); a verdict needs every task with at least ``MIN_PAIRS`` pairs."""
    row = Row(spec.claim, ALL, spec.comparison, spec.metric, spec.paper, headline=spec.headline)
    if spec.size:
        row.size = OPEN
    per_task, why, used = {}, [], []
    for t in spec.tasks:
        xs, ys, detail = _pairs(records, spec, t, used)
        if detail.startswith("settings differ"):
            why.append(detail)
        per_task[t] = (xs, ys)
    iv, what, full = pool(per_task, spec.pooled, seed)
    if iv is None:
        row.detail = "; ".join([f"no records: no task has pairs of {spec.comparison}", *why])
        return row
    row = _fill(row, iv, spec.test, spec.size, "; ".join([what, *why]))
    row.points = tuple(used)
    return row if full else _withhold(row)


def _speed_description(data: dict, pairs: dict) -> str:
    """What a speed file measured: fixed-length decoding time, or runs ending at EOS."""
    args = data.get("args") or {}
    if args.get("fixed_length"):
        return (f"fixed length {args.get('max_new_tokens')} tokens (EOS ignored), decoding time "
                "only (prefill excluded)")
    unequal = sum(1 for v in pairs.values() if len({t for t, _ in v.values()}) > 1)
    return (f"not fixed-length: runs stop at EOS ({unequal} of {len(pairs)} prompts have "
            "unequal token counts between the two decoders) and wall includes the prefill; "
            "make bench-claim4 re-measures at a fixed length")


def speed_rows(path: Path, seed: int) -> list[Row]:
    """Claim 4 from the interleaved speed benchmark: tree-MTAD vs SpD and vs MCSS, per task (per
    prompt: tokens / wall summed over repeats) and pooled like every pooled row."""
    metric = "tokens/s ratio (geometric means)"
    data = read_json(path, cap=64 * 1024 * 1024)  # None when missing; a link or FIFO is refused
    rows = []
    for b, speedup in PAPER_SPEEDUP.items():
        comparison = f"{TREE_MTAD} vs {b}"
        paper = f"{speedup:.2f}x (GPU)" if b == SPD else f"+{speedup - 1:.1%} (GPU)"
        size = Size(speedup, "above", 1.0)
        test = Direction(1.0, "above")
        sums: dict[tuple, dict[str, list[float]]] = defaultdict(dict)
        for r in (data or {}).get("rows", []):
            if r.get("mode") == SPEED_MODE and r.get("decoder") in (TREE_MTAD, b) and r.get("wall"):
                tok, wall = sums[(r["task"], r["prompt"])].get(r["decoder"], [0.0, 0.0])
                sums[(r["task"], r["prompt"])][r["decoder"]] = [tok + r["tokens"], wall + r["wall"]]
        pairs = {k: {d: (t, w) for d, (t, w) in v.items()} for k, v in sums.items() if len(v) == 2}
        if not pairs:
            why = f"{path} not found" if data is None else f"no {SPEED_MODE} rows of tree_mtad and {b} in {path}"
            rows.append(Row(4, ALL, comparison, metric, paper, size=OPEN, detail=f"no records: {why}",
                            headline=True))
            continue
        what = f"{path}: {_speed_description(data, pairs)}; mode={SPEED_MODE}, paired by prompt"
        by_task: dict[str, tuple[list, list]] = {}
        for (task, _), v in sorted(pairs.items()):
            xs, ys = by_task.setdefault(task, ([], []))
            xs.append(v[TREE_MTAD][0] / v[TREE_MTAD][1])
            ys.append(v[b][0] / v[b][1])
        for task, (xs, ys) in by_task.items():
            iv = stats.ratio_of_geometric_means(xs, ys, seed=seed)
            rows.append(_fill(Row(4, task, comparison, metric, paper), iv, test, size, what))
        row = Row(4, ALL, comparison, metric, paper, size=OPEN, headline=True)
        logs = {t: (list(np.log(xs)), list(np.log(ys))) for t, (xs, ys) in by_task.items()}
        iv, pooled, full = pool(logs, stats.stratified_ratio, seed)
        if iv is None:
            row.detail = f"{what}; fewer than two prompts per task: no pooled interval"
        else:
            row = _fill(row, iv, test, size, f"{what}; {pooled}")
            row = row if full else _withhold(row)
        rows.append(row)
    return rows


def energy_rows(records: Records) -> list[Row]:
    """Claim 7 (energy): measured only where the records carry energy; this machine has none."""
    rows = []
    for b, paper in ((SPD, "1.54x less (another summary: 23.6% less)"), (MCSS, "23.4% less")):
        points = [p for d in (TREE_MTAD, b) for t in TASKS for p in records.get((d, t), [])]
        metered = sum(1 for p in points for r in p.records.values() if r.get("energy_j") is not None)
        reasons = sorted({p.energy_reason for p in points if p.energy_reason})
        if metered:
            detail = f"{metered} records carry energy_j; this report does not test energy"
        else:
            detail = ENERGY_UNAVAILABLE + (f": {reasons[0]}" if reasons else "")
        rows.append(Row(7, ALL, f"{TREE_MTAD} vs {b}", "energy (J/token) ratio", paper, size=OPEN,
                        detail=detail, headline=True))
    return rows


def adjust(rows: Sequence[Row]) -> None:
    """Holm over the family of every row with a p-value (every verdict-bearing row of the report):
    a ``holds`` stays only where its adjusted p is below ``ALPHA``."""
    for r, p in zip(rows, stats.holm([r.p_value for r in rows])):
        r.holm_p = p
        if r.verdict == HOLDS:
            r.holm_verdict = HOLDS if p < ALPHA else OPEN
        else:
            r.holm_verdict = r.verdict


def evaluate_claims(records: Records, speed_file: str | Path, seed: int = 0) -> list[Row]:
    """Every row of the report: the claims on ``records``, claim 4 from the speed benchmark
    ``speed_file`` (``make bench-claim4``; a missing file gives rows "no records"), claim 7."""
    rows = [compare(records, spec, seed) for spec in specs()]
    rows += speed_rows(Path(speed_file), seed) + energy_rows(records)
    adjust(rows)
    mark_rows(rows)
    return sorted(rows, key=lambda r: r.claim)  # stable: rows keep their order within a claim


def mark_rows(rows: Sequence[Row]) -> None:
    """Each row's ``marks``: the provenance marks of the points it compares, together (a mark
    any of them carries, ``MARKS`` order), with the audits of the results tree they are in."""
    from mtad.analysis.provenance_marks import (
        MARKS,
        audit_folder,
        diverging_points,
        identical_records,
        point_marks,
    )

    audits: dict = {}
    for r in rows:
        found: set[str] = set()
        for where in r.points:
            audit_dir = audit_folder(Path(where))
            if audit_dir not in audits:
                audits[audit_dir] = (diverging_points(audit_dir), identical_records(audit_dir))
            if Path(where).is_dir():
                found |= set(point_marks(where, *audits[audit_dir]))
        r.marks = "".join(m for m in MARKS if m in found)


def task_data(records: Records) -> dict[str, list[tuple[str, bool | None]]]:
    """Per task, the data sources its points name and whether each is a stand-in."""
    out: dict[str, set] = defaultdict(set)
    for (_, task), points in records.items():
        for p in points:
            if p.data_source is not None:
                out[task].add((p.data_source, p.data_substitute))
    return {t: sorted(v, key=str) for t, v in sorted(out.items())}


def main(argv: Sequence[str] | None = None) -> int:
    from mtad.analysis import claims_report
    ap = argparse.ArgumentParser(prog="python -m mtad.analysis.claims", description=__doc__.split("\n")[0])
    ap.add_argument("root", help="records root (e.g. results/claims: the sweeps of claims*.yaml)")
    ap.add_argument("--out", required=True, help="output folder for claims.md/.csv and the figure")
    ap.add_argument("--speed", default="results/bench/speed_claim4_cpu.json",
                    help="interleaved speed benchmark of claim 4 (make bench-claim4; default: %(default)s)")
    ap.add_argument("--notes", help="a markdown file appended to claims.md (e.g. the pilot's N reasoning)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = ap.parse_args(argv)
    records, notes = read_records(args.root)
    rows = evaluate_claims(records, Path(args.speed), args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    claims_report.write_csv(rows, out / "claims.csv")
    extra = Path(args.notes).read_text() if args.notes else ""
    claims_report.write_markdown(rows, notes, out / "claims.md", extra, task_data(records))
    claims_report.plot_perplexity(rows, out / "perplexity_ratio.png")
    counts = claims_report.verdict_counts(rows)
    print(
        f"{len(rows)} rows ({', '.join(f'{v}: {c}' for v, c in counts.items())}) -> "
        f"{out / 'claims.md'}, {out / 'claims.csv'}, {out / 'perplexity_ratio.png'}"
    )
    return 0


def cli() -> None:
    """The console script (``[project.scripts]`` in pyproject.toml)."""
    from mtad.run.results import exit_on_bad_results

    exit_on_bad_results(main)


if __name__ == "__main__":
    cli()

"""Confidence intervals for paired comparisons of decoders: the project's one bootstrap.

Every interval comes from ``scipy.stats.bootstrap`` (percentile method by default, ``BCa``
on request; ``n_resamples`` = 9999; a fixed seed through ``rng=np.random.default_rng(seed)``,
so a report is reproducible; 95% by default). Comparisons are paired: two decoders run on
the same examples with the same seeds, and the bootstrap resamples examples, keeping each
example's pair together (``paired=True``).

* ``bootstrap_ci``: interval of one statistic of one sample (``present`` drops the missing
  values of a metric first: None and NaN); ``bootstrap_stderr``: the standard error of the same
  bootstrap (the scorers' ``stderr``, ``eval.base``);
* ``paired_bootstrap``: a statistic of two paired samples (default: mean of ``a - b``);
* ``perplexity_ratio``: ratio of geometric-mean perplexities from per-example
  log-perplexities, ``exp(mean(log ppl_a - log ppl_b))``, interval = exp of the paired
  interval of the mean log difference (< 1: ``a`` has the lower perplexity);
* ``ratio_of_geometric_means``: the same for paired positive values (tokens/s);
* ``binary_difference``: difference of success rates of 0/1 scores (Spider EX, HumanEval
  pass@1) with its paired interval and the exact McNemar p-value (two-sided binomial test
  on the discordant pairs, ``scipy.stats.binomtest``); when every pair differs alike (no
  discordant pairs, or all discordant the same way) the bootstrap has nothing to resample
  and the interval is Newcombe's hybrid score interval for paired proportions
  (``newcombe_paired``), never of zero width;
* ``relative_change``: mean(a) / mean(b) - 1 of paired scores (the paper's "+43%");
* ``mean_difference``: mean paired difference of a continuous score (CNN/DM Rouge-L);
* ``stratified_mean_difference`` / ``stratified_ratio`` / ``stratified_relative_change``: the
  same pooled over strata (tasks) with equal weight per stratum, the bootstrap resampling
  pairs within each stratum (``scipy.stats.bootstrap`` with one sample per stratum,
  ``paired=False``).

P-values (``p_value``) come from the same resamples, by inverting the percentile interval:
the one-sided p of "the statistic is above (below) ``ref``" is (1 + the resamples on or past
``ref`` on the other side) / (1 + resamples), so a 95% interval wholly above ``ref`` is a
p below ~0.025; for an exact interval (Newcombe's) it is the level at which the interval's
bound reaches ``ref``. ``holm`` and ``benjamini_hochberg`` adjust a family of them.

Fewer than two pairs give an interval of NaN (nothing to resample), and so do samples
without spread (every pair differs alike: a bootstrap would return a zero-width interval
that excludes everything but the estimate). This module knows nothing about decoders, tasks
or files: arrays in, intervals out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

LEVEL = 0.95
N_RESAMPLES = 9999
METHODS = ("percentile", "BCa")


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n: int  # observations (pairs for paired statistics)
    p_value: float | None = None  # McNemar's exact p for binary scores
    detail: str = ""
    #: the bootstrap distribution of the statistic, on the reported scale (for ``p_value``)
    replicates: np.ndarray | None = field(default=None, compare=False, repr=False)
    #: an exact method's interval at another level (for ``p_value`` by inversion)
    at_level: Callable[[float], tuple[float, float]] | None = field(default=None, compare=False, repr=False)

    @property
    def width(self) -> float:
        return self.high - self.low


def _array(values: Sequence[float]) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D sequence of numbers, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("values must be finite (drop missing examples before pairing)")
    return arr


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def bootstrap_ci(
    values: Sequence[float],
    statistic: Callable = np.mean,
    level: float = LEVEL,
    method: str = "percentile",
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """(low, high) bootstrap interval of ``statistic(values)``; NaNs below two values.

    ``statistic`` takes the sample (and ``axis=`` when it is vectorised, as numpy's are).
    """
    _check_method(method)
    arr = _array(values)
    if arr.size < 2:
        return math.nan, math.nan
    return _scipy_interval((arr,), statistic, False, level, method, n_resamples, seed)[:2]


def ratio_of_totals(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.sum(a, axis=axis) / np.sum(b, axis=axis)


def ratio_ci(
    numerators: Sequence[float],
    denominators: Sequence[float],
    level: float = LEVEL,
    method: str = "percentile",
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """(low, high) bootstrap interval of ``sum(numerators) / sum(denominators)``, resampling the
    pairs (examples): the interval of a rate pooled over examples, such as tokens/s = total
    tokens / total time, so that the estimate and its interval are the same statistic."""
    _check_method(method)
    x, y = _array(numerators), _array(denominators)
    if x.size < 2 or x.size != y.size:
        return math.nan, math.nan
    return _scipy_interval((x, y), ratio_of_totals, True, level, method, n_resamples, seed)[:2]


def present(values: Sequence[float | None]) -> list[float]:
    """The values of a metric that are present: None and NaN dropped (an example without the
    metric), as floats."""
    return [float(v) for v in values if v is not None and not math.isnan(v)]


def bootstrap_stderr(values: Sequence[float], statistic: Callable = np.mean, seed: int = 0) -> float:
    """Bootstrap standard error of ``statistic(values)``: the standard deviation of the bootstrap
    distribution of the resampling ``bootstrap_ci`` makes (same resamples, method and seed); NaN
    below two values. Values are taken as they are (a NaN gives a NaN)."""
    arr = np.asarray(values, dtype=float)
    if arr.size < 2:
        return math.nan
    return float(_resample((arr,), statistic, False, LEVEL, "percentile", N_RESAMPLES, seed).standard_error)


def _resample(samples: tuple, statistic: Callable, paired: bool, level: float, method: str,
              n_resamples: int, seed: int):
    """``scipy.stats.bootstrap`` over ``samples`` with the project's settings: the one call to it."""
    from scipy import stats  # imported on use: the engine path (a GPU node's check) needs no scipy

    return stats.bootstrap(
        samples,
        statistic,
        n_resamples=n_resamples,
        confidence_level=level,
        method=method,
        paired=paired,
        rng=np.random.default_rng(seed),
    )


def _scipy_interval(samples: tuple, statistic: Callable, paired: bool, level: float, method: str,
                    n_resamples: int, seed: int) -> tuple[float, float, np.ndarray]:
    """(low, high, bootstrap distribution) of ``scipy.stats.bootstrap`` over ``samples`` with
    the project's settings."""
    res = _resample(samples, statistic, paired, level, method, n_resamples, seed)
    ci = res.confidence_interval
    return float(ci.low), float(ci.high), np.asarray(res.bootstrap_distribution, dtype=float)


NO_SPREAD = "no spread: every pair differs alike, nothing for a bootstrap to resample"


def _constant(arr: np.ndarray) -> bool:
    """No spread beyond float rounding (0.23 - 0.25 and 0.24 - 0.26 differ in the last bit)."""
    return bool(arr.size == 0 or np.ptp(arr) <= 1e-12 * max(1.0, float(np.max(np.abs(arr)))))


def mean_of_differences(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(a - b, axis=axis)


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    statistic: Callable = mean_of_differences,
    level: float = LEVEL,
    method: str = "percentile",
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> Interval:
    """``statistic(a, b)`` on paired samples (``a[i]``, ``b[i]`` from the same example) with a
    bootstrap interval that resamples pairs."""
    _check_method(method)
    x, y = _array(a), _array(b)
    if x.shape != y.shape:
        raise ValueError(f"paired samples need equal lengths, got {x.size} and {y.size}")
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, detail="no pairs")
    estimate = float(statistic(x, y))
    if n < 2:
        return Interval(estimate, math.nan, math.nan, n, detail="fewer than 2 pairs")
    if (statistic is mean_of_differences and _constant(x - y)) or (_constant(x) and _constant(y)):
        return Interval(estimate, math.nan, math.nan, n, detail=NO_SPREAD)
    lo, hi, reps = _scipy_interval((x, y), statistic, True, level, method, n_resamples, seed)
    return Interval(estimate, lo, hi, n, replicates=reps)


def perplexity_ratio(log_ppl_a: Sequence[float], log_ppl_b: Sequence[float], **kw) -> Interval:
    """Ratio of geometric-mean perplexities a / b from per-example log-perplexities."""
    return _exp(paired_bootstrap(log_ppl_a, log_ppl_b, **kw))


def _exp(d: Interval) -> Interval:
    """An interval of a mean log difference as one of a ratio of geometric means."""
    return Interval(
        math.exp(d.estimate) if d.n else math.nan,
        math.exp(d.low),
        math.exp(d.high),
        d.n,
        detail=d.detail,
        replicates=None if d.replicates is None else np.exp(d.replicates),
    )


def ratio_of_geometric_means(a: Sequence[float], b: Sequence[float], **kw) -> Interval:
    """Ratio of geometric means a / b of paired positive values (e.g. tokens/s)."""
    x, y = _array(a), _array(b)
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("a ratio of geometric means needs positive values")
    return perplexity_ratio(np.log(x), np.log(y), **kw)


def mcnemar_exact(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided exact McNemar p-value for paired 0/1 outcomes (1.0 without discordant pairs)."""
    x, y = _binary(a), _binary(b)
    only_a = int(np.sum((x == 1) & (y == 0)))
    only_b = int(np.sum((x == 0) & (y == 1)))
    if only_a + only_b == 0:
        return 1.0
    from scipy import stats

    return float(stats.binomtest(only_a, only_a + only_b, 0.5).pvalue)


def _binary(values: Sequence[float]) -> np.ndarray:
    arr = _array(values)
    if not np.isin(arr, (0.0, 1.0)).all():
        raise ValueError("binary scores must be 0 or 1")
    return arr


def binary_difference(a: Sequence[float], b: Sequence[float], **kw) -> Interval:
    """Success rate of a minus that of b, paired interval, exact McNemar p-value."""
    x, y = _binary(a), _binary(b)
    d = paired_bootstrap(x, y, **kw)
    only_a = int(np.sum((x == 1) & (y == 0)))
    only_b = int(np.sum((x == 0) & (y == 1)))
    detail = f"discordant pairs: {only_a} only a, {only_b} only b"
    low, high, at_level = d.low, d.high, None
    if d.detail == NO_SPREAD:  # the bootstrap has nothing to resample: the exact interval
        level = kw.get("level", LEVEL)

        def at_level(lv: float, x=x, y=y) -> tuple[float, float]:
            return newcombe_paired(x, y, lv)

        low, high = at_level(level)
        detail += "; Newcombe hybrid score interval (every pair differs alike)"
    return Interval(
        d.estimate,
        low,
        high,
        d.n,
        p_value=mcnemar_exact(x, y) if d.n else None,
        detail=detail,
        replicates=d.replicates,
        at_level=at_level,
    )


def _wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def newcombe_paired(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Newcombe's hybrid score interval (1998, method 10) for the difference of two paired
    proportions, mean(a) - mean(b) of 0/1 outcomes: Wilson intervals of both proportions
    combined with the phi correlation of the 2x2 table. Defined (and of non-zero width)
    when every pair is concordant, where a bootstrap collapses to a point."""
    x, y = _binary(a), _binary(b)
    n = x.size
    if n == 0:
        return math.nan, math.nan
    if level <= 0:
        d = float(x.mean() - y.mean())
        return d, d
    from scipy import stats

    z = float(stats.norm.ppf(0.5 + level / 2))
    e = int(np.sum((x == 1) & (y == 1)))
    f = int(np.sum((x == 1) & (y == 0)))
    g = int(np.sum((x == 0) & (y == 1)))
    h = n - e - f - g
    p1, p2 = (e + f) / n, (e + g) / n
    l1, u1 = _wilson(e + f, n, z)
    l2, u2 = _wilson(e + g, n, z)
    denom = (e + f) * (g + h) * (e + g) * (f + h)
    phi = (e * h - f * g) / math.sqrt(denom) if denom else 0.0
    delta = math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    eps = math.sqrt(max((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0.0))
    return p1 - p2 - delta, p1 - p2 + eps


def mean_difference(a: Sequence[float], b: Sequence[float], **kw) -> Interval:
    """Mean paired difference a - b of a continuous score (e.g. Rouge-L)."""
    return paired_bootstrap(a, b, **kw)


def _mean_of_means(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean([np.mean(x, axis=axis) for x in samples], axis=0)


def stratified_mean_difference(
    groups: Sequence[tuple[Sequence[float], Sequence[float]]],
    level: float = LEVEL,
    method: str = "percentile",
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> Interval:
    """Mean over strata of the mean paired difference a - b, each stratum weighing the same.

    ``groups``: one (a, b) pair of paired samples per stratum (e.g. per task). The bootstrap
    resamples the pairs of each stratum independently (a stratified bootstrap), so every
    resample keeps each stratum's size; ``n`` counts the pairs over all strata.
    """
    _check_method(method)
    diffs = []
    for a, b in groups:
        x, y = _array(a), _array(b)
        if x.shape != y.shape:
            raise ValueError(f"paired samples need equal lengths, got {x.size} and {y.size}")
        diffs.append(x - y)
    n = int(sum(d.size for d in diffs))
    if not diffs or n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, detail="no pairs")
    estimate = float(_mean_of_means(*diffs))
    if min(d.size for d in diffs) < 2:
        return Interval(estimate, math.nan, math.nan, n, detail="a stratum with fewer than 2 pairs")
    if all(_constant(d) for d in diffs):
        return Interval(estimate, math.nan, math.nan, n, detail=NO_SPREAD)
    lo, hi, reps = _scipy_interval(tuple(diffs), _mean_of_means, False, level, method, n_resamples, seed)
    return Interval(estimate, lo, hi, n, replicates=reps)


def stratified_ratio(groups: Sequence[tuple[Sequence[float], Sequence[float]]], **kw) -> Interval:
    """exp of ``stratified_mean_difference`` of per-example logs: a ratio of geometric means
    pooled over strata with equal weight (e.g. the perplexity ratio over all tasks)."""
    return _exp(stratified_mean_difference(groups, **kw))


def _relative(mean_a: np.ndarray, mean_b: np.ndarray) -> np.ndarray:
    """mean_a / mean_b - 1; +inf where a resample's baseline mean is 0 (no finite change)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean_b > 0, mean_a / np.where(mean_b > 0, mean_b, 1.0) - 1.0, np.inf)


def _relative_change(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return _relative(np.mean(a, axis=axis), np.mean(b, axis=axis))


def relative_change(a: Sequence[float], b: Sequence[float], **kw) -> Interval:
    """mean(a) / mean(b) - 1 of paired non-negative scores (e.g. +0.43: a scores 43% more),
    paired bootstrap interval; NaN when b's mean is 0."""
    x, y = _array(a), _array(b)
    if (x < 0).any() or (y < 0).any():
        raise ValueError("a relative change of scores needs non-negative values")
    if x.size and y.mean() <= 0:
        return Interval(math.nan, math.nan, math.nan, int(x.size), detail="the baseline's mean score is 0")
    with np.errstate(invalid="ignore"):  # scipy's spread of replicates that hold +inf
        return paired_bootstrap(x, y, statistic=_relative_change, **kw)


def stratified_relative_change(
    groups: Sequence[tuple[Sequence[float], Sequence[float]]],
    level: float = LEVEL,
    method: str = "percentile",
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> Interval:
    """Mean over strata of each stratum's ``relative_change`` (equal weight per stratum; the
    paper's "on average" over tasks), the bootstrap resampling pairs within each stratum."""
    _check_method(method)
    pairs = []
    for a, b in groups:
        x, y = _array(a), _array(b)
        if x.shape != y.shape:
            raise ValueError(f"paired samples need equal lengths, got {x.size} and {y.size}")
        pairs.append((x, y))
    n = int(sum(x.size for x, _ in pairs))
    if not pairs or n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, detail="no pairs")
    if any(y.mean() <= 0 for _, y in pairs):
        return Interval(math.nan, math.nan, math.nan, n, detail="a stratum whose baseline mean score is 0")
    estimate = float(np.mean([_relative_change(x, y) for x, y in pairs]))
    if min(x.size for x, _ in pairs) < 2:
        return Interval(estimate, math.nan, math.nan, n, detail="a stratum with fewer than 2 pairs")
    if all(_constant(x) and _constant(y) for x, y in pairs):
        return Interval(estimate, math.nan, math.nan, n, detail=NO_SPREAD)

    def statistic(*index: np.ndarray, axis: int = -1) -> np.ndarray:
        # the resampled items are each stratum's pair indices: a pair stays together
        changes = [_relative_change(x[i.astype(int)], y[i.astype(int)], axis=axis)
                   for (x, y), i in zip(pairs, index)]
        return np.mean(changes, axis=0)

    index = tuple(np.arange(x.size, dtype=float) for x, _ in pairs)
    with np.errstate(invalid="ignore"):  # scipy's spread of replicates that hold +inf
        lo, hi, reps = _scipy_interval(index, statistic, False, level, method, n_resamples, seed)
    return Interval(estimate, lo, hi, n, replicates=reps)


# ------------------------------------------------------------------------------ p-values
def p_value(iv: Interval, ref: float, claimed: str) -> float:
    """One-sided p-value of "the statistic is ``claimed`` ("above" / "below") ``ref``".

    From the bootstrap replicates: (1 + replicates on the null side, ``ref`` included) /
    (1 + replicates), the inversion of the percentile interval. From an exact interval
    (``at_level``): the one-sided level at which its bound reaches ``ref`` (bisection).
    NaN when the interval has neither (no pairs, no spread).
    """
    if claimed not in ("above", "below"):
        raise ValueError(f"claimed must be 'above' or 'below', got {claimed!r}")
    if iv.replicates is not None and iv.replicates.size:
        reps = iv.replicates[~np.isnan(iv.replicates)]
        null = np.sum(reps <= ref) if claimed == "above" else np.sum(reps >= ref)
        return float((1 + null) / (1 + reps.size))
    if iv.at_level is None:
        return math.nan

    def beyond(alpha: float) -> bool:  # the one-sided 1 - alpha bound excludes ref
        lo, hi = iv.at_level(1 - 2 * alpha)
        return lo > ref if claimed == "above" else hi < ref

    if not beyond(0.5 - 1e-12):
        return 1.0
    lo_a, hi_a = 0.0, 0.5
    for _ in range(60):
        mid = (lo_a + hi_a) / 2
        lo_a, hi_a = (lo_a, mid) if beyond(mid) else (mid, hi_a)
    return hi_a


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error under any dependence); NaN stays NaN."""
    idx = [i for i, p in enumerate(p_values) if not math.isnan(p)]
    order = sorted(idx, key=lambda i: p_values[i])
    out = [math.nan] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_values[i]))
        out[i] = running
    return out


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (false discovery rate); NaN stays NaN."""
    idx = [i for i, p in enumerate(p_values) if not math.isnan(p)]
    order = sorted(idx, key=lambda i: p_values[i])
    out = [math.nan] * len(p_values)
    running = 1.0
    m = len(order)
    for rank in range(m - 1, -1, -1):
        i = order[rank]
        running = min(running, m * p_values[i] / (rank + 1))
        out[i] = running
    return out

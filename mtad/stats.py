"""Confidence intervals for paired comparisons of decoders: the project's one bootstrap.

Every interval comes from ``scipy.stats.bootstrap`` (percentile method by default, ``BCa``
on request; ``n_resamples`` = 9999; a fixed seed through ``rng=np.random.default_rng(seed)``,
so a report is reproducible; 95% by default). Comparisons are paired: two decoders run on
the same examples with the same seeds, and the bootstrap resamples examples, keeping each
example's pair together (``paired=True``).

* ``bootstrap_ci``: interval of one statistic of one sample;
* ``paired_bootstrap``: a statistic of two paired samples (default: mean of ``a - b``);
* ``perplexity_ratio``: ratio of geometric-mean perplexities from per-example
  log-perplexities, ``exp(mean(log ppl_a - log ppl_b))``, interval = exp of the paired
  interval of the mean log difference (< 1: ``a`` has the lower perplexity);
* ``ratio_of_geometric_means``: the same for paired positive values (tokens/s);
* ``binary_difference``: difference of success rates of 0/1 scores (Spider EX, HumanEval
  pass@1) with its paired interval and the exact McNemar p-value (two-sided binomial test
  on the discordant pairs, ``scipy.stats.binomtest``);
* ``mean_difference``: mean paired difference of a continuous score (CNN/DM Rouge-L);
* ``stratified_mean_difference`` / ``stratified_ratio``: the same pooled over strata (tasks)
  with equal weight per stratum, the bootstrap resampling pairs within each stratum
  (``scipy.stats.bootstrap`` with one sample per stratum, ``paired=False``).

Fewer than two pairs give an interval of NaN (nothing to resample). This module knows
nothing about decoders, tasks or files: arrays in, intervals out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

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
    return _scipy_interval((arr,), statistic, False, level, method, n_resamples, seed)


def _scipy_interval(samples: tuple, statistic: Callable, paired: bool, level: float, method: str,
                    n_resamples: int, seed: int) -> tuple[float, float]:
    """(low, high) of ``scipy.stats.bootstrap`` over ``samples`` with the project's settings."""
    res = stats.bootstrap(
        samples,
        statistic,
        n_resamples=n_resamples,
        confidence_level=level,
        method=method,
        paired=paired,
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


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
    if statistic is mean_of_differences and np.ptp(x - y) == 0:
        return Interval(estimate, estimate, estimate, n)  # every pair differs alike: no spread
    lo, hi = _scipy_interval((x, y), statistic, True, level, method, n_resamples, seed)
    return Interval(estimate, lo, hi, n)


def perplexity_ratio(log_ppl_a: Sequence[float], log_ppl_b: Sequence[float], **kw) -> Interval:
    """Ratio of geometric-mean perplexities a / b from per-example log-perplexities."""
    d = paired_bootstrap(log_ppl_a, log_ppl_b, **kw)
    return Interval(
        math.exp(d.estimate) if d.n else math.nan,
        math.exp(d.low),
        math.exp(d.high),
        d.n,
        detail=d.detail,
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
    return Interval(
        d.estimate,
        d.low,
        d.high,
        d.n,
        p_value=mcnemar_exact(x, y) if d.n else None,
        detail=f"discordant pairs: {only_a} only a, {only_b} only b",
    )


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
    if all(np.ptp(d) == 0 for d in diffs):
        return Interval(estimate, estimate, estimate, n)
    lo, hi = _scipy_interval(tuple(diffs), _mean_of_means, False, level, method, n_resamples, seed)
    return Interval(estimate, lo, hi, n)


def stratified_ratio(groups: Sequence[tuple[Sequence[float], Sequence[float]]], **kw) -> Interval:
    """exp of ``stratified_mean_difference`` of per-example logs: a ratio of geometric means
    pooled over strata with equal weight (e.g. the perplexity ratio over all tasks)."""
    d = stratified_mean_difference(groups, **kw)
    return Interval(
        math.exp(d.estimate) if d.n else math.nan, math.exp(d.low), math.exp(d.high), d.n, detail=d.detail
    )

"""mtad.core.stats: hand-computed cases, reproducibility with the seed, coverage on synthetic data."""

import math

import numpy as np
import pytest

from mtad.core.stats import (
    benjamini_hochberg,
    binary_difference,
    bootstrap_ci,
    holm,
    mcnemar_exact,
    mean_difference,
    newcombe_paired,
    p_value,
    paired_bootstrap,
    perplexity_ratio,
    relative_change,
    stratified_mean_difference,
    stratified_ratio,
    stratified_relative_change,
)


def test_mcnemar_exact_hand_computed():
    # 8 pairs where only a succeeds, 2 where only b does, 5 concordant (3 both, 2 neither):
    # two-sided binomial p = 2 * P(X <= 2 | 10, 1/2) = 2 * (1 + 10 + 45) / 1024
    a = [1] * 8 + [0] * 2 + [1] * 3 + [0] * 2
    b = [0] * 8 + [1] * 2 + [1] * 3 + [0] * 2
    assert mcnemar_exact(a, b) == pytest.approx(2 * 56 / 1024, rel=1e-12)
    assert mcnemar_exact([1, 0, 1], [1, 0, 1]) == 1.0  # no discordant pairs
    assert mcnemar_exact([1] * 5, [0] * 5) == pytest.approx(2 / 32)  # 5 vs 0: 2 * (1/2)^5
    d = binary_difference(a, b)
    assert d.estimate == pytest.approx((11 - 5) / 15) and d.n == 15
    assert d.p_value == pytest.approx(2 * 56 / 1024) and "8 only a, 2 only b" in d.detail
    assert d.low < d.estimate < d.high


def test_bootstrap_interval_contains_the_truth_and_is_seeded():
    rng = np.random.default_rng(1)
    x = rng.normal(2.0, 1.0, size=400)
    lo, hi = bootstrap_ci(x, seed=3)
    assert lo < 2.0 < hi
    # width close to the normal-theory 2 * 1.96 * s / sqrt(n)
    assert hi - lo == pytest.approx(2 * 1.96 * x.std(ddof=1) / math.sqrt(x.size), rel=0.15)
    assert bootstrap_ci(x, seed=3) == (lo, hi)
    assert bootstrap_ci(x, seed=4) != (lo, hi)
    assert bootstrap_ci(x, method="BCa", seed=3) != (lo, hi)
    assert bootstrap_ci(x, statistic=np.median, seed=3)[0] < np.median(x)


def test_bootstrap_coverage_on_synthetic_data():
    """Over 200 synthetic samples the 90% interval covers the true mean ~90% of the time."""
    rng = np.random.default_rng(7)
    covered = 0
    for i in range(200):
        x = rng.exponential(1.0, size=60)  # skewed; true mean 1
        lo, hi = bootstrap_ci(x, level=0.9, n_resamples=1000, seed=i)
        covered += lo < 1.0 < hi
    # binomial(200, ~0.9) sd ~ 4.2: 150 and 195 are > 6 sd away from 180 (the bootstrap
    # percentile interval undercovers a little on skewed data)
    assert 150 <= covered <= 195, covered


def test_paired_bootstrap_uses_the_pairing():
    """Large between-example spread, small paired noise: the interval follows the differences."""
    rng = np.random.default_rng(2)
    base = rng.normal(0, 10.0, size=200)
    noise = rng.normal(0, 0.1, size=200)
    a, b = base + 0.5 + noise, base
    d = paired_bootstrap(a, b, seed=0)
    assert d.low < 0.5 < d.high and d.n == 200
    assert d.width == pytest.approx(2 * 1.96 * noise.std(ddof=1) / math.sqrt(200), rel=0.2)
    assert paired_bootstrap(a, b, seed=0) == d
    # a custom paired statistic
    med = paired_bootstrap(a, b, statistic=lambda x, y, axis=-1: np.median(x - y, axis=axis))
    assert med.low < 0.5 < med.high


def test_perplexity_ratio_is_the_ratio_of_geometric_means():
    rng = np.random.default_rng(0)
    log_b = rng.normal(1.5, 0.4, size=50)
    exact = perplexity_ratio(log_b + math.log(0.8), log_b)  # every pair differs alike
    assert exact.estimate == pytest.approx(0.8) and math.isnan(exact.low) and math.isnan(exact.high)
    noisy_a = log_b + math.log(0.8) + rng.normal(0, 0.05, size=50)
    r = perplexity_ratio(noisy_a, log_b, seed=1)
    geo = math.exp(np.mean(noisy_a)) / math.exp(np.mean(log_b))
    assert r.estimate == pytest.approx(geo) and r.low < 0.8 < r.high and r.high < 1


def test_mean_difference_rouge():
    a = [0.30, 0.25, 0.40, 0.35]
    b = [0.28, 0.25, 0.37, 0.30]
    d = mean_difference(a, b)
    assert d.estimate == pytest.approx(0.025) and d.low <= d.estimate <= d.high
    assert 0 <= d.low  # every difference is >= 0


def test_degenerate_and_invalid_inputs():
    assert all(math.isnan(v) for v in bootstrap_ci([1.0]))
    one = paired_bootstrap([1.0], [0.0])
    assert one.estimate == 1.0 and math.isnan(one.low) and one.n == 1
    assert paired_bootstrap([], []).n == 0
    same = paired_bootstrap([1.0, 2.0, 3.0], [0.5, 1.5, 2.5], method="BCa")
    assert same.estimate == 0.5 and math.isnan(same.low) and math.isnan(same.high)
    with pytest.raises(ValueError, match="equal lengths"):
        paired_bootstrap([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="0 or 1"):
        binary_difference([1, 0.5], [0, 1])
    with pytest.raises(ValueError, match="method"):
        bootstrap_ci([1, 2, 3], method="basic")
    with pytest.raises(ValueError, match="finite"):
        paired_bootstrap([1, float("nan")], [1, 2])


def test_stratified_bootstrap_weighs_strata_equally_and_resamples_within_them():
    """Two tasks far apart (differences ~0 and ~10): equal weight gives ~5 whatever their sizes,
    and resampling within tasks keeps the between-task offset out of the interval (a pooled
    resample of all 60 differences would give a width of ~2.5)."""
    rng = np.random.default_rng(3)
    a0, a1 = rng.normal(0, 0.1, 20), rng.normal(10, 0.1, 40)
    groups = [(a0, np.zeros(20)), (a1, np.zeros(40))]
    d = stratified_mean_difference(groups, seed=0)
    assert d.estimate == pytest.approx((a0.mean() + a1.mean()) / 2) and d.n == 60
    se = math.sqrt(a0.var(ddof=1) / 20 + a1.var(ddof=1) / 40) / 2
    assert d.width == pytest.approx(2 * 1.96 * se, rel=0.2)
    assert d.low < d.estimate < d.high
    assert stratified_mean_difference(groups, seed=0) == d
    r = stratified_ratio([(np.log(x + 20), np.log(np.full(x.size, 20.0))) for x in (a0, a1)])
    assert r.estimate == pytest.approx(math.exp(np.mean([np.mean(np.log(x / 20 + 1)) for x in (a0, a1)])))
    assert stratified_mean_difference([([1.0], [0.0]), (a0, np.zeros(20))]).n == 21
    assert math.isnan(stratified_mean_difference([([1.0], [0.0]), (a0, np.zeros(20))]).low)
    assert stratified_mean_difference([]).n == 0


def test_identical_differences_give_no_interval_not_a_zero_width_one():
    """A zero-width interval at the estimate would pass any equivalence or non-inferiority
    test; without spread there is no bootstrap interval (NaN, said in ``detail``)."""
    d = mean_difference([0.3, 0.5, 0.7] * 10, [0.3, 0.5, 0.7] * 10)
    assert d.estimate == 0 and math.isnan(d.low) and math.isnan(d.high) and "no spread" in d.detail
    # a constant offset that float rounding spreads over the last bit is still no spread
    a = [0.25 + 0.01 * i for i in range(12)]
    off = mean_difference([x - 0.02 for x in a], a)
    assert np.ptp(np.subtract([x - 0.02 for x in a], a)) > 0 and math.isnan(off.low)
    s = stratified_mean_difference([([1.0] * 5, [1.0] * 5), ([2.0] * 6, [1.0] * 6)])
    assert math.isnan(s.low) and "no spread" in s.detail


def test_binary_pairs_without_discordance_get_newcombes_interval():
    """30 pairs that all succeed: the bootstrap collapses to [0, 0]; Newcombe's interval is
    +-(1 - the Wilson lower bound of 30/30) = +-(1 - 30 / (30 + z^2)) when phi = 0."""
    d = binary_difference([1] * 30, [1] * 30)
    z2 = 1.959963984540054**2
    half = 1 - 30 / (30 + z2)
    assert (d.estimate, d.low, d.high) == pytest.approx((0.0, -half, half), rel=1e-9)
    assert "Newcombe" in d.detail and d.p_value == 1.0
    # all discordant the same way: the difference is 1, the interval stays inside [-1, 1]
    one = binary_difference([1] * 12, [0] * 12)
    assert one.estimate == 1.0 and 0 < one.low < 1 and one.high == pytest.approx(1.0)
    # with discordant pairs both ways the bootstrap is used; Newcombe's interval is close
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    boot, exact = binary_difference(a, b), newcombe_paired(a, b)
    assert "Newcombe" not in boot.detail
    assert boot.low == pytest.approx(exact[0], abs=0.02) and boot.high == pytest.approx(exact[1], abs=0.02)


def test_relative_change_of_scores():
    rng = np.random.default_rng(4)
    b = rng.uniform(0.2, 0.4, 80)
    a = 1.5 * b + rng.normal(0, 0.01, 80)
    r = relative_change(a, b, seed=0)
    assert r.estimate == pytest.approx(a.mean() / b.mean() - 1) and r.low < 0.5 < r.high
    assert math.isnan(relative_change([1, 0], [0, 0]).estimate)
    # pooled: the mean of the strata's relative changes, whatever their sizes
    groups = [(2 * b[:20], b[:20]), (b + rng.normal(0, 0.01, 80), b)]
    s = stratified_relative_change(groups, seed=0)
    want = np.mean([np.mean(x) / np.mean(y) - 1 for x, y in groups])
    assert s.estimate == pytest.approx(want) and s.low < want < s.high and s.n == 100
    assert stratified_relative_change(groups, seed=0) == s


def test_p_values_invert_the_interval():
    """One-sided p from the same resamples: a 95% interval wholly above ref has p < 0.025, one
    that straddles it p > 0.025; an exact interval's p is where its bound reaches ref."""
    rng = np.random.default_rng(6)
    x = rng.normal(0.3, 1.0, 60)
    d = mean_difference(x, np.zeros(60), seed=0)
    for ref in (d.low - 1e-3, d.low + 1e-3, 0.0, d.estimate):
        assert (p_value(d, ref, "above") < 0.025) == (d.low > ref)
    assert (p_value(d, d.high + 1e-3, "below") < 0.025) and p_value(d, d.high - 1e-3, "below") > 0.025
    e = binary_difference([1] * 30, [1] * 30)
    lo95, _ = e.at_level(0.95)
    assert p_value(e, lo95, "above") == pytest.approx(0.025, abs=1e-9)  # the bound reaches ref
    assert p_value(e, 0.0, "above") == 1.0  # the estimate itself is not above 0
    assert p_value(e, -0.2, "above") < 0.025  # -0.2 lies below the 95% interval
    assert p_value(e, newcombe_paired([1] * 30, [1] * 30, 0.9)[0], "above") == pytest.approx(0.05, abs=1e-6)
    assert math.isnan(p_value(mean_difference([1.0, 1.0], [0.0, 0.0]), 0.0, "above"))


def test_holm_and_benjamini_hochberg_hand_computed():
    p = [0.01, 0.04, 0.03, math.nan, 0.005]
    assert holm(p)[:3] == pytest.approx([0.03, 0.06, 0.06]) and holm(p)[4] == pytest.approx(0.02)
    assert math.isnan(holm(p)[3])
    bh = benjamini_hochberg(p)
    assert bh[:3] == pytest.approx([0.02, 0.04, 0.04]) and bh[4] == pytest.approx(0.02)


def test_ratio_ci_is_the_interval_of_the_pooled_ratio():
    """A rate pooled over examples (sum of numerators / sum of denominators) lies inside its
    interval even when slow examples pull the mean of per-example rates away from it."""
    import numpy as np

    from mtad.core import stats

    rng = np.random.default_rng(0)
    tokens = rng.integers(20, 128, size=40).astype(float)
    seconds = tokens / rng.choice([1.0, 8.0], size=40)  # half the examples 8x slower
    pooled = tokens.sum() / seconds.sum()
    lo, hi = stats.ratio_ci(tokens, seconds)
    assert lo < pooled < hi
    mlo, mhi = stats.bootstrap_ci(tokens / seconds)
    assert not (mlo <= pooled <= mhi)  # the old interval missed its own estimate here
    assert all(map(np.isnan, stats.ratio_ci([1.0], [2.0])))

"""Metric conventions (mtad.core.metrics): block efficiency, acceptance, perplexity, bootstrap CIs, summarize()."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mtad.core.metrics import (
    acceptance_rate,
    block_efficiency,
    per_depth_acceptance,
    perplexity,
    summarize,
    token_logprobs,
    tokens_per_second,
)
from mtad.core.stats import bootstrap_ci, present


def test_block_efficiency_conventions():
    assert block_efficiency(emitted=10, steps=10) == 1.0  # autoregressive: one token per step
    assert block_efficiency(emitted=9, steps=3) == 3.0  # 2 accepted + 1 correction/bonus per step
    assert math.isnan(block_efficiency(0, 0))


def test_block_efficiency_counts_what_a_truncated_last_step_emitted():
    """A last step cut short by max_new_tokens (or EOS) accepted 2 draft tokens but kept 2
    tokens, not 2 + 1: tokens per step is 7 / 2, where (accepted + steps) / steps said 4."""
    from mtad.core.engine import GenerationResult, StepRecord

    def step(accepted, emitted):
        return StepRecord(drafted=4, accepted=accepted, emitted=emitted, tree_size=4,
                          target_passes=1, target_time=0.0, draft_time=0.0, wall_time=0.0)

    res = GenerationResult(prompt_ids=[1], output_ids=list(range(7)), steps=[step(4, 5), step(2, 2)])
    assert res.block_efficiency == pytest.approx(3.5) == res.new_tokens / res.num_steps
    rec = res.to_record()
    assert rec["block_efficiency"] == pytest.approx(3.5)
    rec.update(wall_time=1.0, target_forward_time=0.5, draft_forward_time=0.2, energy_j=None)
    assert summarize([rec])["block_efficiency"] == pytest.approx(3.5)


def test_acceptance_rate():
    assert acceptance_rate(3, 4) == 0.75
    assert acceptance_rate(0, 8) == 0.0
    assert math.isnan(acceptance_rate(0, 0))  # nothing drafted (autoregressive): undefined, not 0


def test_per_depth_acceptance():
    assert per_depth_acceptance([0, 1, 3, 2]) == [0.75, 0.5, 0.25]
    assert per_depth_acceptance([0, 0]) == []
    assert per_depth_acceptance([]) == []
    rates = per_depth_acceptance([4, 1, 2, 0, 4])
    assert all(a >= b for a, b in zip(rates, rates[1:]))  # monotone in depth


def test_tokens_per_second():
    assert tokens_per_second(30, 1.5) == 20.0
    assert math.isnan(tokens_per_second(5, 0.0))


def test_perplexity_of_known_logprobs():
    lp = torch.log(torch.tensor([0.5, 0.25], dtype=torch.float64))
    assert perplexity(lp) == pytest.approx(math.sqrt(8))  # exp(-(ln .5 + ln .25) / 2)
    assert perplexity(torch.zeros(5, dtype=torch.float64)) == pytest.approx(1.0)
    uniform = torch.full((7,), -math.log(50), dtype=torch.float64)
    assert perplexity(uniform) == pytest.approx(50.0)
    assert math.isnan(perplexity(torch.empty(0)))


def test_token_logprobs_matches_a_manual_forward():
    from mtad.models.tiny import tiny_causal_lm

    model = tiny_causal_lm("qwen2", vocab_size=12, hidden_size=16, num_layers=1, num_heads=2, seed=5,
                           dtype=torch.float64)
    prompt, out = [1, 2, 3], [4, 5, 6, 7]
    lp = token_logprobs(model, prompt, out)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + out])).logits[0].double()
    ref = torch.log_softmax(logits, -1)
    expect = torch.stack([ref[len(prompt) - 1 + i, t] for i, t in enumerate(out)])
    assert lp.dtype == torch.float64 and torch.allclose(lp, expect, atol=1e-10)
    lp_cut = token_logprobs(model, prompt, out, vocab_size=10)  # logits cut to the tokenizer's size
    assert torch.all(lp_cut >= lp - 1e-12)
    assert token_logprobs(model, prompt, []).numel() == 0


def test_bootstrap_ci_sanity():
    rng = np.random.default_rng(1)
    vals = rng.normal(10.0, 2.0, size=200)
    lo, hi = bootstrap_ci(vals)
    assert lo < vals.mean() < hi and hi - lo < 1.0  # ~ 2 * 1.96 * 2 / sqrt(200) = 0.55
    assert bootstrap_ci(vals) == bootstrap_ci(vals)  # seeded
    assert bootstrap_ci([3.0] * 10) == (3.0, 3.0)
    assert all(math.isnan(x) for x in bootstrap_ci([1.0]))
    assert present([1.0, None, float("nan"), 1.0]) == [1.0, 1.0]  # a metric's missing values
    assert bootstrap_ci(present([1.0, None, float("nan"), 1.0])) == (1.0, 1.0)
    wide = bootstrap_ci(vals, level=0.99)
    assert wide[0] <= lo and wide[1] >= hi


def _record(tokens, wall, accepted, drafted, energy=None, ppl=None, nll=None):
    return {"new_tokens": tokens, "wall_time": wall, "steps": len(accepted), "accepted_per_step": accepted,
            "drafted_per_step": drafted, "target_forward_time": wall / 2, "draft_forward_time": wall / 4,
            "energy_j": energy, "perplexity": ppl, "nll_sum": nll}


def test_summarize_hand_made_records():
    recs = [_record(6, 2.0, [2, 2], [3, 3], energy=3.0, ppl=2.0, nll=6 * math.log(2.0)),
            _record(4, 2.0, [0, 0, 2], [3, 3, 3], energy=1.0, ppl=4.0, nll=4 * math.log(4.0))]
    recs[0]["emitted_per_step"], recs[1]["emitted_per_step"] = [3, 3], [1, 1, 2]  # last step cut
    s = summarize(recs)
    assert s["examples"] == 2 and s["new_tokens"] == 10 and s["steps"] == 5
    assert s["tokens_per_s"] == pytest.approx(2.5) and s["ms_per_token"] == pytest.approx(400.0)
    assert s["block_efficiency"] == pytest.approx(10 / 5)  # emitted / steps, not (6 + 5) / 5
    assert s["acceptance_rate"] == pytest.approx(6 / 15)
    assert s["per_depth_acceptance"] == pytest.approx([3 / 5, 3 / 5])
    assert s["perplexity"] == pytest.approx(3.0)  # mean of per-example perplexities
    assert s["perplexity_pooled"] == pytest.approx(math.exp((6 * math.log(2) + 4 * math.log(4)) / 10))
    assert s["joules"] == pytest.approx(4.0) and s["j_per_token"] == pytest.approx(0.4)
    assert s["overhead_share"] == pytest.approx(0.25)
    lo, hi = s["tokens_per_s_ci"]
    assert 2.0 <= lo <= hi <= 3.0


def test_summarize_autoregressive_and_missing_energy():
    recs = [_record(5, 1.0, [0] * 5, [0] * 5, energy=None), _record(5, 1.0, [0] * 5, [0] * 5, energy=2.0)]
    s = summarize(recs)
    assert s["block_efficiency"] == 1.0
    assert math.isnan(s["acceptance_rate"]) and s["per_depth_acceptance"] == []
    assert s["joules"] is None and s["j_per_token"] is None  # one example unmetered: unknown, never 0
    assert "perplexity" not in s
    assert summarize([]) == {"examples": 0}


def test_one_bootstrap_for_metrics_and_scores():
    """Metric intervals are ``mtad.core.stats``' (missing values dropped); a scorer's standard error comes
    from the same bootstrap (about a quarter of the 95% interval's width for a mean)."""
    from eval.base import bootstrap_stderr
    from mtad.core import stats
    rng = np.random.default_rng(2)
    vals = list(rng.normal(5.0, 1.0, size=100))
    assert bootstrap_ci(present(vals + [None, float("nan")])) == stats.bootstrap_ci(vals)
    lo, hi = stats.bootstrap_ci(vals)
    assert bootstrap_stderr(vals) == pytest.approx((hi - lo) / (2 * 1.96), rel=0.1)
    assert bootstrap_stderr is stats.bootstrap_stderr  # one implementation
    # summaries' intervals are that bootstrap over the examples that have the metric
    recs = [_record(5 + i, 1.0 + 0.1 * i, [1], [2], ppl=2.0 + i) for i in range(6)]
    recs.append(_record(4, 0.0, [1], [2]))  # no decoding time: no tokens/s, no perplexity
    s = summarize(recs)
    # tokens/s is total tokens / total time; its interval resamples examples for that same
    # ratio (not the mean of per-example rates, which need not contain the estimate)
    toks, walls = [r["new_tokens"] for r in recs[:6]], [r["wall_time"] for r in recs[:6]]
    assert s["tokens_per_s_ci"] == stats.ratio_ci(toks, walls)
    assert s["tokens_per_s_ci"] != stats.bootstrap_ci([a / b for a, b in zip(toks, walls)])
    assert s["perplexity_ci"] == stats.bootstrap_ci([2.0 + i for i in range(6)])


def test_scorer_stderr_is_the_bootstrap_it_always_was():
    """The scorers' stderr did not change with the move into mtad.core.stats: scipy's bootstrap,
    9999 percentile resamples, seed 0, its standard error, exactly."""
    from scipy.stats import bootstrap

    from eval.base import bootstrap_stderr

    rng = np.random.default_rng(3)
    vals = rng.integers(0, 2, size=40).astype(float)
    ref = bootstrap((vals,), np.mean, n_resamples=9999, method="percentile", rng=np.random.default_rng(0))
    assert bootstrap_stderr(vals) == float(ref.standard_error)
    assert bootstrap_stderr(list(vals), seed=5) == float(
        bootstrap((vals,), np.mean, n_resamples=9999, method="percentile",
                  rng=np.random.default_rng(5)).standard_error)
    assert math.isnan(bootstrap_stderr([1.0]))


def test_one_block_efficiency():
    """records_block_efficiency (a run's examples, an example's turns) is block_efficiency of the
    records' emitted tokens and steps; tokens per target pass is its own metric."""
    from mtad.core.metrics import records_block_efficiency, tokens_per_target_pass

    recs = [{"steps": 2, "emitted_per_step": [3, 1], "new_tokens": 4}, {"steps": 3, "new_tokens": 3}]
    assert records_block_efficiency(recs) == block_efficiency(7, 5)
    assert math.isnan(records_block_efficiency([{"steps": 0, "new_tokens": 0}]))
    assert tokens_per_target_pass(10, 4) == 2.5 and math.isnan(tokens_per_target_pass(3, 0))


def test_block_efficiency_interval_is_the_estimates_own_statistic():
    """Block efficiency's interval resamples examples for emitted tokens / steps over all of
    them (the estimate), so it contains the estimate; a decoder that emits one token per step
    everywhere has the zero-width interval [1, 1]."""
    from mtad.core import stats
    from mtad.core.metrics import block_efficiency_interval
    rng = np.random.default_rng(3)
    recs = []
    for _ in range(20):
        emitted = [int(x) for x in rng.integers(1, 6, size=int(rng.integers(2, 9)))]
        r = _record(sum(emitted), 1.0, [e - 1 for e in emitted], [4] * len(emitted))
        r["emitted_per_step"] = emitted
        recs.append(r)
    s = summarize(recs)
    lo, hi = s["block_efficiency_ci"]
    assert lo < s["block_efficiency"] < hi
    assert (lo, hi) == stats.ratio_ci([sum(r["emitted_per_step"]) for r in recs], [r["steps"] for r in recs])
    ar = [dict(_record(5, 1.0, [0] * 5, [0] * 5), emitted_per_step=[1] * 5) for _ in range(4)]
    assert block_efficiency_interval(ar) == pytest.approx((1.0, 1.0))


def test_summary_perplexity_keys_say_which_mean_they_hold():
    """``perplexity_mean`` (and the old key ``perplexity``) is the arithmetic mean of per-record
    perplexities; ``perplexity_geomean`` is the tables' statistic (``cell_statistics``)."""
    from mtad.core.metrics import cell_statistics, summarize

    recs = [{"example_id": f"e{i}", "index": i, "turn": 0, "new_tokens": 4, "wall_time": 1.0, "steps": 2,
             "accepted_per_step": [1, 1], "drafted_per_step": [2, 2], "emitted_per_step": [2, 2],
             "target_forward_time": 0.1, "draft_forward_time": 0.1, "perplexity": p,
             "nll_sum": 4 * math.log(p)} for i, p in enumerate((1.0, 4.0))]
    m = summarize(recs)
    assert m["perplexity_mean"] == m["perplexity"] == pytest.approx(2.5)
    assert m["perplexity_geomean"] == pytest.approx(2.0) == cell_statistics(recs)["perplexity"]

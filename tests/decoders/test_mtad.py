"""MTAD (chain): beam sampling, deterministic threshold acceptance, and its limiting cases."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from mtad.core.decoder import StepContext, StepOutput, residual, sample
from mtad.core.engine import Engine
from mtad.core.runner import ModelRunner
from mtad.core.tree import TokenTree
from mtad.core.warping import Warping
from mtad.decoders.autoregressive import Greedy
from mtad.decoders.mtad import MTAD
from mtad.models.tiny import tiny_causal_lm
from mtad.propose.beam import beam_sample, scoring_probs
from mtad.testing import chi_square_gof, exact_joint, sample_sequences
from mtad.verify.score import score
from mtad.verify.threshold import accept_length, cumulative_log_ratio

PROMPT = [2, 3, 4]


def toy(seed: int, vocab: int = 6, layers: int = 1, scale: float = 3.0):
    return tiny_causal_lm(
        "qwen2",
        vocab_size=vocab,
        hidden_size=16,
        num_layers=layers,
        num_heads=2,
        seed=seed,
        dtype=torch.float64,
        logit_scale=scale,
    )


# ----------------------------------------------------------------- pure acceptance rule


# ---------------------------------------------------------------------- beam sampling
def _ctx(runner_t, runner_d, committed, warping, seed=0):
    for r in (runner_t, runner_d):
        r.begin(committed)
    return StepContext(
        committed=committed,
        target=runner_t,
        draft=runner_d,
        warping=warping,
        generator=torch.Generator().manual_seed(seed),
        remaining=100,
    )


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("warping", [Warping(1.0), Warping(1.0, top_k=3), Warping(0.0)])
def test_beam_sampling_bookkeeping(toy_pair, replacement, warping):
    """Fixed renormalisation (weights = Q / sum Q over the final beams), raw log Q along the
    ancestry, no duplicate entries without replacement, fewer beams when top-k leaves fewer."""
    target, draft = toy_pair
    rt, rd = ModelRunner(target, 6), ModelRunner(draft, 6)
    for seed in range(4):
        rt.prefill(PROMPT)
        rd.prefill(PROMPT)
        ctx = _ctx(rt, rd, PROMPT, warping, seed)
        gamma, width = 3, 4
        beams = beam_sample(ctx, gamma, width, replacement)
        assert beams.gamma == gamma
        cum = beams.cum_logq[-1]
        assert torch.allclose(beams.weights, torch.softmax(cum, 0), atol=1e-12)
        for t in range(gamma):
            n = len(beams.tokens[t])
            assert 1 <= n <= width
            pairs = list(zip(beams.parents[t].tolist(), beams.tokens[t].tolist()))
            if not replacement or warping.greedy:
                assert len(set(pairs)) == n
            if warping.top_k == 3 and not replacement and t == 0:
                assert n == 3  # only three tokens have nonzero warped q
        for slot in range(len(cum)):  # cumulative log Q recomputed from full-sequence scores
            toks = beams.path_tokens(slot)
            probs = scoring_probs(warping, rd.score(PROMPT + toks)[len(PROMPT) - 1 : -1])
            ref = probs[torch.arange(gamma), torch.tensor(toks)].log().cumsum(0)
            assert torch.allclose(beams.path_cum_logq(slot), ref, atol=1e-9)
        rt.end(PROMPT + [0])
        rd.end(PROMPT + [0])


# ---------------------------------------------------------------------- engine-level checks
@pytest.mark.parametrize("model_seed", [0, 1, 2])
@pytest.mark.parametrize("tau", [0.3, 0.9])
def test_accepted_prefix_satisfies_threshold_end_to_end(model_seed, tau):
    """Property over random toy models: recomputed from scratch, every step's accepted
    prefix has P > tau * Q (P, Q = warped target / draft likelihoods)."""
    target, draft = toy(10 + model_seed), toy(20 + model_seed)
    warping = Warping(1.0, top_k=4)
    eng = Engine(target, draft, MTAD(gamma=3, width=3, tau=tau), warping)
    rt, rd = ModelRunner(target, 6), ModelRunner(draft, 6)
    for seed in range(3):
        res = eng.generate(PROMPT, 12, seed=seed)
        ctx = list(PROMPT)
        for s in res.steps:
            out = res.output_ids[len(ctx) - len(PROMPT) :][: s.emitted]
            a = s.accepted
            if a:
                seq = ctx + out[:a]
                rows = slice(len(ctx) - 1, len(ctx) - 1 + a)
                p = warping(rt.score(seq)[rows])[torch.arange(a), torch.tensor(out[:a])]
                q = warping(rd.score(seq)[rows])[torch.arange(a), torch.tensor(out[:a])]
                assert p.log().sum() - q.log().sum() > math.log(tau) - 1e-9
            ctx += out


def test_deterministic_given_seed(toy_pair):
    target, draft = toy_pair
    eng = Engine(target, draft, MTAD(gamma=3, width=4, tau=0.5), Warping(1.0))
    a, b = eng.generate(PROMPT, 15, seed=7), eng.generate(PROMPT, 15, seed=7)
    assert a.output_ids == b.output_ids
    assert [s.accepted for s in a.steps] == [s.accepted for s in b.steps]


@pytest.mark.parametrize("tau", [0.3, 0.9, 0.999])
@pytest.mark.parametrize("warping", [Warping(1.0), Warping(0.8, top_k=4, top_p=0.9)])
def test_same_model_width_one_accepts_everything(toy_pair, tau, warping):
    """q = p (the draft is the target model), W = 1, tau < 1: every draft token is accepted.
    (At tau = 1 exactly, R_d = 0 is not > log 1: the strict inequality of the definition.)"""
    target, _ = toy_pair
    eng = Engine(target, target, MTAD(gamma=4, width=1, tau=tau), warping)
    for seed in range(3):
        res = eng.generate(PROMPT, 20, seed=seed)
        assert all(s.accepted == s.drafted for s in res.steps)
        assert res.block_efficiency == pytest.approx(5.0)


def test_accepted_length_does_not_increase_with_tau(toy_pair):
    """Same seed => same beams in the first step, so its accepted length is pathwise
    non-increasing in tau; so is the mean over whole seeded generations."""
    target, draft = toy_pair
    taus = [0.05, 0.3, 1.0, 3.0, math.inf]
    first, mean = [], []
    for tau in taus:
        eng = Engine(target, draft, MTAD(gamma=4, width=4, tau=tau), Warping(1.0))
        runs = [eng.generate(PROMPT, 12, seed=s) for s in range(30)]
        first.append([r.steps[0].accepted for r in runs])
        mean.append(sum(r.accepted for r in runs) / sum(r.num_steps for r in runs))
    for lo, hi in zip(first, first[1:]):
        assert all(x >= y for x, y in zip(lo, hi))
    assert all(x >= y for x, y in zip(mean, mean[1:])), mean
    assert mean[-1] == 0 and mean[0] > 1


def test_temperature_zero_equals_greedy(toy_pair):
    target, draft = toy_pair
    ref = Engine(target, None, Greedy(), Warping(0)).generate(PROMPT, 20).output_ids
    for tau in (0.3, 2.0):
        out = Engine(target, draft, MTAD(gamma=3, width=3, tau=tau), Warping(0)).generate(
            PROMPT, 20
        )
        assert out.output_ids == ref


@pytest.fixture(scope="module")
def peaked_pair():
    """Peaked float64 toy pair (vocab 6): joint blocks carry enough mass for small-n chi-square."""
    return toy(3, scale=10.0), toy(11, scale=10.0)


def _tau_chi_square(pair, n, tau=math.inf):
    target, draft = pair
    warping = Warping(1.0)
    eng = Engine(target, draft, MTAD(gamma=2, width=2, tau=tau), warping)
    counts = sample_sequences(eng, PROMPT, 3, n, seed0=1000)
    return chi_square_gof(counts, exact_joint(target, PROMPT, 3, warping))


def test_tau_infinity_is_target_sampling(peaked_pair):
    """tau = inf accepts nothing: whole length-3 sequences follow the warped target."""
    stat, pval, dof = _tau_chi_square(peaked_pair, 600)
    assert dof > 10 and pval > 1e-4, (stat, pval, dof)


def test_chi_square_has_power_against_finite_tau(peaked_pair):
    """Control: the same test rejects MTAD with tau = 0.5 (lossy by design)."""
    stat, pval, dof = _tau_chi_square(peaked_pair, 400, tau=0.5)
    assert pval < 1e-4, (stat, pval, dof)


@pytest.mark.slow
@pytest.mark.parametrize("pair_name", ["toy_pair", "peaked_pair"])
def test_tau_infinity_is_target_sampling_large(request, pair_name):
    stat, pval, dof = _tau_chi_square(request.getfixturevalue(pair_name), 6000)
    assert pval > 1e-4, (stat, pval, dof)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"gamma": 0}, "gamma"),
        ({"width": 0}, "width"),
        ({"tau": 0}, "tau"),
        ({"tau": -1.0}, "tau"),
        ({"tau": "big"}, "tau"),
        ({"tau": float("nan")}, "tau"),
        ({"replacement": "yes"}, "replacement"),
        ({"gamma": 2.5}, "gamma"),
    ],
)
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        MTAD(**kwargs)


def test_tau_infinity_is_allowed():
    assert MTAD(tau=math.inf).tau == math.inf


def test_approx_error_study_smoke(tmp_path):
    """The approximation-error study runs end to end on a tiny grid; its table-served decoders
    reproduce the real engine's blocks, and tree-MTAD with W = 1 reproduces chain MTAD."""
    import csv
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "experiments" / "approx_error.py"
    args = [
        "samples=40",
        "workers=1",
        "fidelity_runs=5",
        "widths=[1,2]",
        "taus=[0.5,.inf]",
        f"output_dir={tmp_path}",
    ]
    subprocess.run(
        [sys.executable, str(script), *args], check=True, capture_output=True, timeout=300
    )
    rows = list(csv.DictReader(open(tmp_path / "approx_error.csv")))
    assert (
        len(rows) == 8
        and (tmp_path / "approx_error.md").exists()
        and (tmp_path / "approx_error.png").exists()
    )
    assert all(r["fidelity_mismatches"] == "0" and r["fidelity_runs"] == "5" for r in rows)
    w1 = {(r["decoder"], r["tau"]): r["tv"] for r in rows if r["width"] == "1"}
    assert (
        w1[("mtad", "0.5")] == w1[("tree_mtad", "0.5")]
        and w1[("mtad", "inf")] == w1[("tree_mtad", "inf")]
    )


# ------------------------------------------------- finite tau against an exact reference
# W = 1: beam sampling is plain ancestral sampling from q, acceptance is deterministic given
# the draft (a = max{d : R_d > log tau}) and y ~ p(. | x_1..x_a). gamma = 2 keeps the
# enumeration of the first block's distribution to V^2 drafts.
EXACT_TAU, EXACT_WARPING, EXACT_SAMPLES = 0.3, Warping(1.0), 1000


def exact_first_block(target, draft, prompt, tau, warping, rule="mtad"):
    """Exact distribution of MTAD's first emitted block (W = 1, gamma = 2).

    ``rule``: ``mtad`` (the definition), ``first_failure`` (stop at the first d with
    R_d <= log tau) or ``residual`` (after a rejection y ~ norm(max(0, p - q))).
    """

    @torch.no_grad()
    def dist(model, seq):
        return warping(model(input_ids=torch.tensor([list(seq)])).logits[0, -1].double())

    def log(x):
        return math.log(x) if x > 0 else -math.inf

    out: dict[tuple, float] = {}
    q1 = dist(draft, prompt)
    for x1 in torch.nonzero(q1).flatten().tolist():
        q2 = dist(draft, prompt + [x1])
        for x2 in torch.nonzero(q2).flatten().tolist():
            p = [dist(target, prompt), dist(target, prompt + [x1]), dist(target, prompt + [x1, x2])]
            r1 = log(float(p[0][x1])) - log(float(q1[x1]))
            r2 = r1 + log(float(p[1][x2])) - log(float(q2[x2]))
            passes = [r1 > math.log(tau), r2 > math.log(tau)]
            if rule == "first_failure":
                a = passes.index(False) if False in passes else 2
            else:
                a = max((d + 1 for d, ok in enumerate(passes) if ok), default=0)
            y_dist = residual(p[a], [q1, q2][a]) if rule == "residual" and a < 2 else p[a]
            for y in torch.nonzero(y_dist).flatten().tolist():
                block = tuple([x1, x2][:a] + [y])
                out[block] = out.get(block, 0.0) + float(q1[x1] * q2[x2] * y_dist[y])
    return out


def first_failure_accept_length(log_ratio: torch.Tensor, tau: float):
    """Wrong on purpose: stop at the first prefix that fails."""
    passes = [bool(r > math.log(tau)) for r in log_ratio.tolist()]
    return (passes.index(False) if False in passes else len(passes)), passes


class ResidualMTAD(MTAD):
    """Wrong on purpose: after a rejection draw y from norm(max(0, p - q)) instead of p."""

    def step(self, ctx: StepContext) -> StepOutput:
        beams = beam_sample(ctx, self.gamma, self.width, self.replacement)
        draft = beams.path_tokens(beams.best())
        p = score(ctx, TokenTree.chain(draft)).p  # [g+1, V]
        log_p = p[torch.arange(self.gamma), torch.tensor(draft)].log()
        r = cumulative_log_ratio(log_p, beams.path_cum_logq(beams.best()).to(log_p.dtype))
        a, _ = accept_length(r, self.tau)
        n0 = len(ctx.committed) - 1
        q = ctx.warping(ctx.draft.score(ctx.committed + draft)[n0 : n0 + self.gamma].double())
        y_dist = residual(p[a], q[a]) if a < self.gamma else p[a]
        return StepOutput(tokens=draft[:a] + [sample(y_dist, ctx.generator)], accepted=a)


@pytest.fixture(scope="module")
def exact_pair():
    """Peaked pair on which both wrong rules move the first block's distribution."""
    return toy(10, scale=10.0), toy(20, scale=10.0)


@pytest.fixture(scope="module")
def exact_block(exact_pair):
    target, draft = exact_pair
    return exact_first_block(target, draft, PROMPT, EXACT_TAU, EXACT_WARPING)


def _first_blocks(pair, decoder, n):
    target, draft = pair
    rt, rd = ModelRunner(target, 6), ModelRunner(draft, 6)
    counts: Counter = Counter()
    for seed in range(n):
        rt.prefill(PROMPT)
        rd.prefill(PROMPT)
        counts[tuple(decoder.step(_ctx(rt, rd, PROMPT, EXACT_WARPING, seed)).tokens)] += 1
    return counts


def test_exact_first_block_reference_is_a_distribution(exact_pair, exact_block):
    assert sum(exact_block.values()) == pytest.approx(1.0, abs=1e-12)
    lengths = {len(k) for k in exact_block}
    assert lengths == {1, 2, 3}  # rejections, partial and full acceptance all occur
    # W = 1 and q = p with tau < 1: every draft is accepted, y is the bonus from p
    target, _ = exact_pair
    same = exact_first_block(target, target, PROMPT, 0.9, EXACT_WARPING)
    assert {len(k) for k in same} == {3}
    assert same == pytest.approx(exact_joint(target, PROMPT, 3, EXACT_WARPING))


def test_finite_tau_matches_the_exact_first_block(exact_pair, exact_block):
    counts = _first_blocks(exact_pair, MTAD(gamma=2, width=1, tau=EXACT_TAU), EXACT_SAMPLES)
    stat, pval, dof = chi_square_gof(counts, exact_block)
    assert dof >= 20 and pval > 1e-4, (stat, pval, dof)


def test_exact_first_block_rejects_a_residual_correction(exact_pair, exact_block):
    counts = _first_blocks(exact_pair, ResidualMTAD(gamma=2, width=1, tau=EXACT_TAU), EXACT_SAMPLES)
    stat, pval, dof = chi_square_gof(counts, exact_block)
    assert pval < 1e-4, (stat, pval, dof)


def test_exact_first_block_rejects_first_failure_acceptance(exact_pair, exact_block, monkeypatch):
    monkeypatch.setattr("mtad.verify.threshold.accept_length", first_failure_accept_length)
    counts = _first_blocks(exact_pair, MTAD(gamma=2, width=1, tau=EXACT_TAU), EXACT_SAMPLES)
    stat, pval, dof = chi_square_gof(counts, exact_block)
    assert pval < 1e-4, (stat, pval, dof)

"""SpD: greedy equality with autoregressive decoding, and losslessness by chi-square."""

from collections import Counter

import pytest
import torch

from mtad.core.decoder import StepContext, StepOutput, sample
from mtad.core.engine import Engine
from mtad.core.tree import TokenTree
from mtad.core.warping import Warping
from mtad.decoders.autoregressive import Greedy, Multinomial
from mtad.decoders.spd import SpD
from mtad.models.tiny import tiny_causal_lm
from mtad.propose.chain import draft_chain
from mtad.testing import (
    OutsideSupport,
    chi_square_gof,
    exact_joint,
    prefix_marginal,
    sample_sequences,
)
from mtad.verify.chain import verify_chain
from mtad.verify.score import score

PROMPT = [5, 6, 7, 8, 9]


def _target():
    return tiny_causal_lm("qwen2", dtype=torch.float64, seed=0, logit_scale=5.0)


def _negated(model):
    """Same model with its output head negated: its argmax is the target's argmin."""
    m = tiny_causal_lm("qwen2", dtype=torch.float64, seed=0, logit_scale=5.0)
    m.load_state_dict(model.state_dict())
    with torch.no_grad():
        m.get_output_embeddings().weight.neg_()
    return m


def _perturbed(model, scale):
    m = tiny_causal_lm("qwen2", dtype=torch.float64, seed=0, logit_scale=5.0)
    m.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        w = m.get_output_embeddings().weight
        w.add_(scale * w.std() * torch.randn(w.shape, generator=g, dtype=w.dtype))
    return m


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("draft_kind", ["same", "reject_all", "partial"])
def test_greedy_spd_equals_greedy(gamma, draft_kind):
    target = _target()
    draft = {
        "same": lambda: target,
        "reject_all": lambda: _negated(target),
        "partial": lambda: _perturbed(target, 1.5),
    }[draft_kind]()
    ref = Engine(target, None, Greedy(), Warping(0)).generate(PROMPT, 40)
    res = Engine(target, draft, SpD(gamma), Warping(0)).generate(PROMPT, 40)
    assert res.output_ids == ref.output_ids
    acc = [s.accepted for s in res.steps]
    drafted = [s.drafted for s in res.steps]
    if draft_kind == "same":
        assert acc == drafted  # everything accepted
        assert res.block_efficiency > gamma  # only the truncated last step emits fewer
    elif draft_kind == "reject_all":
        assert sum(acc) == 0 and res.block_efficiency == 1.0
    else:
        assert 0 < sum(acc) < sum(drafted)


def test_chi_square_names_samples_outside_the_support():
    probs = {(0,): 0.5, (1,): 0.5}
    counts = Counter({(0,): 40, (1,): 55, (2,): 5})
    with pytest.raises(OutsideSupport, match=r"outside the target's support: 5 of 100 .*\(2,\): 5"):
        chi_square_gof(counts, probs)
    stat, pval, dof = chi_square_gof(counts, probs, allow_outside=True)
    assert (stat, pval, dof) == (float("inf"), 0.0, 1)
    assert chi_square_gof(Counter({(0,): 50, (1,): 50}), probs) == (0.0, 1.0, 1)


class LossySpD(SpD):
    """Deliberately lossy: the correction is drawn from p instead of the residual norm(max(0, p - q))."""

    def step(self, ctx: StepContext) -> StepOutput:
        tokens, q = draft_chain(ctx, self.gamma)
        p = score(ctx, TokenTree.chain(tokens)).p
        n, _ = verify_chain(tokens, p, q, ctx.generator)
        y = sample(p[n], ctx.generator)
        return StepOutput(
            tokens=tokens[:n] + [y], drafted=self.gamma, accepted=n, tree_size=self.gamma
        )


WARPINGS = [Warping(1.0), Warping(0.8, top_k=4, top_p=0.9)]
N_SAMPLES = 2000
ALPHA = 1e-4


# T0.8-k4-p0.9 is also test_lossless.py::test_lossless_fast[spd] (same warping, 1500 samples):
# in the slow suite only, to keep the default suite's time
@pytest.mark.parametrize(
    "warping",
    [pytest.param(w, marks=pytest.mark.slow) for w in WARPINGS],  # the default suite's: test_lossless.py's
    ids=["T1", "T0.8-k4-p0.9"],
)
def test_spd_lossless_chi_square(toy_pair, warping):
    target, draft = toy_pair
    prompt = [2, 3]
    joint = exact_joint(target, prompt, 3, warping)
    counts = sample_sequences(Engine(target, draft, SpD(2), warping), prompt, 3, N_SAMPLES)
    _, pval, dof = chi_square_gof(counts, joint)
    assert dof > 10
    assert pval > ALPHA, f"SpD output differs from the target joint (p={pval:.2e})"
    for k in (1, 2):  # the first block's marginals: the control below is rejected hardest there
        _, pval, _ = chi_square_gof(prefix_marginal(counts, k), prefix_marginal(joint, k))
        assert pval > ALPHA, f"SpD's first {k} tokens differ from the target's (p={pval:.2e})"


def test_multinomial_matches_target_joint(toy_pair):
    target, _ = toy_pair
    warping = WARPINGS[1]
    joint = exact_joint(target, [2, 3], 3, warping)
    counts = sample_sequences(Engine(target, None, Multinomial(), warping), [2, 3], 3, N_SAMPLES)
    assert chi_square_gof(counts, joint)[1] > ALPHA


@pytest.mark.slow  # the default suite's control: tests/decoders/test_lossless.py::test_lossy_control_rejected_fast
def test_lossy_control_is_rejected(toy_pair):
    """The same samples and tests have power: a lossy SpD variant is rejected, by a wide
    margin on the first block's marginals (the full 3-token joint, 216 sparse cells for 2000
    samples, rejects it only just)."""
    target, draft = toy_pair
    warping = WARPINGS[0]
    joint = exact_joint(target, [2, 3], 3, warping)
    counts = sample_sequences(Engine(target, draft, LossySpD(2), warping), [2, 3], 3, N_SAMPLES)
    assert chi_square_gof(counts, joint)[1] < ALPHA
    pval = chi_square_gof(prefix_marginal(counts, 2), prefix_marginal(joint, 2))[1]
    assert pval < ALPHA**2, f"the 2-token marginal should reject the lossy variant hard (p={pval:.2e})"


def test_seeded_runs_reproducible(toy_pair):
    target, draft = toy_pair
    eng = Engine(target, draft, SpD(3), Warping(1.0))
    a = eng.generate([2, 3], 20, seed=5).output_ids
    b = eng.generate([2, 3], 20, seed=5).output_ids
    c = eng.generate([2, 3], 20, seed=6).output_ids
    assert a == b
    assert a != c  # 20 tokens from 6 symbols: distinct seeds differ (checked for these seeds)


def test_temperature_zero_deterministic(toy_pair):
    target, draft = toy_pair
    outs = {
        tuple(Engine(target, draft, SpD(3), Warping(0)).generate([2, 3], 15, seed=s).output_ids)
        for s in range(4)
    }
    assert len(outs) == 1


def test_eos_and_max_tokens_stop(toy_pair):
    target, draft = toy_pair
    res = Engine(target, draft, SpD(4), Warping(1.0), eos_token_ids=[1]).generate(
        [2, 3], 50, seed=0
    )
    assert len(res.output_ids) <= 50
    if 1 in res.output_ids:
        assert res.output_ids[-1] == 1 and res.output_ids.count(1) == 1 and res.stop_reason == "eos"
    res = Engine(target, draft, SpD(4), Warping(1.0)).generate([2, 3], 7, seed=0)
    assert len(res.output_ids) == 7


def test_bad_gamma_is_a_clear_error():
    with pytest.raises(ValueError, match="gamma"):
        SpD(0)

"""MJGD / MTJD: exact joint decoding by enumeration, and its beam approximation."""

from __future__ import annotations

import math

import pytest
import torch

from mtad.core.engine import Engine
from mtad.core.warping import Warping, warp_probs
from mtad.decoders.autoregressive import Greedy
from mtad.decoders.mjgd import MJGD, MTJD, enumeration_tree, joint_log_probs, unravel
from mtad.models.tiny import tiny_causal_lm
from mtad.testing import chi_square_gof, exact_joint, sample_sequences


def toy(seed: int, vocab: int = 6, scale: float = 4.0):
    return tiny_causal_lm(
        "qwen2",
        vocab_size=vocab,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        seed=seed,
        dtype=torch.float64,
        logit_scale=scale,
    )


def brute_force_argmax(model, prompt, gamma):
    joint = exact_joint(model, prompt, gamma, Warping(1.0))
    return list(max(joint, key=joint.get))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma", [2, 3])
def test_mjgd_equals_brute_force_argmax(seed, gamma):
    target = toy(seed)
    for prompt in ([2, 3], [5, 1, 4]):
        out = Engine(target, None, MJGD(gamma=gamma, method="exact"), Warping(0.7, top_k=3))
        assert out.generate(prompt, gamma).output_ids == brute_force_argmax(target, prompt, gamma)


def test_mjgd_gamma_one_equals_greedy(toy_pair):
    target, _ = toy_pair
    ref = Engine(target, None, Greedy(), Warping(1.0)).generate([2, 3, 4], 15).output_ids
    for method in ("exact", "beam"):
        out = Engine(target, None, MJGD(gamma=1, method=method), Warping(1.0)).generate(
            [2, 3, 4], 15
        )
        assert out.output_ids == ref


def test_one_target_pass_per_exact_step(toy_pair):
    target, _ = toy_pair
    eng = Engine(target, None, MJGD(gamma=3, method="exact"), Warping(1.0))
    res = eng.generate([2, 3, 4], 9)
    assert eng.target.forward_calls == 1 + res.num_steps
    assert all(s.tree_size == 6 + 36 and s.emitted == 3 for s in res.steps)
    assert res.block_efficiency == 3.0


def test_wide_beam_equals_exact():
    """A beam as wide as V**(gamma-1) keeps every prefix: it is exact."""
    target = toy(5)
    for cls in (MJGD, MTJD):
        exact = Engine(target, None, cls(gamma=3, method="exact"), Warping(0.9))
        beam = Engine(target, None, cls(gamma=3, method="beam", beam_width=36), Warping(0.9))
        for seed in range(5):
            assert (
                exact.generate([2, 3], 6, seed=seed).output_ids
                == beam.generate([2, 3], 6, seed=seed).output_ids
            )


def test_narrow_beam_runs_and_is_greedy_for_width_one():
    """beam_width = 1 keeps one prefix per depth; the last depth picks the best of V expansions."""
    target = toy(4)
    res = Engine(target, None, MJGD(gamma=3, method="beam", beam_width=1), Warping(1.0)).generate(
        [2, 3], 3
    )
    greedy = Engine(target, None, Greedy(), Warping(1.0)).generate([2, 3], 3).output_ids
    assert res.output_ids == greedy  # greedy prefix, then argmax of the last conditional


def test_mtjd_temperature_zero_equals_mjgd(toy_pair):
    target, _ = toy_pair
    a = Engine(target, None, MTJD(gamma=3, method="exact"), Warping(0)).generate(
        [2, 3, 4], 9, seed=1
    )
    b = Engine(target, None, MJGD(gamma=3, method="exact"), Warping(1.0)).generate([2, 3, 4], 9)
    assert a.output_ids == b.output_ids


def test_joint_log_probs_layout():
    vocab, gamma = 3, 3
    tree = enumeration_tree(vocab, gamma - 1)
    tokens, parents = tree.tokens[1:], tree.parents[1:]
    assert len(tokens) == 3 + 9 and parents[:3] == [0] * 3 and parents[3:6] == [1, 1, 1]
    gen = torch.Generator().manual_seed(0)
    root = torch.randn(vocab, generator=gen, dtype=torch.float64).log_softmax(-1)
    nodes = torch.randn(len(tokens), vocab, generator=gen, dtype=torch.float64).log_softmax(-1)
    joint = joint_log_probs(root, nodes, gamma)
    assert joint.exp().sum().item() == pytest.approx(1.0)
    x = [2, 0, 1]
    idx = 18 + 0 * 3 + 1
    assert unravel(idx, vocab, gamma) == x
    # node of prefix (2,) is 2; node of prefix (2, 0) is 3 + 2*3 + 0 = 9
    assert joint[idx].item() == pytest.approx((root[2] + nodes[2, 0] + nodes[9, 1]).item())


@pytest.mark.parametrize("warping", [Warping(1.0), Warping(0.6, top_k=8)])
def test_mtjd_samples_the_joint_level_warped_joint(warping):
    """Chi-square against P(x1..xg)^(1/T), top-k over blocks (warping at the joint level)."""
    target = toy(7, vocab=5, scale=2.0)
    prompt, gamma = [2, 3], 2
    joint = exact_joint(target, prompt, gamma, Warping(1.0))
    keys = list(joint)
    probs = warp_probs(
        torch.tensor([math.log(joint[k]) for k in keys]), warping.temperature, warping.top_k
    )
    ref = {k: float(p) for k, p in zip(keys, probs) if p > 0}
    eng = Engine(target, None, MTJD(gamma=gamma, method="exact"), warping)
    counts = sample_sequences(eng, prompt, gamma, 1200, seed0=50)
    stat, pval, dof = chi_square_gof(counts, ref)
    assert dof >= 5 and pval > 1e-4, (stat, pval, dof)
    if warping.top_k:
        assert set(counts) <= set(ref) and len(ref) == 8


def test_exact_too_large_names_the_fields():
    target = toy(0, vocab=6)
    eng = Engine(target, None, MJGD(gamma=3, method="exact", max_enumeration=100), Warping(1.0))
    with pytest.raises(ValueError, match=r"6\*\*3 = 216.*max_enumeration=100.*decoder.method=beam"):
        eng.generate([2, 3], 3)
    auto = Engine(target, None, MJGD(gamma=3, method="auto", max_enumeration=100), Warping(1.0))
    assert len(auto.generate([2, 3], 3).output_ids) == 3


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"gamma": 0}, "gamma"),
        ({"method": "enumerate"}, "method"),
        ({"beam_width": 0}, "beam_width"),
        ({"max_enumeration": 0}, "max_enumeration"),
    ],
)
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        MJGD(**kwargs)

"""BiLD (greedy and sampling) and Medusa-style typical acceptance."""

from __future__ import annotations

import math

import pytest
import torch

from mtad.decoders.autoregressive import Greedy
from mtad.decoders.bild import BiLD, rollback_position
from mtad.decoders.typical import Typical, entropy, typical_accept_length
from mtad.engine import Engine
from mtad.warping import Warping

PROMPT = [2, 3, 4]
INF = math.inf


def _greedy(model, n=24, warping=None):
    return Engine(model, None, Greedy(), warping or Warping(1.0)).generate(PROMPT, n).output_ids


# ---------------------------------------------------------------------------- BiLD
@pytest.mark.parametrize("max_run", [1, 3, 10])
@pytest.mark.parametrize("warping", [Warping(1.0), Warping(0.5, top_k=3)])
def test_bild_never_falling_back_equals_draft_greedy(toy_pair, max_run, warping):
    target, draft = toy_pair
    bild = BiLD(mode="greedy", alpha_fb=0.0, alpha_rb=INF, max_run=max_run)
    res = Engine(target, draft, bild, warping).generate(PROMPT, 24)
    assert res.output_ids == _greedy(draft)
    assert all(s.accepted == s.emitted for s in res.steps)  # no target token was emitted


@pytest.mark.parametrize("alpha_fb,alpha_rb", [(1.1, 5.0), (0.0, 0.0)])
def test_bild_always_falling_back_or_rolling_back_equals_target_greedy(
    toy_pair, alpha_fb, alpha_rb
):
    """alpha_fb > 1: the draft never proposes; alpha_rb = 0: its first token is always rolled back."""
    target, draft = toy_pair
    bild = BiLD(mode="greedy", alpha_fb=alpha_fb, alpha_rb=alpha_rb, max_run=4)
    res = Engine(target, draft, bild, Warping(1.0)).generate(PROMPT, 24)
    assert res.output_ids == _greedy(target)
    assert all(s.accepted == 0 and s.emitted == 1 for s in res.steps)


def test_bild_default_thresholds_mix_draft_and_target(toy_pair):
    target, draft = toy_pair
    res = Engine(
        target, draft, BiLD(mode="greedy", alpha_fb=0.3, alpha_rb=2.0), Warping(1.0)
    ).generate(PROMPT, 30)
    assert len(res.output_ids) == 30
    assert any(s.drafted > 0 for s in res.steps)


def test_rollback_position_hand_built():
    p = torch.tensor([[0.9, 0.1, 0.0], [0.5, 0.3, 0.2], [0.0, 0.0, 1.0]], dtype=torch.float64)
    assert rollback_position([0, 1], p, alpha_rb=1.5) is None  # -log 0.9, -log 0.3 = 1.20
    assert rollback_position([0, 1], p, alpha_rb=1.0) == 1
    assert rollback_position([2, 0], p, alpha_rb=100.0) == 0  # p = 0: -log p = inf


def test_bild_sampling_runs_and_is_seeded(toy_pair):
    target, draft = toy_pair
    bild = BiLD(mode="sampling", alpha_fb=0.3, alpha_rb=2.0)
    eng = Engine(target, draft, bild, Warping(1.0, top_k=3))
    a, b = eng.generate(PROMPT, 20, seed=4), eng.generate(PROMPT, 20, seed=4)
    assert a.output_ids == b.output_ids and len(a.output_ids) == 20
    # sampling mode at temperature 0 is greedy on both models: with no fallback, draft greedy
    never = Engine(target, draft, BiLD(mode="sampling", alpha_fb=0.0, alpha_rb=INF), Warping(0))
    assert never.generate(PROMPT, 20).output_ids == _greedy(draft, 20)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"mode": "beam"}, "mode"),
        ({"alpha_fb": -0.1}, "alpha_fb"),
        ({"alpha_fb": INF}, "alpha_fb"),
        ({"alpha_rb": -1}, "alpha_rb"),
        ({"max_run": 0}, "max_run"),
        ({"alpha_rb": "x"}, "alpha_rb"),
    ],
)
def test_bild_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BiLD(**kwargs)


# ------------------------------------------------------------------------- typical
def test_typical_hand_built():
    uniform4 = torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0], dtype=torch.float64)
    peaked = torch.tensor([0.95, 0.05, 0.0, 0.0, 0.0], dtype=torch.float64)
    assert entropy(uniform4).item() == pytest.approx(math.log(4))
    # uniform over 4: threshold min(0.09, 0.3/4 = 0.075) = 0.075 < 0.25 -> accepted; p = 0 -> rejected
    assert typical_accept_length([3], uniform4[None], eps=0.09, delta=0.3) == 1
    assert typical_accept_length([4], uniform4[None], eps=0.09, delta=0.3) == 0
    # peaked: threshold min(0.09, 0.3 * exp(-H)) = 0.09: 0.95 passes, 0.05 fails
    p = torch.stack([peaked, peaked, uniform4, peaked])
    assert typical_accept_length([0, 0, 1, 0], p, eps=0.09, delta=0.3) == 4
    assert typical_accept_length([0, 1, 1, 0], p, eps=0.09, delta=0.3) == 1  # longest run from x1
    # a high-entropy row lowers the threshold below eps: delta * exp(-H) decides
    flat = torch.full((5,), 0.2, dtype=torch.float64)
    thr = 0.3 * math.exp(-math.log(5))  # 0.06
    assert thr < 0.09 and typical_accept_length([2], flat[None], eps=0.09, delta=0.3) == 1
    assert typical_accept_length([2], flat[None], eps=0.25, delta=0.9) == 1  # min(0.25, 0.18) < 0.2
    assert typical_accept_length([2], flat[None], eps=0.25, delta=1.5) == 0  # min(0.25, 0.30) > 0.2


def test_typical_temperature_zero_equals_greedy(toy_pair):
    target, draft = toy_pair
    res = Engine(target, draft, Typical(gamma=3), Warping(0)).generate(PROMPT, 20)
    assert res.output_ids == _greedy(target, 20, Warping(0))


def test_typical_tiny_threshold_accepts_every_draft_token(toy_pair):
    target, draft = toy_pair
    res = Engine(target, draft, Typical(gamma=3, eps=1e-12), Warping(1.0)).generate(
        PROMPT, 20, seed=1
    )
    assert all(s.accepted == s.drafted for s in res.steps)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"gamma": 0}, "gamma"),
        ({"eps": 0.0}, "eps"),
        ({"eps": 1.5}, "eps"),
        ({"delta": 0}, "delta"),
        ({"delta": INF}, "delta"),
    ],
)
def test_typical_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Typical(**kwargs)

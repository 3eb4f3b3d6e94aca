"""The chain acceptance rules on hand-built distributions (mtad.verify): speculative sampling
of a chain, MTAD's joint-likelihood threshold and tree-MTAD's tree acceptance, typical
acceptance, BiLD's rollback position. (The multi-draft rules: test_multidraft_exact.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from mtad.core.protocols import ROOT
from mtad.verify.chain import verify_chain
from mtad.verify.rollback import rollback_position
from mtad.verify.threshold import accept_length, cumulative_log_ratio, tree_accept
from mtad.verify.typical import entropy, typical_accept_length


def test_verify_chain_hand_built():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    q = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    # token 1 certainly accepted (p = q); token 2 has p = 0 -> rejected; residual = p[1]
    for _ in range(20):
        n, y = verify_chain([1, 2], p, q, g)
        assert n == 1 and y in (0, 1)
    # p1(0) = 0.5 < q = 1: accepted iff the second uniform U2 <= 0.5, known from the seed
    # (one float64 uniform per checked token, drawn before the correction/bonus sample)
    q_all = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    outcomes = set()
    for seed in range(12):
        u = torch.rand(2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        n, y = verify_chain([1, 0], p, q_all, torch.Generator().manual_seed(seed))
        expected_n = 2 if u[1] <= 0.5 else 1
        # rejected: residual norm(max(0, p1 - q1)) = one-hot on 1; accepted: bonus from p2 = token 2
        assert (n, y) == (expected_n, 2 if expected_n == 2 else 1), (seed, u.tolist())
        outcomes.add(n)
    assert outcomes == {1, 2}


def test_acceptance_hand_built():
    # a failing shorter prefix does not block a longer passing one
    a, passes = accept_length(torch.tensor([-1.0, 0.5, -2.0]), tau=1.0)
    assert (a, passes) == (2, [False, True, False])
    assert accept_length(torch.tensor([-1.0, -0.1]), tau=1.0)[0] == 0
    assert (
        accept_length(torch.tensor([5.0, 9.0]), tau=math.inf)[0] == 0
    )  # tau = inf accepts nothing
    # P = 0 fails whatever Q is, and never gives NaN (even with Q = 0)
    r = cumulative_log_ratio(
        torch.tensor([0.0, -math.inf, 0.0]), torch.tensor([-1.0, -math.inf, -math.inf])
    )
    assert r[0] == 1.0 and torch.isneginf(r[1:]).all()


@pytest.mark.parametrize("seed", range(5))
def test_acceptance_property_random_pq(seed):
    """Deterministic; the accepted prefix satisfies P >= tau * Q; no longer prefix passes."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(200):
        g = int(torch.randint(1, 7, (), generator=gen))
        vocab = 5
        p = torch.rand(g, vocab, generator=gen, dtype=torch.float64) ** 3
        p[torch.rand(g, vocab, generator=gen) < 0.2] = 0  # some zero-probability target tokens
        p[:, 0] += 1e-3
        p /= p.sum(-1, keepdim=True)
        q = torch.rand(g, vocab, generator=gen, dtype=torch.float64) + 1e-3
        q /= q.sum(-1, keepdim=True)
        x = torch.randint(vocab, (g,), generator=gen)
        tau = float(
            torch.tensor([0.05, 0.3, 0.5, 0.9, 1.0, 2.0])[torch.randint(6, (), generator=gen)]
        )
        r = cumulative_log_ratio(
            p[torch.arange(g), x].log(), torch.cumsum(q[torch.arange(g), x].log(), 0)
        )
        a, passes = accept_length(r, tau)
        assert (a, passes) == accept_length(r.clone(), tau)  # deterministic, no randomness
        big_p = torch.cumprod(p[torch.arange(g), x], 0)
        big_q = torch.cumprod(q[torch.arange(g), x], 0)
        if a:
            assert big_p[a - 1] >= tau * big_q[a - 1] * (1 - 1e-12)
        for d in range(a, g):  # every longer prefix fails
            assert not big_p[d] > tau * big_q[d] * (1 + 1e-9)
        assert not torch.isnan(r).any()


def test_tree_accept_rules():
    depth = [0, 1, 1, 2, 2, 3]  # rows; row 0 is the root (log P = 0, never a candidate)
    ref = torch.tensor([-1.0, -2.0, -3.0])
    # row 5 (depth 3) passes although no depth-2 node does: deepest passing depth wins
    logp = torch.tensor([0.0, -0.5, -0.2, -5.0, -6.0, -2.0])
    assert tree_accept(logp, depth, ref, tau=1.0) == (3, 5, [True, False, True])
    # among passing nodes at the deepest depth, the largest P is chosen
    logp = torch.tensor([0.0, -0.5, -0.2, -1.5, -1.0, -math.inf])
    assert tree_accept(logp, depth, ref, tau=1.0) == (2, 4, [True, True, False])
    # nothing passes -> root; P = 0 never passes
    none = torch.tensor([0.0] + [-math.inf] * 5)
    assert tree_accept(none, depth, ref, tau=1e-9) == (0, ROOT, [False] * 3)
    assert tree_accept(logp, depth, ref, tau=math.inf)[0] == 0


def test_rollback_position_hand_built():
    p = torch.tensor([[0.9, 0.1, 0.0], [0.5, 0.3, 0.2], [0.0, 0.0, 1.0]], dtype=torch.float64)
    assert rollback_position([0, 1], p, alpha_rb=1.5) is None  # -log 0.9, -log 0.3 = 1.20
    assert rollback_position([0, 1], p, alpha_rb=1.0) == 1
    assert rollback_position([2, 0], p, alpha_rb=100.0) == 0  # p = 0: -log p = inf


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

"""Exactness of the lossless multi-draft verifiers in ``mtad.verify.multidraft``.

Three ways, as in the project's testing notes:

* exact enumeration of each single-position rule over every candidate tuple
  (weighted by its draft probability) must give back the target distribution P
  to ~1e-12 in float64, with and without top-k/top-p warping; known-lossy rules
  must fail the same check (the check has power);
* temperature 0: every rule, and every tree walker, reproduces greedy exactly;
* Monte Carlo: the tree walkers inside a minimal decoding loop on a tabular toy
  model reproduce the exact two-token joint (chi-square, fixed seeds, alpha 1e-4).
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from scipy import stats

from mtad.core.warping import warp_probs
from mtad.propose.tree import draw_without_replacement
from mtad.verify.multidraft import (
    MultiDraft,
    PositionOutcome,
    mcns_position,
    mcss_position,
    specinfer_position,
    spectr_position,
    spectr_rho,
)

F64 = torch.float64
V = 6
TOL = 1e-12
ALPHA = 1e-4


def _mcns(P, Q, cands):
    return mcns_position(P, cands)


# name -> (position rule, candidates drawn without replacement?)
RULES = {
    "specinfer": (specinfer_position, False),
    "mcss": (mcss_position, True),
    "spectr": (spectr_position, False),
    "mcns": (_mcns, False),
}

# name -> (target warping, draft warping) as (temperature, top_k, top_p)
WARPS = {
    "plain": ((1.0, 0, 1.0), (1.0, 0, 1.0)),
    "topk_topp": ((0.8, 0, 0.7), (1.3, 3, 1.0)),
    "sparse_draft": ((1.0, 4, 1.0), (1.0, 2, 1.0)),  # nnz(q) = 2 < k for k = 4
    "one_hot_draft": ((1.0, 0, 0.9), (1.0, 1, 1.0)),
}


def random_pq(seed: int, warp: str, vocab: int = V) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    (tp, kp, pp), (tq, kq, pq) = WARPS[warp]
    P = warp_probs(2 * torch.randn(vocab, generator=g, dtype=F64), tp, kp, pp)
    Q = warp_probs(2 * torch.randn(vocab, generator=g, dtype=F64), tq, kq, pq)
    return P, Q


# --------------------------------------------------------------------------- enumeration harness


def outcome_distribution(rule, P, Q, cands) -> torch.Tensor:  # [V]
    """Distribution of the emitted token (accepted candidate or correction) for fixed candidates."""
    accept, residual, reject = rule(P, Q, cands)
    assert accept.shape == (len(cands),)
    assert (accept >= 0).all() and reject >= 0
    assert abs(float(accept.sum() + reject) - 1) < TOL
    assert abs(float(residual.sum()) - 1) < TOL and (residual >= 0).all()
    out = reject * residual
    for a, c in zip(accept, cands):
        out[c] += a
    return out


def draft_tuples(Q, k: int, without_replacement: bool):
    """Every candidate tuple the drafter can produce, with its probability."""
    support = [int(t) for t in torch.nonzero(Q).flatten()]
    if not without_replacement:
        for tup in itertools.product(support, repeat=k):
            yield tup, float(torch.prod(Q[list(tup)]))
        return
    for tup in itertools.permutations(support, min(k, len(support))):
        prob, removed = 1.0, 0.0
        for c in tup:
            prob *= float(Q[c]) / (1 - removed)
            removed += float(Q[c])
        yield tup, prob


def exact_output(rule, P, Q, k: int, without_replacement: bool) -> torch.Tensor:  # [V]
    total = torch.zeros_like(P)
    mass = 0.0
    for tup, prob in draft_tuples(Q, k, without_replacement):
        total += prob * outcome_distribution(rule, P, Q, tup)
        mass += prob
    assert abs(mass - 1) < TOL
    return total


# --------------------------------------------------------------------------- exact: lossless


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("warp", list(WARPS))
@pytest.mark.parametrize("name", list(RULES))
def test_position_rule_is_exact(name, warp, k, seed):
    rule, wor = RULES[name]
    P, Q = random_pq(seed, warp)
    out = exact_output(rule, P, Q, k, wor)
    assert (out - P).abs().max() < TOL


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("name", list(RULES))
def test_position_rule_is_exact_edge_cases(name, k):
    rule, wor = RULES[name]
    P, Q = random_pq(3, "plain")
    disjoint_P = torch.tensor([0.7, 0.3, 0, 0, 0, 0], dtype=F64)
    disjoint_Q = torch.tensor([0, 0, 0.2, 0.5, 0.3, 0], dtype=F64)
    for P_, Q_ in [(P, P.clone()), (disjoint_P, disjoint_Q), (P, warp_probs(P.log(), 1.0, 2))]:
        out = exact_output(rule, P_, Q_, k, wor)
        assert (out - P_).abs().max() < TOL


@pytest.mark.parametrize("name", ["specinfer", "mcss", "spectr"])  # MCNS ignores Q
def test_undrawable_candidate_is_never_accepted(name):
    rule, _ = RULES[name]
    P = torch.tensor([0.1, 0.2, 0.3, 0.4, 0, 0], dtype=F64)
    Q = torch.tensor([0.5, 0.5, 0, 0, 0, 0], dtype=F64)
    accept, residual, reject = rule(P, Q, [3, 0, 3])
    assert accept[0] == 0 and accept[2] == 0
    assert abs(float(accept.sum() + reject) - 1) < TOL


@pytest.mark.parametrize("name", list(RULES))
def test_position_rule_keeps_dtype(name):
    rule, _ = RULES[name]
    P, Q = (x.float() for x in random_pq(0, "plain"))
    out = rule(P, Q, [0, 3])
    assert all(t.dtype == torch.float32 for t in out)
    assert abs(float(out.accept_prob.sum() + out.reject_prob) - 1) < 1e-6


def test_mcss_duplicate_candidate_is_skipped():
    P, Q = random_pq(5, "plain")
    once = mcss_position(P, Q, [2, 4])
    twice = mcss_position(P, Q, [2, 2, 4])
    assert twice.accept_prob[1] == 0
    assert (twice.accept_prob[[0, 2]] - once.accept_prob).abs().max() < TOL
    assert (twice.residual - once.residual).abs().max() < TOL


# --------------------------------------------------------------------------- exact: power


def lossy_no_residual(P, Q, cands) -> PositionOutcome:
    """Accept the first X_i with U <= min(1, P/Q), on full rejection emit from P unchanged."""
    out = specinfer_position(P, Q, [])
    accept, reach = P.new_zeros(len(cands)), P.new_ones(())
    for i, c in enumerate(cands):
        a = torch.clamp(P[c] / Q[c], max=1)
        accept[i], reach = reach * a, reach * (1 - a)
    return PositionOutcome(accept, out.residual, reach)


def lossy_best_of_independent(P, Q, cands) -> PositionOutcome:
    """k independent SpD checks against the same P; keep the first pass, else SpD residual."""
    accept, reach = P.new_zeros(len(cands)), P.new_ones(())
    for i, c in enumerate(cands):
        a = torch.clamp(P[c] / Q[c], max=1)
        accept[i], reach = reach * a, reach * (1 - a)
    residual = (P - Q).clamp_min(0)
    return PositionOutcome(accept, residual / residual.sum(), reach)


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("lossy", [lossy_no_residual, lossy_best_of_independent])
def test_known_lossy_rule_fails_exact_check(lossy, k):
    P, Q = random_pq(0, "plain")
    out = exact_output(lossy, P, Q, k, without_replacement=False)
    assert (out - P).abs().max() > 0.02


# --------------------------------------------------------------------------- SpecTr rho


def reference_rho(p, q, k: int) -> float:
    """Plain bisection of 1 - (1 - beta)^k - rho beta over [1, k] (Sun et al., 2023)."""

    def f(rho):
        beta = float(torch.minimum(q, p / rho).sum())
        return 1 - (1 - beta) ** k - rho * beta

    lo, hi = 1.0, float(k)
    if k == 1 or f(lo) <= 0:
        return 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("warp", list(WARPS))
def test_spectr_rho_solves_its_equation(warp, k):
    for seed in range(5):
        p, q = random_pq(seed, warp)
        rho = spectr_rho(p, q, k)
        assert 1 <= rho <= k
        beta = float(torch.minimum(q, p / rho).sum())
        assert abs(1 - (1 - beta) ** k - rho * beta) < 1e-14
        assert abs(rho - reference_rho(p, q, k)) < 1e-6
    assert spectr_rho(p, p, k) == 1.0


# --------------------------------------------------------------------------- temperature 0


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("name", list(RULES))
def test_position_rule_temperature_zero_is_greedy(name, k):
    rule, wor = RULES[name]
    g = torch.Generator().manual_seed(11)
    for _ in range(4):
        lp, lq = torch.randn(2, V, generator=g, dtype=F64)
        for P, Q in [(warp_probs(lp, 0.0), warp_probs(lq, 0.0)), (warp_probs(lp, 0.0),) * 2]:
            expected = torch.zeros(V, dtype=F64)
            expected[lp.argmax()] = 1
            assert torch.equal(exact_output(rule, P, Q, k, wor), expected)


# --------------------------------------------------------------------------- draw without replacement


def test_draw_without_replacement_never_duplicates():
    g = torch.Generator().manual_seed(0)
    for vocab, k, top_k in [(6, 4, 0), (6, 4, 2), (6, 6, 0), (6, 9, 0), (5, 3, 1)]:
        for _ in range(50):
            q = warp_probs(torch.randn(vocab, generator=g, dtype=F64), 1.0, top_k)
            drawn = draw_without_replacement(q, k, g)
            nnz = int((q > 0).sum())
            assert drawn.dtype == torch.long and drawn.numel() == min(k, nnz)
            assert len(set(drawn.tolist())) == drawn.numel()
            assert (q[drawn] > 0).all()
    assert draw_without_replacement(q, 0, g).numel() == 0


def test_draw_without_replacement_distribution():
    """Ordered pairs follow the sequential probabilities the MCSS enumeration assumes."""
    g = torch.Generator().manual_seed(1)
    q = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=F64)
    n = 4000
    counts = Counter(tuple(draw_without_replacement(q, 2, g).tolist()) for _ in range(n))
    cells = list(draft_tuples(q, 2, without_replacement=True))
    observed = [counts[t] for t, _ in cells]
    assert sum(observed) == n
    assert stats.chisquare(observed, [n * pr for _, pr in cells]).pvalue > ALPHA


# --------------------------------------------------------------------------- tree walkers


class ToyLM:
    """Tabular next-token distributions for every prefix of length <= 2 (float64)."""

    def __init__(self, vocab: int, seed: int, temperature=1.0, top_k=0, top_p=1.0):
        g = torch.Generator().manual_seed(seed)
        self.table = {}
        for n in range(3):
            for prefix in itertools.product(range(vocab), repeat=n):
                logits = 1.5 * torch.randn(vocab, generator=g, dtype=F64)
                self.table[prefix] = warp_probs(logits, temperature, top_k, top_p)

    def __call__(self, prefix) -> torch.Tensor:  # [V]
        return self.table[tuple(prefix)]


def iid(q, k, g):
    return torch.multinomial(q, k, replacement=True, generator=g).tolist()


def wor(q, k, g):
    return draw_without_replacement(q, k, g).tolist()


def tree_draft(draft, prefix, branching, g, draw):
    """Token tree: each node at depth d gets branching[d] children drawn by ``draw``."""
    parents, tokens, prefixes = [-1], [-1], [tuple(prefix)]
    frontier = [0]
    for width in branching:
        nxt = []
        for node in frontier:
            for t in draw(draft(prefixes[node]), width, g):
                parents.append(node)
                tokens.append(int(t))
                prefixes.append(prefixes[node] + (int(t),))
                nxt.append(len(tokens) - 1)
        frontier = nxt
    return parents, tokens, prefixes


def chains_draft(draft, prefix, k, depth, g):
    """k i.i.d. chains of ``depth`` tokens, each its own branch under the root."""
    parents, tokens, prefixes = [-1], [-1], [tuple(prefix)]
    for _ in range(k):
        node = 0
        for _ in range(depth):
            t = iid(draft(prefixes[node]), 1, g)[0]
            parents.append(node)
            tokens.append(t)
            prefixes.append(prefixes[node] + (t,))
            node = len(tokens) - 1
    return parents, tokens, prefixes


# name -> (the verifier's walk, drafter(draft, prefix, depth, g))
WALKERS = {
    "specinfer": (MultiDraft("specinfer").walk, lambda d, pre, n, g: tree_draft(d, pre, (2, 2)[:n], g, iid)),
    # 4 > nnz(draft) = 3 candidates requested at the root: fewer are drawn
    "mcss": (MultiDraft("mcss").walk, lambda d, pre, n, g: tree_draft(d, pre, (4, 2)[:n], g, wor)),
    "spectr": (MultiDraft("spectr").walk, lambda d, pre, n, g: chains_draft(d, pre, 3, n, g)),
    "mcns": (MultiDraft("mcns").walk, lambda d, pre, n, g: tree_draft(d, pre, (2, 2)[:n], g, iid)),
}


def two_tokens(verify, drafter, target, draft, g):
    """A minimal decoding loop (draft, verify, commit) until two tokens are emitted."""
    out: list[int] = []
    while len(out) < 2:
        parents, tokens, prefixes = drafter(draft, tuple(out), 2 - len(out), g)
        p = torch.stack([target(pre) for pre in prefixes])
        q = torch.stack([draft(pre) for pre in prefixes])
        path, token = verify(parents, tokens, p, q, g)
        assert all(parents[b] == a for a, b in zip([0] + path, path)), "path must be connected"
        assert 0 <= token < p.shape[1] and p[path[-1] if path else 0, token] > 0
        out += [tokens[n] for n in path] + [token]
    return tuple(out[:2])


@pytest.mark.parametrize("name", list(WALKERS))
def test_tree_walker_matches_two_token_joint(name):
    verify, drafter = WALKERS[name]
    vocab, n = 4, 2000
    target = ToyLM(vocab, seed=1, top_p=0.9)
    draft = ToyLM(vocab, seed=2, top_k=3)
    g = torch.Generator().manual_seed(123)
    counts = Counter(two_tokens(verify, drafter, target, draft, g) for _ in range(n))
    cells = list(itertools.product(range(vocab), repeat=2))
    expected = {c: n * float(target(())[c[0]] * target(c[:1])[c[1]]) for c in cells}
    assert all(counts[c] == 0 for c in cells if expected[c] == 0)
    big = [c for c in cells if expected[c] >= 5]
    small = [c for c in cells if 0 < expected[c] < 5]
    observed = [counts[c] for c in big] + ([sum(counts[c] for c in small)] if small else [])
    exp = [expected[c] for c in big] + ([sum(expected[c] for c in small)] if small else [])
    assert sum(observed) == n
    assert stats.chisquare(observed, exp).pvalue > ALPHA


@pytest.mark.parametrize("name", list(WALKERS))
def test_tree_walker_temperature_zero_is_greedy(name):
    verify, drafter = WALKERS[name]
    target = ToyLM(4, seed=1, temperature=0.0)
    greedy0 = int(target(()).argmax())
    greedy = (greedy0, int(target((greedy0,)).argmax()))
    g = torch.Generator().manual_seed(0)
    for draft_seed in range(6):
        draft = ToyLM(4, seed=draft_seed, temperature=0.0)  # seed 1: draft == target
        for _ in range(3):
            assert two_tokens(verify, drafter, target, draft, g) == greedy
    # draft == target: the whole tree depth is accepted, then a greedy bonus
    parents, tokens, prefixes = drafter(target, (), 2, g)
    p = torch.stack([target(pre) for pre in prefixes])
    path, token = verify(parents, tokens, p, p, g)
    assert len(path) == 2 and [tokens[i] for i in path] == list(greedy)
    assert token == int(target(greedy).argmax())


@pytest.mark.parametrize("name", list(WALKERS))
def test_tree_walker_is_deterministic_given_generator(name):
    verify, drafter = WALKERS[name]
    target, draft = ToyLM(4, seed=1), ToyLM(4, seed=2)
    parents, tokens, prefixes = drafter(draft, (), 2, torch.Generator().manual_seed(0))
    p = torch.stack([target(pre) for pre in prefixes])
    q = torch.stack([draft(pre) for pre in prefixes])
    runs = [
        [verify(parents, tokens, p, q, torch.Generator().manual_seed(s)) for s in range(20)]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_spectr_follows_alive_drafts_across_branches():
    """Two chains share their first token; the second token may come from either chain."""
    parents = [-1, 0, 1, 0, 3]
    tokens = [-1, 0, 1, 0, 2]
    onehot = torch.eye(3, dtype=F64)
    p = torch.stack([onehot[0], onehot[2], onehot[0], onehot[2], onehot[1]])
    half = torch.tensor([0, 0.5, 0.5], dtype=F64)
    q = torch.stack([onehot[0], half, onehot[0], half, onehot[1]])
    path, token = MultiDraft("spectr").walk(parents, tokens, p, q, torch.Generator().manual_seed(0))
    assert path == [3, 4] and token == 1


def test_bad_tree_is_rejected():
    p = torch.full((3, V), 1 / V, dtype=F64)
    g = torch.Generator().manual_seed(0)
    walk = MultiDraft("specinfer").walk
    with pytest.raises(ValueError, match="parents"):
        walk([-1, 0, 2], [-1, 1, 2], p, p, g)
    with pytest.raises(ValueError, match="root"):
        walk([0, 0, 1], [-1, 1, 2], p, p, g)
    with pytest.raises(ValueError, match="rows"):
        walk([-1, 0], [-1, 1], p, p, g)


def test_spectr_rho_is_one_for_equal_distributions_whose_sum_is_an_ulp_off():
    """p = q whose float sum is just below 1: f(1) ~ 1e-16 > 0 must not move the root off 1
    (it did, to 1.009 at k = 8, on machines whose summation order gives that sum)."""
    p = torch.tensor([0.25, 0.25, 0.5 - 2**-53], dtype=torch.float64)  # sums to 1 - 2^-53
    assert float(p.sum()) < 1.0
    for k in (2, 4, 8):
        assert spectr_rho(p, p.clone(), k) == 1.0

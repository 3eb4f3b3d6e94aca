"""The multi-draft rules on a node's small compressed columns as Python lists
(``mtad.verify.multidraft``'s list forms): bit for bit the tensor rules' outcome and residual
in float32 and float64, and the walk draws the same tokens with the generator left in the same
state as the tensor rules' walk."""

from __future__ import annotations

import random

import pytest
import torch

import mtad.core.sampling
import mtad.verify.multidraft as md
from mtad.core.sampling import DENSE_MAX, Rows, Support

pytestmark = pytest.mark.stack  # torch.multinomial's stream; float32 rounding and torch.sum

LISTS = {"specinfer": (md.specinfer_position, md._fast_specinfer), "mcss": (md.mcss_position, md._fast_mcss),
         "spectr": (md.spectr_position, md._fast_spectr), "mcns": (md._mcns_rule, md._fast_mcns)}


def _problem(seed: int):
    """P, Q on C columns: skewed, with zeros, sometimes equal or one-hot (residuals without mass)."""
    rnd, g = random.Random(seed), torch.Generator().manual_seed(seed)
    dtype = (torch.float32, torch.float64)[seed % 2]
    C = rnd.choice([1, 2, 3, 8, 20, 60])

    def dist():
        x = torch.rand(C, generator=g, dtype=torch.float64) ** rnd.choice([1, 4, 12])
        x[torch.rand(C, generator=g) < rnd.random()] = 0
        x[rnd.randrange(C)] += 0.01
        return (x / x.sum()).to(dtype)

    P, Q = dist(), dist()
    if rnd.random() < 0.15:
        Q = P.clone()
    if rnd.random() < 0.1:
        P = torch.zeros(C, dtype=dtype)
        P[rnd.randrange(C)] = 1
    return rnd, P, Q


@pytest.mark.parametrize("name", list(LISTS))
def test_list_rules_are_the_tensor_rules_bit_for_bit(name):
    rule, fast = LISTS[name]
    seen_zero = name == "mcns"  # MCNS keeps mass on the non-candidates
    for seed in range(300):
        rnd, P, Q = _problem(seed)
        k = rnd.randint(1, 5)
        if name == "mcss":  # distinct candidates Q can draw
            cands = [int(c) for c in torch.nonzero(Q > 0).flatten()][:k]
        else:  # repeats and undrawable ones too
            cands = [rnd.randrange(len(P)) for _ in range(k)]
        out = rule(P, Q, cands)
        accept, residual, reject = fast(md._Arith(P.dtype), P.tolist(), Q.tolist(), cands)
        assert torch.equal(out.accept_prob, torch.tensor(accept, dtype=P.dtype)), seed
        assert float(out.reject_prob) == reject, seed
        if reject > 0:  # (with no rejection mass the list forms skip the residual: it is never drawn)
            assert torch.equal(out.residual, torch.tensor(residual, dtype=P.dtype)), seed
        seen_zero |= reject == 0 and residual is None
    assert seen_zero, "no problem had every candidate accepted for sure"


def test_the_one_pass_draw_is_torch_multinomial():
    for seed in range(200):
        _, P, _ = _problem(seed)
        g, ref = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        assert md._multinomial(P, g) == int(torch.multinomial(P, 1, generator=ref))
        assert torch.equal(g.get_state(), ref.get_state())
    with pytest.raises(RuntimeError, match="nan"):
        md._draw_list([0.5, float("nan")], torch.float32, torch.Generator())
    with pytest.raises(RuntimeError, match="invalid multinomial"):
        md._draw_list([0.0, 0.0], torch.float32, torch.Generator())


def _tree(seed: int, vocab: int, dtype, spectr: bool):
    """A random tree over a long vocabulary with sparse host supports as its p and q rows."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.randperm(vocab, generator=g)[:40]

    def row():
        ids = pool[torch.randperm(40, generator=g)[: int(torch.randint(1, 12, (), generator=g))]].sort().values
        vals = torch.rand(len(ids), generator=g, dtype=torch.float64) ** 3 + 1e-3
        return Support(ids, (vals / vals.sum()).to(dtype), vocab)

    parents, tokens, q = [-1], [-1], {0: row()}
    branching = [3, 1, 1] if spectr else [3, 2]
    frontier = [0]
    for k in branching:
        new = []
        for r in frontier:
            for _ in range(1 if spectr and r else k):
                parents.append(r)
                s = q[r]
                tokens.append(int(s.ids[torch.multinomial(s.vals, 1, generator=g)]))
                new.append(len(tokens) - 1)
                q[len(tokens) - 1] = row()
        frontier = new
    p = {r: row() for r in range(len(tokens))}
    return parents, tokens, Rows(len(tokens), p.__getitem__), Rows(len(tokens), q.__getitem__)


@pytest.mark.parametrize("dense_max", [DENSE_MAX, 0])
@pytest.mark.parametrize("name", list(LISTS))
def test_walk_on_lists_draws_as_the_tensor_rules(name, dense_max, monkeypatch):
    monkeypatch.setattr(mtad.core.sampling, "DENSE_MAX", dense_max)
    walk, lists_max = md.MultiDraft(name).walk, md._FAST_MAX
    seen = set()
    for seed in range(60):
        tree = _tree(seed, DENSE_MAX + 1000, (torch.float32, torch.float64)[seed % 2], name == "spectr")
        g = torch.Generator().manual_seed(seed)
        got = walk(*tree, g, compress=True)
        monkeypatch.setattr(md, "_FAST_MAX", -1)  # the tensor rules
        ref = torch.Generator().manual_seed(seed)
        want = walk(*tree, ref, compress=True)
        monkeypatch.setattr(md, "_FAST_MAX", lists_max)
        assert got == want and torch.equal(g.get_state(), ref.get_state()), seed
        seen.add(len(got[0]))
    assert len(seen) >= 2, f"every walk accepted {seen} nodes: the test tree does not exercise both ends"


@pytest.mark.parametrize("share", [0.001, 0.3, 0.9])
def test_compressed_columns_of_long_and_short_supports(share):
    """``compress_support``'s columns (by a sort, or by a mark over the vocabulary for long
    supports) are the sorted union, with P, Q and the candidates placed on them."""
    V = DENSE_MAX + 3000
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        supports = []
        for _ in range(2):
            ids = torch.randperm(V, generator=g)[: max(1, int(share * V))].sort().values
            supports.append(Support(ids, torch.rand(len(ids), generator=g) + 0.1, V))
        cands = torch.randint(0, V, (4,), generator=g).tolist()
        c = md.compress_support(*supports, cands)
        want = sorted(set(supports[0].ids.tolist()) | set(supports[1].ids.tolist()) | set(cands))
        assert c.cols.tolist() == want
        assert [want[j] for j in c.cands] == cands
        for S, vec in zip(supports, (c.P, c.Q)):
            assert torch.equal(vec, S.dense()[c.cols])


@pytest.mark.parametrize("dense_max", [DENSE_MAX, 0])
def test_a_list_draw_is_torch_multinomial_on_its_support(dense_max, monkeypatch):
    monkeypatch.setattr(mtad.core.sampling, "DENSE_MAX", dense_max)
    for seed in range(200):
        _, P, _ = _problem(seed)
        g, ref = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        assert md._draw_list(P.tolist(), P.dtype, g) == mtad.core.sampling.sample(P, ref)
        assert torch.equal(g.get_state(), ref.get_state())

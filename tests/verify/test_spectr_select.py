"""SpecTr's rho by selection (``spectr_rho_select``, the rule of SpecTr's inverse-CDF settings):
the root ``spectr_rho`` finds by sorting the ratios, up to the last bits of its sums; the walk
runs it exactly where the draws are made by inverse CDF; those points name it in their identity."""

from __future__ import annotations

import pytest
import torch

from mtad.core.sampling import InverseCdf
from mtad.verify import multidraft as md

F64 = torch.float64


def _pair(seed: int, n: int, dtype=F64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    kind = seed % 5
    q = torch.softmax(2 * torch.randn(n, generator=g, dtype=F64), -1)
    if kind == 0:  # a target near the draft
        p = 0.8 * q + 0.2 * torch.softmax(2 * torch.randn(n, generator=g, dtype=F64), -1)
    elif kind == 1:  # far from it
        p = torch.softmax(3 * torch.randn(n, generator=g, dtype=F64), -1)
    elif kind == 2:  # zeros on both sides
        p = torch.softmax(2 * torch.randn(n, generator=g, dtype=F64), -1)
        p = torch.where(torch.rand(n, generator=g) < 0.3, 0.0, p)
        q = torch.where(torch.rand(n, generator=g) < 0.3, 0.0, q)
        p, q = p / p.sum(), q / q.sum()
    elif kind == 3:  # many equal ratios (ties): p a few multiples of q
        p = q * torch.tensor([0.5, 1.0, 1.5, 2.5], dtype=F64)[torch.randint(0, 4, (n,), generator=g)]
        p = p / p.sum()
    else:  # a peaked draft
        q = torch.softmax(6 * torch.randn(n, generator=g, dtype=F64), -1)
        p = torch.softmax(2 * torch.randn(n, generator=g, dtype=F64), -1)
    return p.to(dtype), q.to(dtype)


@pytest.mark.parametrize("n", [40, 600, 5_000, 60_000])
def test_selection_finds_the_sorts_root(n):
    inner = 0
    for seed in range(25 if n < 10_000 else 10):
        p, q = _pair(seed, n)
        for k in (1, 2, 3, 4, 8):
            want, got = md.spectr_rho(p, q, k), md.spectr_rho_select(p, q, k)
            assert got == pytest.approx(want, rel=1e-10, abs=0), (seed, k)
            beta = float(torch.minimum(q, p / got).sum())
            assert abs(1 - (1 - beta) ** k - got * beta) < 1e-12
            inner += 1 < want < k
    assert inner > 10, "most cases must bisect inside (1, k)"


def test_selection_in_float32_and_its_edges():
    for seed in range(10):
        p, q = _pair(seed, 30_000, torch.float32)
        for k in (2, 4, 8):
            assert md.spectr_rho_select(p, q, k) == pytest.approx(md.spectr_rho(p, q, k), rel=1e-5)
    p, q = _pair(1, 1000)
    assert md.spectr_rho_select(p, p.clone(), 4) == 1.0  # q <= p everywhere: 1
    e = torch.tensor([0.25, 0.25, 0.5 - 2**-53], dtype=F64)  # p = q, its sum an ulp below 1
    assert md.spectr_rho_select(e, e.clone(), 8) == 1.0
    disjoint_p, disjoint_q = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=F64), torch.tensor([0.0, 0.0, 0.5, 0.5], dtype=F64)
    assert md.spectr_rho_select(disjoint_p, disjoint_q, 3) == md.spectr_rho(disjoint_p, disjoint_q, 3)


def test_the_position_outcome_is_the_sorts():
    for seed in range(10):
        p, q = _pair(seed, 3_000)
        cands = torch.multinomial(q, 4, replacement=True, generator=torch.Generator().manual_seed(seed)).tolist()
        a, b = md.spectr_position(p, q, cands), md.spectr_position_select(p, q, cands)
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-15)


def test_the_walk_selects_under_the_inverse_cdf_only(monkeypatch):
    """A walk over long rows calls the selection with the inverse-CDF generator, the sort with the
    race's (whose streams, and every committed record's, stay as they were)."""
    calls = {"sort": 0, "select": 0}
    sort, select = md.spectr_rho, md.spectr_rho_select

    def count(name, fn):
        def wrapped(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setattr(md, "spectr_rho", count("sort", sort))
    monkeypatch.setattr(md, "spectr_rho_select", count("select", select))
    n = 6_000  # past DENSE_MAX and _FAST_MAX: the tensor rule on compressed columns
    rows = [_pair(s, n)[0] for s in range(3)]
    parents, tokens = [-1, 0, 0, 0], [0, 1, 2, 3]
    for gen, used, unused in ((InverseCdf().manual_seed(0), "select", "sort"),
                              (torch.Generator().manual_seed(0), "sort", "select")):
        calls.update(sort=0, select=0)
        md.MultiDraft("spectr").walk(parents, tokens, torch.stack([rows[0]] * 4), torch.stack([rows[1]] * 4), gen)
        assert calls[used] >= 1 and calls[unused] == 0, calls


def test_spectr_points_drawn_by_inverse_cdf_name_the_selection():
    from mtad.run.results.identity import draw_version

    assert draw_version({"_target_": "mtad.decoders.spectr.SpecTr"}) == "2+spectr_rho_select"
    assert draw_version({"_target_": "mtad.decoders.specinfer.SpecInfer"}) == "2"
    assert draw_version({"_target_": "mtad.decoders.compose.Speculative", "proposer": "chains",
                         "verifier": "spectr"}) == "2+spectr_rho_select"
    assert draw_version({"_target_": "mtad.decoders.compose.Speculative", "proposer": "beam",
                         "verifier": "spectr"}) == "2+slot_then_row+spectr_rho_select"
    assert draw_version({"_target_": "mtad.decoders.compose.Speculative", "proposer": ["x"],
                         "verifier": {"y": 1}}) == "2"  # (a stored config's odd names: no identity part)

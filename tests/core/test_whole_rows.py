"""Whole rows (plain temperature) skip the support scans and give exactly what the scans give:
``mtad.core.sampling.support`` and ``mtad.verify.multidraft.compress_support``."""

from __future__ import annotations

import torch

from mtad.core.sampling import DENSE_MAX, Support, support
from mtad.verify.multidraft import compress_support

V = DENSE_MAX + 904


def _scan(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.nonzero(probs > 0).flatten()
    return ids, probs[ids]


def _mark(P: Support, Q: Support, cands: list[int]):
    """compress_support's merge by a mark over the vocabulary (its path for long supports)."""
    (p_ids, p_vals), (q_ids, q_vals) = P.positive(), Q.positive()
    cand_t = torch.tensor(cands, dtype=torch.long)
    mark = torch.zeros(P.size, dtype=torch.bool)
    for ids in (p_ids, q_ids, cand_t):
        mark[ids] = True
    cols = mark.nonzero().flatten()
    rank = mark.cumsum(0) - 1
    Pc = torch.zeros(len(cols), dtype=p_vals.dtype).index_put_((rank[p_ids],), p_vals)
    Qc = torch.zeros(len(cols), dtype=q_vals.dtype).index_put_((rank[q_ids],), q_vals)
    return Pc, Qc, rank[cand_t].tolist(), cols


def test_a_whole_row_gives_the_scans_ids_and_masses_in_a_copy():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        row = torch.softmax(torch.randn(V, generator=g, dtype=dtype), -1)
        assert bool((row > 0).all())
        ids, vals = support(row)
        ref_ids, ref_vals = _scan(row)
        assert torch.equal(ids, ref_ids) and torch.equal(vals, ref_vals) and vals.dtype == dtype
        vals[0] = -1.0  # a copy, as the scan's gather is: the row is untouched
        assert row[0] > 0
        cut = row.clone()
        cut[::3] = 0  # not whole: the scan
        ids, vals = support(cut)
        ref_ids, ref_vals = _scan(cut)
        assert torch.equal(ids, ref_ids) and torch.equal(vals, ref_vals)


def test_compress_support_with_a_whole_row_is_the_marks_answer():
    g = torch.Generator().manual_seed(1)
    whole = torch.softmax(torch.randn(V, generator=g), -1)
    part = whole.clone()
    part[torch.rand(V, generator=g) < 0.7] = 0
    cands = [5, V - 1, 17]
    for p, q in ((whole, whole), (whole, part), (part, whole)):
        P, Q = Support(*support(p), V), Support(*support(q), V)
        got = compress_support(P, Q, cands)
        Pc, Qc, c_at, cols = _mark(P, Q, cands)
        assert torch.equal(got.P, Pc) and torch.equal(got.Q, Qc) and got.cands == c_at and torch.equal(got.cols, cols)
        got.P[0] = -1.0  # the rules may update their columns in place: never the caller's row
        assert P.vals[0] > 0


def test_the_whole_row_check_and_the_clamp_skipped_once_change_nothing():
    """``support``'s check by the least entry takes the scan for a row with a zero or a nan; a
    whole row's ids are shared (read only); ``cdf_index(..., nonneg=True)`` on clamped masses
    draws what the clamping call draws, bit for bit."""
    from mtad.core.sampling import cdf_index, whole_ids

    g = torch.Generator().manual_seed(1)
    row = torch.softmax(torch.randn(V, generator=g), -1)
    for bad in (0.0, float("nan")):
        r = row.clone()
        r[17] = bad
        ids, vals = support(r)
        ref_ids, ref_vals = _scan(r)
        assert torch.equal(ids, ref_ids) and torch.equal(vals, ref_vals) and 17 not in ids.tolist()
    assert support(row)[0] is whole_ids(V) and torch.equal(whole_ids(V), torch.arange(V))
    for masses in (row, torch.where(torch.rand(V, generator=g) < 0.5, row, 0.0), row.double()):
        x = masses.clamp_min(0)
        u = torch.rand(3, 5, dtype=torch.float64, generator=g)
        for a, b in zip(cdf_index(x.expand(3, V), u), cdf_index(x.expand(3, V), u, nonneg=True)):
            assert torch.equal(a, b)

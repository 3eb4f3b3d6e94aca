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


def test_a_whole_row_gives_the_scans_ids_and_masses_as_they_are():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        row = torch.softmax(torch.randn(V, generator=g, dtype=dtype), -1)
        assert bool((row > 0).all())
        ids, vals = support(row)
        ref_ids, ref_vals = _scan(row)
        assert torch.equal(ids, ref_ids) and torch.equal(vals, ref_vals) and vals.dtype == dtype
        assert vals is row  # no copy: a support's masses are only read (test below)
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


def test_no_reader_of_a_whole_support_writes_into_the_row():
    """A whole row's support is the row itself (``support`` makes no copy), and so are the
    columns ``compress_support`` gives the rules: every draw (with and without replacement,
    inverse CDF and race), every rule and a walk over a tree leave the rows' bits as they were."""
    from mtad.core.sampling import InverseCdf, sample
    from mtad.propose.tree import _draws
    from mtad.verify.multidraft import RULES, _walk

    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.float64):
        rows = torch.softmax(2 * torch.randn(4, V, generator=g, dtype=dtype), -1)  # [4, V]
        kept = rows.clone()
        sup = [Support(*support(r), V) for r in rows]
        assert all(s.whole() and s.vals.data_ptr() == r.data_ptr() for s, r in zip(sup, rows))
        for gen in (InverseCdf().manual_seed(5), torch.Generator().manual_seed(5)):
            for replacement in (True, False):
                _draws(sup[0], 4, gen, replacement)
            sample(sup[1], gen)
            cands = _draws(sup[1], 3, gen, True)
            for name, rule in RULES.items():
                c = compress_support(sup[0], sup[1], cands)
                assert c.P is sup[0].vals and c.Q is sup[1].vals  # the rows themselves
                out = rule(c.P, c.Q, c.cands)
                sample(out.residual, gen)
                # a tree: root -> 3 children (from row 1), the first child -> 1 grandchild
                parents, tokens = [-1, 0, 0, 0, 1], [0, *cands, int(cands[0])]
                p = [sup[0], sup[2], sup[3], sup[2], sup[3]]
                q = [sup[1], sup[1], sup[0], sup[0], sup[0]]
                _walk(parents, tokens, p, q, gen, rule, merge_equal_prefixes=(name == "spectr"))
        assert torch.equal(rows, kept), dtype


def test_host_supports_checks_every_row_at_once_and_gives_supports_answer():
    """``host_supports_with`` on host rows finds the whole rows for all rows in one pass; each
    row's support is ``support``'s (a whole row as it is, a row with zeros, negative entries or a
    nan scanned), with the companion values at its ids."""
    g = torch.Generator().manual_seed(3)
    rows = torch.softmax(torch.randn(5, V, generator=g), -1)
    rows[1, ::5] = 0
    rows[2, 7] = -1e-9
    rows[3, 11] = float("nan")
    other = torch.randn(5, V, generator=g, dtype=torch.float64)
    from mtad.core.sampling import host_supports_with, whole_ids

    got = host_supports_with(rows, other)
    for i, (s, comp) in enumerate(got):
        ids, vals = support(rows[i])
        assert torch.equal(s.ids, ids) and torch.equal(s.vals, vals) and s.size == V, i
        assert torch.equal(comp, other[i][ids]), i
        assert s.whole() == (i in (0, 4)), i
        if s.whole():
            assert s.ids is whole_ids(V) and s.vals.data_ptr() == rows[i].data_ptr()

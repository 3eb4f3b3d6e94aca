"""``mtad.core.topk.topk_rows``: ``torch.topk``'s values, in its order, on rows with ties,
-inf, NaN, a tail that fills no block, and top values packed in one block or spread over many;
indices equal wherever the values are distinct, and valid (unique, pointing at the values)
everywhere."""

from __future__ import annotations

import pytest
import torch

from mtad.core.topk import BLOCK, argmax_rows, topk_rows

V = 151_936  # the offline pair's vocabulary: 2,374 blocks, no tail


def _check(rows: torch.Tensor, m: int) -> None:
    want_v, want_i = torch.topk(rows, m, dim=-1)
    got_v, got_i = topk_rows(rows, m)
    assert got_v.shape == want_v.shape and got_i.shape == want_i.shape
    assert got_v.dtype == want_v.dtype and got_i.dtype == want_i.dtype
    assert torch.equal(got_v.isnan(), want_v.isnan())
    assert torch.equal(got_v.nan_to_num(0.0), want_v.nan_to_num(0.0))  # values, in order
    flat_rows = rows.reshape(-1, rows.shape[-1])
    gv, gi, wi = got_v.reshape(-1, m), got_i.reshape(-1, m), want_i.reshape(-1, m)
    for r in range(flat_rows.shape[0]):
        assert len(set(gi[r].tolist())) == m  # unique indices
        picked = flat_rows[r][gi[r]]
        assert torch.equal(picked.isnan(), gv[r].isnan())
        assert torch.equal(picked.nan_to_num(0.0), gv[r].nan_to_num(0.0))  # they point at the values
        row = flat_rows[r]
        for j in range(m):  # a value no other entry of the row holds: torch.topk's index
            v = gv[r, j]
            if not v.isnan() and int((row == v).sum()) == 1:
                assert int(gi[r, j]) == int(wi[r, j])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,m", [((4, V), 12), ((1, V), 11), ((V,), 5), ((2, 3, V), 9),
                                     ((3, 32_000), 12), ((2, 50_003), 7), ((4, V), 40)])
def test_random_rows_match_torch_topk(dtype, shape, m):
    g = torch.Generator().manual_seed(sum(shape) + m)
    rows = (torch.randn(*shape, generator=g, dtype=dtype) * 3).softmax(-1)
    _check(rows, m)


def test_bfloat16_logits_with_many_ties():
    g = torch.Generator().manual_seed(1)
    rows = (torch.randn(4, V, generator=g) * 2).bfloat16().float()  # ~2^8 distinct values per octave
    _check(rows, 11)
    _check(rows.bfloat16(), 11)


def test_top_values_in_one_block_and_at_the_tail():
    rows = torch.zeros(3, 40 * BLOCK + 17)
    nb = rows.shape[-1] // BLOCK
    # row 0: all top values in one (strided) block: entries g, g + nb, g + 2 nb, ...
    rows[0, torch.arange(12) * nb + 5] = torch.arange(12, 0, -1, dtype=torch.float32)
    # row 1: the top values in the tail that fills no block
    rows[1, -17:] = torch.arange(17, dtype=torch.float32) + 1
    # row 2: one value per block, the largest in the last blocks
    rows[2, : nb] = torch.arange(nb, dtype=torch.float32)
    for m in (1, 3, 5):
        _check(rows, m)


def test_masked_rows_with_minus_inf_and_nan():
    g = torch.Generator().manual_seed(2)
    rows = torch.randn(3, V, generator=g)
    rows[0, 1000:] = float("-inf")  # top-k-masked logits
    rows[1, :] = float("-inf")
    rows[1, [7, 70_000, V - 1]] = torch.tensor([1.0, 2.0, 0.5])
    rows[2, [3, 99_999]] = float("nan")
    _check(rows, 12)


def test_all_equal_rows_give_valid_indices():
    rows = torch.full((2, V), 0.25)
    _check(rows, 12)


def test_short_rows_and_large_m_are_torch_topk_itself():
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(2, 500, generator=g)
    assert all(torch.equal(a, b) for a, b in zip(topk_rows(rows, 12), torch.topk(rows, 12, dim=-1)))
    rows = torch.randn(2, V, generator=g)
    assert all(torch.equal(a, b) for a, b in zip(topk_rows(rows, 1000), torch.topk(rows, 1000, dim=-1)))


def _check_argmax(rows: torch.Tensor) -> None:
    assert torch.equal(argmax_rows(rows), rows.argmax(-1))


@pytest.mark.parametrize("shape", [(1, V), (5, V), (V,), (2, 3, V), (3, 32_000), (2, 50_003)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_argmax_rows_is_torch_argmax(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    _check_argmax(torch.randn(*shape, generator=g).to(dtype))


def test_argmax_rows_takes_the_first_of_tied_maxima():
    rows = torch.zeros(6, 40 * BLOCK * 3 + 29)
    n = rows.shape[-1]
    chunk = n // BLOCK
    rows[0, [5 * chunk + 7, 2 * chunk + 9, 2 * chunk + 3]] = 1.0  # ties in one chunk and across chunks
    rows[1, [chunk - 1, chunk]] = 2.0  # the last entry of a chunk and the first of the next
    rows[2, [n - 1, 3]] = 1.0  # a tie between the tail and the first chunk: the chunk's
    rows[3, n - 5] = 1.0  # the maximum in the tail alone
    rows[4] = -1.0  # every entry tied: index 0
    rows[5, :] = float("-inf")
    rows[5, n - 1] = float("-inf")
    _check_argmax(rows)
    _check_argmax(torch.randn(4, V).bfloat16().float().round())  # many ties at the maximum


@pytest.mark.stack  # a kernel's contract: checked on the oldest and newest stacks (make test-stack)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [1, 2, 63, 64, 65, 4096, 32_000, V])
def test_one_max_reduction_is_torch_argmax(dtype, vocab):
    """``torch.max(...).indices``, which single rows and short rows take on the CPU, answers as
    ``torch.argmax``: the first of tied maxima, the first NaN, +-inf."""
    g = torch.Generator().manual_seed(vocab)
    cases = [torch.randn(3, vocab, generator=g).round(),  # many ties
             (2 * torch.randn(3, vocab, generator=g)).round().clamp(max=1.0),  # many ties at the maximum
             torch.full((2, vocab), float("-inf")),
             torch.full((2, vocab), -1.0)]
    nan = torch.randn(3, vocab, generator=g)
    nan.scatter_(1, torch.randint(0, vocab, (3, max(1, vocab // 50)), generator=g), float("nan"))
    inf = torch.randn(3, vocab, generator=g)
    inf.scatter_(1, torch.randint(0, vocab, (3, 3), generator=g), float("inf"))
    for rows in cases + [nan, inf]:
        rows = rows.to(dtype)
        for r in (rows, rows[0], rows[:1], rows.t().contiguous().t()):  # strided rows too
            assert torch.equal(r.max(-1).indices, r.argmax(-1))
            _check_argmax(r)


def test_argmax_rows_with_nan_like_torch():
    g = torch.Generator().manual_seed(5)
    rows = torch.randn(4, 64 * 300 + 11, generator=g)
    rows[0, [9000, 400]] = float("nan")  # the first NaN
    rows[1, -3] = float("nan")  # a NaN in the tail only
    rows[2, [5, rows.shape[-1] - 1]] = float("nan")
    _check_argmax(rows)

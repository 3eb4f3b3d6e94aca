"""Inverse-CDF draws without replacement sum again only the part of the cumulative masses from the
entry last drawn on (``mtad.core.sampling.cdf_positions``): the same positions and the same
generator state, bit for bit, as summing the whole row again before every draw."""

from __future__ import annotations

import pytest
import torch

from mtad.core.sampling import InverseCdf, cdf_positions, cdf_search, uniforms


def _whole_again(vals: torch.Tensor, k: int, gen: torch.Generator) -> list[int]:
    """The draws by the definition: the whole row's float64 cumulative masses before every draw
    (also for rows searched by blocks, ``mtad.core.cdf_blocks``)."""
    x = vals.clamp_min(0).to(torch.float64)
    nz = int((x > 0).sum())
    if min(k, nz) == 0:
        return []
    u = uniforms(k, gen)
    out = []
    for i in range(min(k, nz)):
        j, total = cdf_search(x.cumsum(-1), u[i : i + 1])
        assert 0 < float(total) < float("inf")
        out.append(int(j))
        x[out[-1]] = 0.0
    return out


def _rows(n: int, dtype: torch.dtype, g: torch.Generator) -> dict[str, torch.Tensor]:
    whole = torch.softmax(3 * torch.randn(n, generator=g, dtype=torch.float64), -1).to(dtype)
    sparse = torch.where(torch.rand(n, generator=g) < 0.5, whole, torch.zeros((), dtype=dtype))
    first = whole.clone()
    first[0] = 50.0  # drawn first, at position 0
    last = whole.clone()
    last[-1] = 50.0  # at the last position
    few = torch.zeros(n, dtype=dtype)
    few[[3, n // 2, n - 2]] = torch.tensor([0.2, 0.5, 0.3], dtype=dtype)  # fewer entries than draws
    signed = whole - whole.mean()  # negative entries count as 0
    return {"whole": whole, "sparse": sparse, "first": first, "last": last, "few": few, "signed": signed}


@pytest.mark.parametrize("n", [600, 5_000, 32_000, 151_936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_draws_without_replacement_are_the_whole_sums_draws(n, dtype):
    g = torch.Generator().manual_seed(n)
    for name, row in _rows(n, dtype, g).items():
        for seed in range(3 if n > 40_000 else 6):
            for k in (1, 2, 4, 7):
                a, b = InverseCdf().manual_seed(seed), InverseCdf().manual_seed(seed)
                kept = row.clone()
                got = cdf_positions(row, k, False, a, positive=name in ("whole", "first", "last"))
                assert got == _whole_again(row, k, b), (name, seed, k)
                assert len(set(got)) == len(got)
                assert torch.equal(a.get_state(), b.get_state())
                assert torch.equal(row, kept)  # the caller's row is not written into


def test_a_row_without_mass_is_refused_and_draws_nothing():
    gen = InverseCdf().manual_seed(0)
    assert cdf_positions(torch.zeros(1000), 3, False, gen) == []
    row = torch.full((1000,), float("nan"))
    row[5] = 1.0
    with pytest.raises(RuntimeError, match="sum of probabilities"):
        cdf_positions(row, 2, False, gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dropping_an_entry_gives_the_whole_rows_cumulative_masses_bit_for_bit(dtype):
    from mtad.core.sampling import cdf_drop

    g = torch.Generator().manual_seed(11)
    for n in (600, 32_000, 151_936):
        x = torch.softmax(4 * torch.randn(n, generator=g, dtype=torch.float64), -1).to(dtype).double()
        c = x.cumsum(-1)
        picks = [0, n - 1, *torch.randint(1, n - 1, (6,), generator=g).tolist()]
        for j in picks:
            cdf_drop(c, x, j)
            assert x[j] == 0
            ref = x.cumsum(-1)
            assert torch.equal(c, ref) and c.view(torch.int64).equal(ref.view(torch.int64)), (n, j)

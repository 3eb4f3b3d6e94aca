"""Inverse-CDF draws searched by blocks (``mtad.core.cdf_blocks``) find the index of the definition,
the search of the row's whole float64 cumulative sum (``cdf_search(x.double().cumsum(-1), u)``),
on random, adversarial and boundary uniforms, with and without replacement; where the block
bounds cannot decide, the whole sum is searched (the fallback), and the tests count both paths.
Planted faults (no slack, no upper test) make them fail."""

from __future__ import annotations

import pytest
import torch

from mtad.core import cdf_blocks
from mtad.core.sampling import (
    EmptySupport,
    InverseCdf,
    cdf_index,
    cdf_positions,
    cdf_search,
    uniforms,
)
from mtad.propose import tree as tr

LONG = (cdf_blocks.MIN_LENGTH, 100_003, 151_936)  # the first a multiple of the block, the others not


def _definition(x: torch.Tensor, u: torch.Tensor) -> tuple[list[int], float]:
    """The draw as the scheme defines it: the whole row's float64 cumulative sum, searched."""
    j, total = cdf_search(x.clamp_min(0).double().cumsum(-1), u)
    return j.tolist(), float(total)


def _rows(n: int, dtype, g: torch.Generator) -> dict[str, torch.Tensor]:
    flat = torch.softmax(torch.randn(n, generator=g, dtype=torch.float64), -1).to(dtype)
    peaked = torch.softmax(8 * torch.randn(n, generator=g, dtype=torch.float64), -1).to(dtype)  # spans 1e-30..1
    sparse = torch.where(torch.rand(n, generator=g) < 0.9, torch.zeros((), dtype=dtype), flat)
    spike = flat.clone()
    spike[n // 2] = 1e6  # almost all the mass on one entry, the rest under the slack's scale
    ends = torch.zeros(n, dtype=dtype)
    ends[[0, cdf_blocks.BLOCK - 1, cdf_blocks.BLOCK, n - 1]] = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=dtype)
    tiny = flat * 1e-30  # unnormalised, far from 1
    signed = flat - flat.mean()  # negative entries count as 0
    order = torch.full((n,), 1e-6, dtype=dtype)
    order[: n // 2] = 1e-17
    order[0] = 1.0  # the sum in order drops every 1e-17 (c = 1 over the first half), a sum by blocks keeps them
    return {"flat": flat, "peaked": peaked, "sparse": sparse, "spike": spike, "ends": ends, "tiny": tiny,
            "signed": signed, "order": order}


def _uniforms(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Random uniforms, and uniforms whose target falls on a cumulative sum, one ulp either side."""
    c = x.clamp_min(0).double().cumsum(-1)
    total = c[-1]
    at = torch.randint(0, x.numel(), (24,), generator=g)
    on = (c[at] / total).clamp(0, 1 - 2**-53)
    zero, one = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    edges = torch.tensor([0.0, 2**-60, 0.5, 1 - 2**-40, 1 - 2**-53], dtype=torch.float64)
    return torch.cat([torch.rand(40, dtype=torch.float64, generator=g), on, torch.nextafter(on, zero),
                      torch.nextafter(on, one).clamp_max(1 - 2**-53), edges])


@pytest.mark.parametrize("n", LONG)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_blocks_find_the_whole_sums_index(n, dtype):
    g = torch.Generator().manual_seed(n)
    fell = searched = 0
    for name, row in _rows(n, dtype, g).items():
        u = _uniforms(row, g)
        want, total = _definition(row, u)
        b = cdf_blocks.Blocks([row.clamp_min(0)])
        got, totals = b.index([u.tolist()])
        assert got[0] == want, name
        assert abs(totals[0] - total) <= 1e-9 * total, name
        fell += b.fell
        for ui in u[:40].tolist():  # the random ones alone: decided by blocks
            one = cdf_blocks.Blocks([row.clamp_min(0)])
            assert one.index([[ui]])[0][0] == _definition(row, torch.tensor([ui], dtype=torch.float64))[0], name
            searched += one.fell == 0
    assert fell >= 4  # boundary uniforms go to the whole sum
    assert searched >= 0.95 * 40 * 8  # random ones almost never do


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cdf_index_on_a_batch_of_long_rows_is_the_definition(dtype, monkeypatch):
    """``cdf_index`` by blocks where ``SITES`` turns it on (off by default: ``bench/draw_paths.py``)."""
    calls = []
    monkeypatch.setattr(cdf_blocks, "SITES", {**cdf_blocks.SITES, "single": True, "rows": True})
    monkeypatch.setattr(cdf_blocks.Blocks, "_row", lambda self, *a, _f=cdf_blocks.Blocks._row: calls.append(1)
                        or _f(self, *a))
    g = torch.Generator().manual_seed(3)
    x = torch.softmax(3 * torch.randn(2, 3, 151_936, generator=g), -1).to(dtype)
    u = torch.rand(2, 3, 4, dtype=torch.float64, generator=g)
    j, total = cdf_index(x, u)
    want, want_total = cdf_search(x.double().cumsum(-1), u)
    assert torch.equal(j, want) and j.shape == (2, 3, 4) and total.shape == (2, 3, 1)
    assert torch.allclose(total, want_total, rtol=1e-9, atol=0)
    jt, _ = cdf_index(x.transpose(0, 1), u.transpose(0, 1))  # not contiguous
    assert torch.equal(jt, want.transpose(0, 1))
    assert len(calls) == 12
    monkeypatch.setattr(cdf_blocks, "SITES", {**cdf_blocks.SITES, "single": False, "rows": False})
    assert torch.equal(cdf_index(x, u)[0], want) and len(calls) == 12  # the whole sum, as by default


def test_the_sites_by_default():
    """Blocks where they were measured to gain in a run (``results/bench/draw_paths_cpu.md``)."""
    assert cdf_blocks.SITES == {"level": True, "without": True, "single": False, "rows": False}


@pytest.mark.parametrize("n", LONG)
def test_draws_without_replacement_drop_in_blocks_as_the_whole_sum_does(n):
    g = torch.Generator().manual_seed(n + 1)
    for name, row in _rows(n, torch.float32, g).items():
        for seed in range(4):
            for k in (2, 5):
                a, b = InverseCdf().manual_seed(seed), InverseCdf().manual_seed(seed)
                kept = row.clone()
                got = cdf_positions(row, k, False, a)
                x = row.clamp_min(0).double()
                u = uniforms(k, b)
                want = []
                for i in range(min(k, int((x > 0).sum()))):
                    want.append(_definition(x, u[i : i + 1])[0][0])
                    x[want[-1]] = 0.0
                assert got == want, (name, seed, k)
                assert torch.equal(a.get_state(), b.get_state()) and torch.equal(row, kept)


def test_a_drop_sums_its_block_again_and_the_prefix_after_it():
    g = torch.Generator().manual_seed(5)
    x = torch.softmax(torch.randn(100_003, generator=g), -1)
    b = cdf_blocks.Blocks([x])
    for j in (0, cdf_blocks.BLOCK - 1, cdf_blocks.BLOCK, 5_000, 100_002, 5_001):
        b.drop(0, j)
    y = x.double()
    y[[0, cdf_blocks.BLOCK - 1, cdf_blocks.BLOCK, 5_000, 100_002, 5_001]] = 0
    ends = y.cumsum(0)[cdf_blocks.BLOCK - 1 :: cdf_blocks.BLOCK].tolist() + [float(y.sum())]
    assert len(b.p[0]) == len(ends)
    assert all(abs(p - e) <= 1e-12 for p, e in zip(b.p[0], ends))


def test_the_level_path_by_blocks_is_the_definition():
    g = torch.Generator().manual_seed(9)
    rows = list(torch.softmax(3 * torch.randn(6, 151_936, generator=g), -1))
    a, b = InverseCdf().manual_seed(1), InverseCdf().manual_seed(1)
    got = tr._whole_level_cdf(rows, 3, a)
    u = uniforms(18, b).view(6, 3)
    assert got == [_definition(r, u[i])[0] for i, r in enumerate(rows)]
    assert torch.equal(a.get_state(), b.get_state())


@pytest.mark.parametrize("bad", ["zeros", "nan", "inf"])
def test_a_row_without_a_usable_total_is_refused_as_before(bad):
    x = torch.zeros(cdf_blocks.MIN_LENGTH + 7)
    if bad != "zeros":
        x[:100] = 0.5
        x[77] = float(bad)
    with pytest.raises(EmptySupport, match="sum of probabilities"):
        cdf_positions(x, 1, True, InverseCdf().manual_seed(0))
    want = _definition(x, torch.tensor([0.3], dtype=torch.float64))[1]
    b = cdf_blocks.Blocks([x])
    _, totals = b.index([[0.3]])
    assert b.fell == 1 and (totals[0] == want or (totals[0] != totals[0] and want != want))


def _near_boundaries(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Uniforms on a grid of 1e-13 within 1e-11 either side of some cumulative sums' uniforms:
    where the sums of another order (about 1e-12 from ``c`` on the row ``order``) disagree."""
    c = x.double().cumsum(-1)
    on = c[torch.randint(x.numel() // 2, x.numel(), (8,), generator=g)] / c[-1]
    return (on[:, None] + 1e-13 * torch.arange(-100, 101, dtype=torch.float64)).flatten().clamp(0, 1 - 2**-53)


@pytest.mark.parametrize("fault", ["no slack", "no upper test"])
def test_a_planted_fault_is_caught(fault, monkeypatch):
    """Without the slack, or with bounds that pass whatever the sums, some uniform gets another
    index than the definition's: the test above would fail (on the row ``order`` and uniforms
    near its cumulative sums), and with the slack it does not."""
    g = torch.Generator().manual_seed(17)
    cases = []
    for n in LONG:
        for dtype in (torch.float32, torch.float64):
            row = _rows(n, dtype, g)["order"]
            cases.append((row, _near_boundaries(row, g)))

    def wrong() -> int:
        out = 0
        for row, u in cases:  # one uniform at a time: a row's fallback is not its other uniforms'
            b = cdf_blocks.Blocks([row])
            got = [b.index([[ui]])[0][0][0] for ui in u.tolist()]
            out += sum(x != y for x, y in zip(got, _definition(row, u)[0]))
            decided.append(len(u) - b.fell)
        return out

    decided: list[int] = []

    assert wrong() == 0 and sum(decided) < 0.01 * sum(len(u) for _, u in cases)  # the whole sum's
    if fault == "no slack":
        monkeypatch.setattr(cdf_blocks, "_slack", lambda n, total: 0.0)
    else:
        monkeypatch.setattr(cdf_blocks, "_WIDE", 1.0)
        monkeypatch.setattr(cdf_blocks, "_slack", lambda n, total: -1e-9 * total)  # every test passes
    assert wrong() > 0 and sum(decided[len(cases):]) > 0

"""A level's draws with replacement by inverse CDF from whole rows, made for all rows at once
(``mtad.propose.tree._whole_level_cdf``): the positions and generator state of the draws row
after row (``cdf_positions``), bit for bit, and the level path takes them exactly where it
should."""

from __future__ import annotations

import pytest
import torch

from mtad.core.sampling import DENSE_MAX, InverseCdf, Support, cdf_positions, support
from mtad.propose import tree as tr


def _level(f: int, v: int, dtype, seed: int) -> list[Support]:
    g = torch.Generator().manual_seed(seed)
    rows = torch.softmax(3 * torch.randn(f, v, generator=g, dtype=torch.float64), -1).to(dtype)
    return [Support(*support(r), v) for r in rows]


@pytest.mark.parametrize("v", [DENSE_MAX + 1, 32_000, 151_936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_whole_level_at_once_is_row_after_row(v, dtype):
    for f, k, seed in ((2, 1, 0), (4, 2, 1), (8, 2, 2), (3, 4, 3)):
        level = _level(f, v, dtype, seed)
        assert all(s.whole() for s in level)
        a, b = InverseCdf().manual_seed(seed), InverseCdf().manual_seed(seed)
        got = tr._whole_level_cdf([s.vals for s in level], k, a)
        want = [cdf_positions(s.vals, k, True, b, positive=True) for s in level]
        assert got == want and torch.equal(a.get_state(), b.get_state()), (f, k)


def test_the_level_path_takes_it_for_whole_rows_with_replacement_only(monkeypatch):
    calls = []
    orig = tr._whole_level_cdf
    monkeypatch.setattr(tr, "_whole_level_cdf", lambda *a: calls.append(1) or orig(*a))
    level = _level(4, DENSE_MAX + 50, torch.float32, 7)
    tr._level_draws(level, 2, InverseCdf().manual_seed(0), replacement=True)
    assert calls == [1]
    tr._level_draws(level, 2, InverseCdf().manual_seed(0), replacement=False)  # MCSS's siblings: row by row
    tr._level_draws(level, 2, torch.Generator().manual_seed(0), replacement=True)  # the race
    cut = level[1].vals.clone()
    cut[::3] = 0  # a row with zeros (top-p's nucleus): not whole
    tr._level_draws([level[0], Support(*support(cut), cut.numel())], 2, InverseCdf().manual_seed(0), True)
    assert calls == [1]


@pytest.mark.parametrize("v", [70_000, 151_936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_whole_levels_siblings_at_once_are_row_after_row(v, dtype):
    """MCSS's siblings without replacement from a level of long whole rows, by one block-sum table
    (``_whole_level_siblings``): the positions and generator state of the draws row after row."""
    for f, k, seed in ((2, 1, 0), (4, 2, 1), (8, 2, 2), (3, 4, 3)):
        level = _level(f, v, dtype, seed)
        a, b = InverseCdf().manual_seed(seed), InverseCdf().manual_seed(seed)
        got = tr._whole_level_siblings([s.vals for s in level], k, a)
        want = [cdf_positions(s.vals, k, False, b, positive=True) for s in level]
        assert got == want and torch.equal(a.get_state(), b.get_state()), (f, k)
        assert all(len(set(p)) == len(p) == k for p in got)


def test_the_siblings_path_takes_long_whole_rows_without_replacement_only(monkeypatch):
    from mtad.core import cdf_blocks

    calls = []
    orig = tr._whole_level_siblings
    monkeypatch.setattr(tr, "_whole_level_siblings", lambda *a: calls.append(1) or orig(*a))
    level = _level(3, cdf_blocks.MIN_LENGTH + 5, torch.float32, 4)
    tr._level_draws(level, 2, InverseCdf().manual_seed(0), replacement=False)
    assert calls == [1]
    tr._level_draws(level, 2, InverseCdf().manual_seed(0), replacement=True)  # with replacement: the level cdf
    tr._level_draws(_level(3, DENSE_MAX + 50, torch.float32, 4), 2, InverseCdf().manual_seed(0), False)  # short
    cut = level[1].vals.clone()
    cut[::3] = 0  # not whole
    tr._level_draws([level[0], Support(*support(cut), cut.numel())], 2, InverseCdf().manual_seed(0), False)
    monkeypatch.setattr(cdf_blocks, "SITES", {**cdf_blocks.SITES, "without": False})
    tr._level_draws(level, 2, InverseCdf().manual_seed(0), replacement=False)  # the site off
    assert calls == [1]

"""The i.i.d. tree's draws (``mtad.propose.tree``): children drawn with their exponentials at
once are the draws of successive ``torch.multinomial`` calls (same tokens, same generator
state), and the draft's supports read from the warping's candidates are the dense rows'."""

from __future__ import annotations

import pytest
import torch

from mtad.core.sampling import DENSE_MAX, Support, host_supports
from mtad.core.warping import Warping
from mtad.propose.tree import _level_draws, iid_children, warped_supports, without_replacement

pytestmark = pytest.mark.stack  # torch.multinomial's stream


def _supports(dtype):
    """Sparse supports of a long vocabulary and dense ones (zeros included) of a short one."""
    g = torch.Generator().manual_seed(0)
    out = []
    for n in (1, 2, 7, 40, 300, 700):  # short supports (drawn on lists) and a long one
        vals = torch.rand(n, generator=g, dtype=torch.float64).to(dtype) + 0.01
        ids = torch.randperm(DENSE_MAX + 5000, generator=g)[:n].sort().values
        out.append(Support(ids, vals, DENSE_MAX + 5000))
        dense = torch.rand(n + 3, generator=g, dtype=torch.float64).to(dtype)
        dense[torch.rand(n + 3, generator=g) < 0.4] = 0
        dense[0] = 0.5
        out.append(Support(torch.arange(n + 3), dense, n + 3))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_iid_children_are_successive_multinomial_draws(dtype):
    for i, s in enumerate(_supports(dtype)):
        for k in (1, 2, 5):
            g, ref = torch.Generator().manual_seed(i), torch.Generator().manual_seed(i)
            want = [int(s.ids[torch.multinomial(s.vals, 1, generator=ref)][0]) for _ in range(k)]
            assert iid_children(s, k, g) == want
            assert torch.equal(g.get_state(), ref.get_state())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_siblings_without_replacement_are_successive_multinomial_draws(dtype):
    for i, s in enumerate(_supports(dtype)):
        for k in (1, 3, 9):
            g, ref = torch.Generator().manual_seed(i), torch.Generator().manual_seed(i)
            vals, want = s.vals.clone(), []
            for _ in range(min(k, int((vals > 0).sum()))):
                j = int(torch.multinomial(vals, 1, generator=ref))
                want.append(int(s.ids[j]))
                vals[j] = 0
            got = without_replacement(s, k, g)
            assert got == want and len(set(got)) == len(got)
            assert torch.equal(g.get_state(), ref.get_state())


def test_draws_refuse_a_distribution_without_mass():
    s = Support(torch.arange(3), torch.zeros(3), 3)
    with pytest.raises(RuntimeError, match="invalid multinomial"):
        iid_children(s, 2, torch.Generator())
    s = Support(torch.arange(3), torch.tensor([0.5, float("nan"), 0.5]), 3)
    with pytest.raises(RuntimeError, match="invalid multinomial"):
        iid_children(s, 1, torch.Generator())


@pytest.mark.parametrize("vocab", [50, DENSE_MAX + 904])
@pytest.mark.parametrize("warping", [Warping(0.0), Warping(1.0, 10, 0.9), Warping(0.7, 5),
                                     Warping(1.0, 0, 0.9), Warping(1.3)])
def test_warped_supports_are_the_dense_rows_supports(vocab, warping):
    g = torch.Generator().manual_seed(vocab)
    logits = 3 * torch.randn(4, vocab, generator=g)
    logits[:2] = logits[:2].round()  # ties at the k-th logit
    got = warped_supports(warping, logits)
    want = host_supports(warping(logits), warping.support_bound)
    assert len(got) == len(want) == 4
    for a, b in zip(got, want):
        assert a.size == b.size and torch.equal(a.ids, b.ids)
        assert a.vals.dtype == b.vals.dtype and torch.equal(a.vals, b.vals)


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_levels_draws_are_its_parents_draws_in_turn(replacement, dtype):
    """A tree level's draws with one call for every exponential: the parents' draws in turn."""
    sampler = iid_children if replacement else without_replacement
    supports = _supports(dtype)
    for seed, group in enumerate((supports[:4], supports[4:8], supports[9:])):  # the last: a long one
        g, ref = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        assert _level_draws(group, 3, g, replacement) == [sampler(s, 3, ref) for s in group]
        assert torch.equal(g.get_state(), ref.get_state())

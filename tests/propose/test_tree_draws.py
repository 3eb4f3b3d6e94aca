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
    got = warped_supports(warping, logits).qs
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


# ------------------------------------------------------------------ rows left on an accelerator


def _device_rows(dtype, seed):
    """Long rows as plain temperature gives them (every entry), some with zeros (underflow),
    one with fewer nonzero entries than a parent's children, one without mass."""
    g = torch.Generator().manual_seed(seed)
    v = DENSE_MAX + 904
    rows = torch.softmax(3 * torch.randn(6, v, generator=g, dtype=torch.float64), -1).to(dtype)
    rows[1, torch.randperm(v, generator=g)[: v // 3]] = 0
    rows[2, torch.randperm(v, generator=g)[:50]] = 0
    rows[3] = 0
    rows[3, [7, 4000]] = torch.tensor([0.25, 0.75], dtype=dtype)
    rows[5] = 0
    return rows


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_level_drawn_on_the_device_is_the_host_draws(dtype, replacement):
    """``device_level_draws`` (rows on a virtual device) against ``_level_draws`` on the same rows'
    host supports: the same children, the generator in the same state, one read, no row read."""
    from mtad.propose.tree import device_level_draws
    from mtad.testing.devicecheck import VirtualDevices

    for seed in range(6):
        rows = _device_rows(dtype, seed)
        for pick in ([0], [0, 1, 2, 3], [4, 1, 0], [3, 3]):
            for k in (1, 2, 4):
                ref, g = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
                want = _level_draws(host_supports(rows[pick]), k, ref, replacement)
                with VirtualDevices() as vd:
                    dev = rows.to("cuda:0")
                    got = device_level_draws([dev[i] for i in pick], k, g, replacement)
                assert got == want, (seed, pick, k)
                assert torch.equal(g.get_state(), ref.get_state())
                assert vd.counts["engine"] == 1 and vd.largest_read < rows.shape[-1]
        if replacement:  # a row without mass is refused, as the host refuses it
            g = torch.Generator().manual_seed(0)
            with VirtualDevices(), pytest.raises(RuntimeError, match="invalid multinomial"):
                device_level_draws([rows.to("cuda:0")[5]], 2, g, replacement)
            assert torch.equal(g.get_state(), torch.Generator().manual_seed(0).get_state())
        else:  # without replacement it has no child
            with VirtualDevices():
                assert device_level_draws([rows.to("cuda:0")[5]], 2, torch.Generator(), False) == [[]]

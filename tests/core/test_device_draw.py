"""A plain-temperature draw on an accelerator (``mtad.core.sampling.device_sample``): the
token and the generator's state of the host draw over the support, with no row read back.

Checked on the CPU under the device checker (``mtad.testing.devicecheck``): the row lives
on a virtual ``cuda:0``, so ``sample`` takes the device path, and its result is compared with
``draw`` on the host support of the same row, seed by seed."""

from __future__ import annotations

import pytest
import torch

from mtad.core.sampling import DENSE_MAX, as_support, device_sample, draw, sample
from mtad.testing.devicecheck import VirtualDevices

pytestmark = pytest.mark.stack  # torch.multinomial's stream and the checker's dispatch

V = DENSE_MAX + 904


def _row(kind: str, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(4 * torch.randn(V, dtype=dtype, generator=g), -1)
    if kind == "zeros":  # a support shorter than the row (underflow, or a warping's zeros)
        p[torch.randperm(V, generator=g)[: V // 3]] = 0
    elif kind == "negative":  # negative entries count as 0, as in ``support``
        p[torch.randperm(V, generator=g)[:50]] = -1e-3
    return p


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["full", "zeros", "negative"])
def test_the_device_draw_is_the_host_draw(kind, dtype):
    for seed in range(40):
        p = _row(kind, dtype, seed)
        g_host = torch.Generator().manual_seed(1000 + seed)
        s = as_support(p)
        want = int(draw(s.ids, s.vals, g_host)[0])
        g_dev = torch.Generator().manual_seed(1000 + seed)
        with VirtualDevices() as vd:
            row = p.to("cuda:0")
            got = sample(row, g_dev)  # the device path: an unbounded long row on a device
        assert got == want, (kind, dtype, seed)
        assert torch.equal(g_dev.get_state(), g_host.get_state()), "the stream moved differently"
        assert vd.largest_read == 2, "only the token and the support's size cross"
        assert vd.counts["pinned_engine"] == 1, "the exponentials: one pinned, non-blocking copy"
        assert vd.counts["h2d_engine"] == 1  # the test's own placement of the row


def test_an_empty_support_is_refused_like_the_host_draw():
    with VirtualDevices(), pytest.raises(RuntimeError, match="invalid multinomial"):
        device_sample(torch.zeros(V, dtype=torch.float64).to("cuda:0"), torch.Generator().manual_seed(0))


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["full", "zeros", "negative"])
def test_beam_draws_on_the_device_are_the_host_draws(kind, dtype, replacement):
    """``device_multinomial`` (beam sampling's W draws over W x V scores at plain temperature)
    against ``torch.multinomial`` on the host support: the same entries, masses and companion
    values, the generator in the same state, one read of the draws only. Several draws with
    replacement search cumulative masses the device sums in float64: the host's sum for float64
    masses (the CPU sums in order), so float32 is checked for the stream only there."""
    from mtad.core.sampling import device_multinomial

    for seed in range(12):
        p = _row(kind, dtype, seed)
        other = torch.rand(V, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        s = as_support(p)
        for k in (1, 3, 8):
            g_host, g_dev = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            m = k if replacement else min(k, int((s.vals > 0).sum()))
            pos = torch.multinomial(s.vals, m, replacement=replacement, generator=g_host)
            with VirtualDevices() as vd:
                ids, vals, comp = device_multinomial(p.to("cuda:0"), k, replacement, g_dev,
                                                     other.to("cuda:0"))
            assert torch.equal(g_dev.get_state(), g_host.get_state()), (kind, seed, k)
            assert vd.counts["engine"] == 1 and vd.largest_read <= 3 * k + 1
            if replacement and k > 1 and dtype == torch.float32:
                continue
            assert ids.tolist() == s.ids[pos].tolist(), (kind, seed, k)
            assert torch.equal(vals, s.vals[pos]) and vals.dtype == s.vals.dtype
            assert torch.equal(comp, other[s.ids[pos]])


def test_pending_draws_commit_one_row_or_none():
    """``device_draws``: every row's draw as the generator's next one, in one read; committing
    row i leaves the generator as the host draw on row i; cancelling, as it was."""
    from mtad.core.sampling import device_draws

    rows = torch.stack([_row(kind, torch.float64, 3) for kind in ("full", "zeros", "negative")])
    for i in range(3):
        g_host, g_dev = torch.Generator().manual_seed(i), torch.Generator().manual_seed(i)
        s = as_support(rows[i])
        want = int(draw(s.ids, s.vals, g_host)[0])
        with VirtualDevices() as vd:
            dev = rows.to("cuda:0")
            pending = device_draws(dev, g_dev, extra=[dev.max(-1).values])
        assert vd.counts["engine"] == 1
        assert pending.extra == rows.max(-1).values.tolist()
        assert pending.commit(i, g_dev) == want
        assert torch.equal(g_dev.get_state(), g_host.get_state())
    g = torch.Generator().manual_seed(5)
    with VirtualDevices():
        device_draws(rows.to("cuda:0"), g).cancel(g)
    assert torch.equal(g.get_state(), torch.Generator().manual_seed(5).get_state())


def _nucleus(kind: str, dtype, seed: int, size: int) -> torch.Tensor:
    """A row with ``size`` nonzero entries (a warped row's nucleus), renormalised."""
    p = _row(kind, dtype, seed).clamp_min(0)
    g = torch.Generator().manual_seed(seed + 7)
    keep = torch.zeros(V, dtype=torch.bool)
    keep[torch.randperm(V, generator=g)[:size]] = True
    p = torch.where(keep, p, torch.zeros_like(p))
    return p / p.sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [200, 256, 257, 1500, V - 10])
def test_a_support_past_the_bound_is_drawn_on_the_device(size, dtype):
    """Top-p alone (``bound`` = the 255-entry hint): a support of at most 256 entries crosses in
    the first read and is drawn on the host; a longer one is drawn on the device with exactly
    its size's exponentials (``read_supports``, ``device_sample(length=...)``). Either way the
    host draw's token and generator state, and no read longer than the first."""
    from mtad.core.warping import TOP_P_HINT

    for seed in range(12):
        p = _nucleus("full", dtype, seed, size)
        g_host = torch.Generator().manual_seed(seed)
        s = as_support(p)
        want = int(draw(s.ids, s.vals, g_host)[0])
        g_dev = torch.Generator().manual_seed(seed)
        with VirtualDevices() as vd:
            got = sample(p.to("cuda:0"), g_dev, TOP_P_HINT)
        assert got == want, (size, dtype, seed)
        assert torch.equal(g_dev.get_state(), g_host.get_state()), "the stream moved differently"
        assert vd.largest_read <= 2 * (TOP_P_HINT + 1) + 1, vd.largest_read
        long = size > TOP_P_HINT + 1
        assert vd.counts["engine"] == 1 + long, "the first read, and the draw's where it is long"
        assert vd.counts["pinned_engine"] == long, "the exponentials: only for a long support"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [200, 256, 257, 1500, V - 10])
def test_a_support_size_read_before_spares_the_hint_read(size, dtype):
    """``sample(..., size=n)`` (a verification read the row's support size with its scalars:
    ``support_sizes``): a long support is drawn on the device at once, a short one crosses in
    its hint as without ``size``; the host draw's token and generator state either way, and a
    long one costs one read, not two."""
    from mtad.core.sampling import support_sizes
    from mtad.core.warping import TOP_P_HINT

    for seed in range(12):
        p = _nucleus("full", dtype, seed, size)
        assert int(support_sizes(p)) == size
        g_host = torch.Generator().manual_seed(seed)
        s = as_support(p)
        want = int(draw(s.ids, s.vals, g_host)[0])
        g_dev = torch.Generator().manual_seed(seed)
        with VirtualDevices() as vd:
            got = sample(p.to("cuda:0"), g_dev, TOP_P_HINT, size=size)
        assert got == want, (size, dtype, seed)
        assert torch.equal(g_dev.get_state(), g_host.get_state()), "the stream moved differently"
        long = size > TOP_P_HINT + 1
        assert vd.counts["engine"] == 1, "one read: the hint (short) or the draw (long)"
        assert vd.counts["pinned_engine"] == long, "the exponentials: only for a long support"
        if long:
            assert vd.largest_read == 2, "only the token and the support's size cross"


def test_a_length_shorter_than_a_support_is_refused():
    """A caller's ``length`` below a support's size would draw with too few exponentials: refused,
    the generator left as it was."""
    from mtad.core.sampling import device_draws, device_multinomial
    from mtad.propose.tree import device_level_draws

    p = _nucleus("full", torch.float64, 0, 300)
    g = torch.Generator().manual_seed(3)
    before = g.get_state()
    with VirtualDevices():
        row = p.to("cuda:0")
        with pytest.raises(ValueError, match="length 100 is shorter"):
            device_draws(row[None], g, length=100)
        with pytest.raises(ValueError, match="length 100 is shorter"):
            device_multinomial(row, 1, False, g, length=100)
        with pytest.raises(ValueError, match="length 100 is shorter"):
            device_level_draws([row], 2, g, True, length=100)
        assert torch.equal(before, g.get_state()), "a refusal moved the generator"
        assert device_draws(row[None], g, length=300).commit(0, g) == device_sample(
            row, torch.Generator().manual_seed(3))
    assert not torch.equal(before, g.get_state())  # the committed draw moved it

"""A plain-temperature draw on an accelerator (``mtad.core.sampling.device_sample``): the
token and the generator's state of the host draw over the support, with no row read back.

Checked on the CPU under the device checker (``mtad.testing.devicecheck``): the row lives
on a virtual ``cuda:0``, so ``sample`` takes the device path, and its result is compared with
``draw`` on the host support of the same row, seed by seed."""

from __future__ import annotations

import pytest
import torch

from mtad.core.engine import Engine
from mtad.core.sampling import DENSE_MAX, as_support, device_sample, draw, sample
from mtad.core.warping import Warping
from mtad.models.tiny import tiny_causal_lm
from mtad.run.cli import load_decoder
from mtad.testing.devicecheck import VirtualDevices, virtual_pair

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


@pytest.mark.parametrize("name", ["multinomial", "spd"])
def test_plain_temperature_decoding_moves_no_whole_rows(name):
    """T=1 without top-k or top-p (every token has mass): the same tokens as the CPU run
    (float64 pair, same seed), no device-to-host copy of a row, no pageable copy in a step."""
    t = tiny_causal_lm("qwen2", vocab_size=V, dtype=torch.float64, seed=0, logit_scale=4.0)
    d = tiny_causal_lm("qwen2", vocab_size=V, hidden_size=16, num_heads=2, num_layers=1,
                       dtype=torch.float64, seed=1, logit_scale=4.0)
    w = Warping(1.0)
    assert w.support_bound is None
    ref = Engine(t, d, load_decoder(name), w).generate([3, 4, 5], 12, seed=3)
    with virtual_pair(t, d) as vd:
        out = Engine(t, d, load_decoder(name), w).generate([3, 4, 5], 12, seed=3)
    assert out.output_ids == ref.output_ids
    assert 0 < vd.largest_read < 16, vd.largest_read
    assert all(s["h2d_draft"] == s["h2d_verify"] == 0 for s in vd.steps)

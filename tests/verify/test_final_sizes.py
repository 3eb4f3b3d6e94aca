"""A verification reads the support sizes of the rows its final draw may come from with its
scalars (top-p alone on an accelerator, ``Warping.support_hinted``), so a long final support
is drawn on the device without a read of its hint first: speculative sampling's residuals and
bonus row (``mtad.verify.chain._final_sizes``), checked against the rows ``verify_chain`` draws
from, and the rule itself on virtual devices against the host run."""

from __future__ import annotations

import pytest
import torch

from mtad.core.sampling import DENSE_MAX, residual, support_sizes
from mtad.core.warping import TOP_P_HINT, Warping
from mtad.testing.devicecheck import VirtualDevices
from mtad.verify.chain import _final_sizes, verify_chain

pytestmark = pytest.mark.stack  # the checker follows torch's dispatch

V = DENSE_MAX + 904
G = 4


def _rows(seed: int, n: int, dtype) -> torch.Tensor:  # [n, V] warped rows: top-p 0.9 of random logits
    g = torch.Generator().manual_seed(seed)
    scale = [0.5, 3.0, 12.0][seed % 3]  # flat rows (nuclei of thousands), and peaked ones (a few)
    return Warping(1.0, top_p=0.9)(scale * torch.randn(n, V, dtype=dtype, generator=g)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_sizes_are_those_of_the_rows_drawn_from(dtype):
    for seed in range(6):
        p, q = _rows(seed, G + 1, dtype), _rows(100 + seed, G, dtype)
        q[1] = p[1]  # no residual mass: the rule falls back to p_1
        sizes = _final_sizes(p, q, G).tolist()
        want = [int(support_sizes(residual(p[i], q[i]))) for i in range(G)] + [int(support_sizes(p[G]))]
        assert sizes == want
        assert sizes[1] == int(support_sizes(p[1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_speculative_sampling_reads_twice_at_most_with_wide_nuclei(dtype):
    """The same acceptances, token and generator state as on the host; two reads (the masses
    with the sizes, then the final draw's: a hint or a device draw), where reading the drawn
    row's hint first made three for a long support."""
    longs = 0
    for seed in range(18):
        p, q = _rows(seed, G + 1, dtype), _rows(200 + seed, G, dtype)
        tokens = [int(torch.multinomial(q[i], 1, generator=torch.Generator().manual_seed(seed + i)))
                  for i in range(G)]
        g_host = torch.Generator().manual_seed(seed)
        want = verify_chain(tokens, p, q, g_host, TOP_P_HINT)
        g_dev = torch.Generator().manual_seed(seed)
        with VirtualDevices() as vd:
            got = verify_chain(tokens, p.to("cuda:0"), q.to("cuda:0"), g_dev, TOP_P_HINT, hinted=True)
        assert got == want, seed
        assert torch.equal(g_dev.get_state(), g_host.get_state()), "the stream moved differently"
        assert vd.counts["engine"] <= 2, (seed, dict(vd.counts))
        n = want[0]
        row = residual(p[n], q[n]) if n < G else p[G]
        longs += int(support_sizes(row)) > TOP_P_HINT + 1
    assert 0 < longs < 18, "both kinds of final row were drawn"

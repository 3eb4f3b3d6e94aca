"""The multi-draft walk over rows left on an accelerator (``mtad.verify.devicewalk``, plain
temperature) against the host walk (``mtad.verify.multidraft``) on the same rows.

Every rule, on random trees whose rows cover the whole vocabulary (as plain temperature's do),
float64 and float32: the same accepted path, the same token, the generator in the same state; at most two
reads from the device, none of them a row. Rows with zeros (underflow) and a candidate the
draft could not have drawn are covered too: their sums may differ from the host's in the last
bit (a row's zeros are summed where the host skips them), which moves a draw only at a near-tie,
so on these seeds the draws agree.
"""

from __future__ import annotations

import pytest
import torch

from mtad.core.sampling import DENSE_MAX
from mtad.testing.devicecheck import VirtualDevices
from mtad.verify.multidraft import MultiDraft

pytestmark = pytest.mark.stack  # torch.multinomial's stream and the checker's dispatch

V = DENSE_MAX + 904


def _rows(g, n, scale, zeros):
    x = torch.softmax(scale * torch.randn(n, V, generator=g, dtype=torch.float64), -1)
    if zeros:
        x[:, torch.randperm(V, generator=g)[: V // 4]] = 0
    return x


def _tree(g, rule: str, zeros: bool):
    """(parents, tokens, p, q): a tree drafted from q as the rule needs (i.i.d. children; MCSS:
    distinct siblings; SpecTr: chains under the root), p a target near q or far from it."""
    hot = torch.randperm(V, generator=g)[:6]  # a few likely tokens, so candidates repeat and merge
    parents, tokens = [-1], [0]
    if rule == "spectr":
        k, depth = 4, 3
        for _chain in range(k):
            at = 0
            for _ in range(depth):
                parents.append(at)
                tokens.append(int(hot[torch.randint(3, (1,), generator=g)]))
                at = len(tokens) - 1
    else:
        frontier = [0]
        for width in (3, 2, 2):
            new = []
            for r in frontier:
                picks = torch.randperm(6, generator=g)[:width] if rule == "mcss" else torch.randint(
                    6, (width,), generator=g)
                for t in picks.tolist():
                    parents.append(r)
                    tokens.append(int(hot[t]))
                    new.append(len(tokens) - 1)
            frontier = new
    n = len(tokens)
    q = _rows(g, n, 2.0, zeros)
    q[:, hot] += 0.5 * torch.rand(n, 6, generator=g, dtype=torch.float64)
    q /= q.sum(-1, keepdim=True)
    near = torch.rand((), generator=g) < 0.5
    p = 0.7 * q + 0.3 * _rows(g, n, 2.0, zeros) if near else _rows(g, n, 3.0, zeros)
    if zeros:  # one candidate the draft could not have drawn: skipped by every rule
        q[0, tokens[1]] = 0
    return parents, tokens, p, q


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("rule", ["specinfer", "mcss", "spectr", "mcns"])
def test_the_device_walk_is_the_host_walk(rule, zeros, dtype):
    md = MultiDraft(rule)
    outcomes = set()
    for seed in range(25):
        g = torch.Generator().manual_seed(seed)
        parents, tokens, p, q = _tree(g, rule, zeros)
        p, q = p.to(dtype), q.to(dtype)
        ref, gen = torch.Generator().manual_seed(100 + seed), torch.Generator().manual_seed(100 + seed)
        want = md.walk(parents, tokens, p, q, ref)
        with VirtualDevices() as vd:
            got = md.walk(parents, tokens, p.to("cuda:0"), q.to("cuda:1"), gen)
        assert got == want, (rule, seed)
        assert torch.equal(gen.get_state(), ref.get_state()), (rule, seed)
        assert vd.counts["engine"] <= 2, "the candidates' masses, then the correction or bonus"
        assert vd.largest_read < V, "no row crosses"
        outcomes.add(len(want[0]))
    assert len(outcomes) > 1, f"{rule}: every seed accepted {outcomes} tokens (the test would miss a branch)"


def test_spectr_rho_from_the_device_bracket_is_the_host_rho():
    """SpecTr's rho from the bracket found on the device (no read) and bisected on the host:
    the host's ``spectr_rho`` up to the last bits of two sums (masked on the device, sliced on
    the host), at k = 2..6, with and without zeros, for targets near and far from the draft."""
    from mtad.verify import devicewalk, multidraft

    inner = 0
    for seed in range(60):
        g = torch.Generator().manual_seed(seed)
        k = 2 + seed % 5
        q = _rows(g, 1, 2.0, seed % 2 == 1)[0]
        p = (0.8 * q + 0.2 * _rows(g, 1, 2.0, False)[0]) if seed % 3 else _rows(g, 1, 3.0, False)[0]
        want = multidraft.spectr_rho(p, q, k)
        cands = list(range(k))
        with VirtualDevices():
            reads, _ = devicewalk._spectr(p.to("cuda:0"), q.to("cuda:0"), cands)
            vals = torch.stack([x.reshape(()).double() for x in reads]).cpu().tolist()
        _, _, got = devicewalk._outcome(multidraft.spectr_position, vals, k, p.dtype, q.dtype)
        assert got == pytest.approx(want, rel=1e-12, abs=0), (seed, k)
        inner += 1 < want < k
    assert inner > 30, "most cases must bisect inside (1, k)"

"""Inverse-CDF draws (``mtad.core.sampling``, the scheme of plain temperature and top-p alone):
exact distributions, the float64 cumulative masses, the same draw on the host and on a
(virtual) device, and one uniform per draw whatever the support's length, counted on the
generator's stream."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch

from mtad.core import sampling
from mtad.core.sampling import (
    InverseCdf,
    Support,
    as_support,
    cdf_index,
    cdf_list_index,
    cdf_positions,
    device_draws,
    device_multinomial,
    draw,
    sample,
)
from mtad.core.warping import INVERSE_CDF, RACE, Warping
from mtad.propose.tree import _draw_level
from mtad.testing import chi_square_gof
from mtad.testing.devicecheck import VirtualDevices
from mtad.testing.streams import words_between

VOCAB = 151_936  # the Qwen pair's


def consumed(state: torch.Tensor, gen: torch.Generator) -> int:
    """32-bit numbers ``gen`` drew since ``state`` (a uniform double takes 2, an exponential 2)."""
    return words_between(state, gen.get_state())


def cdf_gen(seed: int) -> InverseCdf:
    return InverseCdf().manual_seed(seed)


def test_the_scheme_follows_the_settings():
    assert Warping(1.0).scheme == INVERSE_CDF
    assert Warping(0.7, top_p=0.9).scheme == INVERSE_CDF
    assert Warping(1.0, top_k=10, top_p=0.9).scheme == RACE  # every committed sweep's
    assert Warping(0.0).scheme == RACE
    assert Warping(1.0, draws=RACE).scheme == RACE
    assert isinstance(sampling.generator(Warping(1.0), 3), InverseCdf)
    assert not isinstance(sampling.generator(Warping(1.0, 10), 3), InverseCdf)
    with pytest.raises(ValueError, match="draws must be one of"):
        Warping(1.0, draws="gumbel")


def test_the_index_is_the_first_entry_whose_cumulative_mass_passes_the_uniform():
    m = torch.tensor([0.0, 0.1, 0.0, 0.3, 0.6, 0.0], dtype=torch.float64)
    cases = {0.0: 1, 0.05: 1, 0.1: 3, 0.39: 3, 0.4: 4, 0.99: 4, 1 - 2**-53: 4}
    for u, want in cases.items():
        j, total = cdf_index(m, torch.tensor([u], dtype=torch.float64))
        assert int(j) == want, u
        assert cdf_list_index(m.tolist(), u) == want, u
    assert float(total) == 1.0


def test_a_uniform_rounded_up_to_the_total_never_lands_past_the_last_mass():
    m = torch.tensor([1e-300, 1.0, 0.0, 0.0], dtype=torch.float64)
    assert int(cdf_index(m, torch.tensor([1 - 2**-53], dtype=torch.float64))[0]) == 1
    assert cdf_list_index(m.tolist(), 1 - 2**-53) == 1


def test_list_and_tensor_draws_are_the_same():
    g = torch.Generator().manual_seed(0)
    for i in range(200):
        n = 37 if i % 2 else 3000  # a short support (lists) and a long one (tensors)
        m = torch.rand(n, generator=g) ** 4
        m[torch.rand(n, generator=g) < 0.3] = 0
        m[0] = 0.5
        u = float(torch.rand((), dtype=torch.float64, generator=g))
        assert cdf_list_index(m.tolist(), u) == int(cdf_index(m, torch.tensor([u], dtype=torch.float64))[0])
        g1, g2 = cdf_gen(i), cdf_gen(i)
        assert cdf_positions(m, 3, False, g1) == cdf_positions(m.double()[None].expand(2, -1)[0], 3, False, g2)


def test_a_long_float32_row_is_summed_in_float64():
    """0.1 in float32, 151,936 times: a float32 running sum drifts by hundreds of entries; the
    float64 one is exact (each partial sum needs 42 significand bits), so a uniform at the middle
    of entry i draws entry i."""
    m = torch.full((VOCAB,), 0.1, dtype=torch.float32)
    for i in (0, 1000, 77_777, VOCAB - 2, VOCAB - 1):
        u = torch.tensor([(i + 0.5) / VOCAB], dtype=torch.float64)
        assert int(cdf_index(m, u)[0]) == i
    # the float32 sum is not good enough: the check above has power
    c32 = m.cumsum(0)
    assert int(torch.searchsorted(c32, c32[-1] * 0.5)) != VOCAB // 2


P = torch.tensor([0.05, 0.0, 0.3, 0.15, 0.0, 0.4, 0.1], dtype=torch.float64)


def _exact():
    return {i: float(x) for i, x in enumerate(P) if x > 0}


def test_single_draws_follow_the_distribution():
    g = cdf_gen(1)
    n = 8000
    counts = Counter(sample(P, g) for _ in range(n))
    assert chi_square_gof(counts, _exact())[1] > 1e-4
    s = as_support(P.float())
    counts = Counter(sample(s, g) for _ in range(n))
    assert chi_square_gof(counts, _exact())[1] > 1e-4


def test_draws_with_replacement_are_independent_draws():
    g = cdf_gen(2)
    counts = Counter(tuple(draw(torch.arange(7), P, g, 2, replacement=True).tolist()) for _ in range(8000))
    want = {(a, b): P[a].item() * P[b].item() for a, b in itertools.product(range(7), repeat=2) if P[a] * P[b] > 0}
    assert chi_square_gof(counts, want)[1] > 1e-4


def test_siblings_without_replacement_are_successive_draws_over_the_remainder():
    g = cdf_gen(3)
    counts = Counter(tuple(cdf_positions(P, 2, False, g)) for _ in range(8000))
    p = P.tolist()
    want = {(a, b): p[a] * p[b] / (1 - p[a]) for a, b in itertools.permutations(range(7), 2) if p[a] * p[b] > 0}
    assert chi_square_gof(counts, want)[1] > 1e-4
    assert cdf_positions(torch.tensor([0.0, 1.0, 0.0]), 3, False, g) == [1]  # no more than the support


def test_a_draw_without_mass_is_refused():
    with pytest.raises(RuntimeError, match="invalid multinomial"):
        sample(torch.zeros(9), cdf_gen(0))
    with pytest.raises(RuntimeError, match="invalid multinomial"):
        cdf_positions(torch.tensor([1.0, float("nan")]), 1, True, cdf_gen(0))


def _row(seed: int, dtype=torch.float32, vocab: int = VOCAB) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(3 * torch.randn(vocab, dtype=dtype, generator=g), -1)
    p[torch.randperm(vocab, generator=g)[: vocab // 3]] = 0
    return p


def test_one_uniform_per_draw_whatever_the_support():
    """Counted on the stream: a draw over 151,936 entries takes one uniform double (2 numbers);
    the race takes one exponential per entry (checked as the control)."""
    p = _row(0)
    s = as_support(p)
    race = torch.Generator().manual_seed(0)
    state = race.get_state()
    sample(s, race)
    assert consumed(state, race) == 2 * int((p > 0).sum())  # one exponential per support entry
    for fn, k in [(lambda g: sample(p, g), 1), (lambda g: sample(s, g), 1),
                  (lambda g: draw(s.ids, s.vals, g, 4, replacement=True), 4),
                  (lambda g: cdf_positions(s.vals, 4, False, g), 4),
                  (lambda g: _draw_level([s, s, s], 4, g, True), 12),
                  (lambda g: _draw_level([s, s], 3, g, False), 6),
                  (lambda g: device_multinomial(p, 4, False, g), 4),
                  (lambda g: device_draws(torch.stack([p, p]), g).commit(1, g), 1)]:
        g = cdf_gen(5)
        state = g.get_state()
        fn(g)
        assert consumed(state, g) == 2 * k


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_device_draws_are_the_host_draws(dtype):
    """On a (virtual) device only the uniforms cross (one pinned copy) and the indices come back:
    the same tokens and generator state as the host draws, nothing read to find a support."""
    vocab = 40_000
    for seed in range(6):
        p = _row(seed, dtype, vocab)
        s = as_support(p)
        g_host, g_dev = cdf_gen(seed), cdf_gen(seed)
        want = [sample(s, g_host), cdf_positions(p, 3, True, g_host), cdf_positions(p, 3, False, g_host),
                _draw_level([s, s], 2, g_host, False), _draw_level([s, s], 2, g_host, True)]
        with VirtualDevices() as vd:
            row = p.to("cuda:0")
            got = [sample(row, g_dev), device_multinomial(row, 3, True, g_dev)[0].tolist(),
                   device_multinomial(row, 3, False, g_dev)[0].tolist(),
                   _draw_level([row, row], 2, g_dev, False), _draw_level([row, row], 2, g_dev, True)]
        assert got == want, seed
        assert torch.equal(g_dev.get_state(), g_host.get_state())
        assert vd.counts["pinned_engine"] == 5, "each draw's uniforms: one pinned copy"
        assert vd.largest_read <= 8, "no support or row crosses back"


def test_device_pending_draws_commit_the_host_draw():
    p = torch.stack([_row(1, torch.float64, 9000), _row(2, torch.float64, 9000)])
    for i in range(2):
        g_host, g_dev = cdf_gen(i), cdf_gen(i)
        want = sample(Support(*sampling.support(p[i]), 9000), g_host)
        with VirtualDevices():
            pending = device_draws(p.to("cuda:0"), g_dev, extra=[p.to("cuda:0").max()])
            assert pending.commit(i, g_dev) == want
        assert torch.equal(g_dev.get_state(), g_host.get_state())
        g = cdf_gen(i)
        state = g.get_state()
        with VirtualDevices():
            device_draws(p.to("cuda:0"), g).cancel(g)
        assert torch.equal(g.get_state(), state)

"""``Beams``' two forms (host tensors per depth, or Python lists with tensors made on a read) give
the same reads: every tensor (values and dtypes), the best beam (``torch.argmax``'s: the first
largest, a NaN before any number), ancestries, path tokens and path cumulative log Q."""

from __future__ import annotations

import math
import random

import pytest
import torch

from mtad.core.tree import Beams


def _both(tokens, parents, cum, cdtype, weights, wdtype):
    tensors = Beams(tokens=[torch.tensor(x) for x in tokens], parents=[torch.tensor(x) for x in parents],
                    cum_logq=[torch.tensor(x, dtype=cdtype) for x in cum], weights=torch.tensor(weights, dtype=wdtype))
    host = Beams.on_host()
    for x, p, c in zip(tokens, parents, cum):
        host.add(x, p, torch.tensor(c, dtype=cdtype).tolist(), cdtype)  # values of the dtype, as the loop keeps them
    host.set_weights(torch.tensor(weights, dtype=wdtype).tolist(), wdtype)
    return tensors, host


def _history(rng: random.Random, gamma: int, width: int):
    tokens = [[rng.randrange(50) for _ in range(width)] for _ in range(gamma)]
    parents = [[-1] * width] + [[rng.randrange(width) for _ in range(width)] for _ in range(gamma - 1)]
    cum = [[-rng.random() * (t + 1) for _ in range(width)] for t in range(gamma)]
    return tokens, parents, cum


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_host_form_reads_as_the_tensor_form(dtype):
    rng = random.Random(3)
    for _ in range(30):
        gamma, width = rng.randint(1, 5), rng.randint(1, 6)
        tokens, parents, cum = _history(rng, gamma, width)
        weights = [rng.choice([0.25, 0.5, rng.random()]) for _ in range(width)]  # ties now and then
        a, b = _both(tokens, parents, cum, dtype, weights, dtype)
        assert a.gamma == b.gamma == gamma
        assert a.best() == b.best() == int(torch.argmax(torch.tensor(weights, dtype=dtype)))
        for slot in range(width):
            assert a.ancestry(slot) == b.ancestry(slot)
            assert a.path_tokens(slot) == b.path_tokens(slot)
            pa, pb = a.path_cum_logq(slot), b.path_cum_logq(slot)
            assert pa.dtype == pb.dtype == dtype and torch.equal(pa, pb)
        for name in ("tokens", "parents", "cum_logq"):
            xa, xb = getattr(a, name), getattr(b, name)
            assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(xa, xb)) and len(xa) == len(xb)
        assert a.weights.dtype == b.weights.dtype and torch.equal(a.weights, b.weights)


def test_the_best_beam_takes_a_nan_first_as_argmax_does():
    for weights in ([0.2, math.nan, 0.9, math.nan], [math.nan, 0.1], [0.3, 0.3, 0.1]):
        a, b = _both([[1] * len(weights)], [[-1] * len(weights)], [[0.0] * len(weights)], torch.float32,
                     weights, torch.float32)
        assert a.best() == b.best() == int(torch.argmax(torch.tensor(weights)))


def test_a_depth_added_after_a_read_is_read_too():
    b = Beams.on_host()
    b.add([4, 5], [-1, -1], [-1.0, -2.0], torch.float64)
    assert [x.tolist() for x in b.tokens] == [[4, 5]]
    b.add([6, 7], [1, 0], [-3.0, -2.5], torch.float64)
    assert [x.tolist() for x in b.tokens] == [[4, 5], [6, 7]] and b.gamma == 2
    assert b.path_tokens(0) == [5, 6] and b.path_cum_logq(1).tolist() == [-1.0, -2.5]

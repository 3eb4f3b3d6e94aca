"""MJGD / MTJD's beam on the CPU reads each beam row's top entries (``joint_candidates``)
instead of the ``beam_width x V`` joint vector: the same prefixes, the same block, the same
draws as the vector's path."""

from __future__ import annotations

import pytest
import torch

import mtad.decoders.mjgd as mjgd
from mtad.core.engine import Engine
from mtad.core.sampling import top_entries
from mtad.core.warping import Warping
from mtad.decoders.mjgd import MJGD, MTJD, joint_candidates
from mtad.models.tiny import tiny_causal_lm


def _rows(n, vocab, seed, ties=False):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=gen, dtype=torch.float64) * 3
    if ties:  # coarse logits: many equal values near each row's top
        logits = (logits * 2).round() / 2
    rows = logits.log_softmax(-1)
    score = -torch.rand(n, generator=gen, dtype=torch.float64) * 4
    return rows, score


def _dense_first(rows, score, k, temperature=1.0):
    """The vector's first k of a stable descending sort: (flat ids, values)."""
    joint = (score[:, None] + rows).flatten()
    if temperature != 1.0:
        joint = joint / temperature
    top, vals, _ = top_entries(joint, k)
    return top, vals, joint


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1, 11, 16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_candidates_hold_the_vectors_first_k(seed, k, temperature):
    rows, score = _rows(5, 3000, seed)
    got = joint_candidates(rows, score, k, temperature)
    assert got is not None
    ids, vals = got
    assert bool((ids[1:] > ids[:-1]).all())  # ascending flat ids
    top, tvals, joint = _dense_first(rows, score, k, temperature)
    assert torch.equal(vals, joint[ids])  # the vector's very values
    pos = torch.sort(vals, descending=True, stable=True).indices[:k]
    assert torch.equal(ids[pos], top) and torch.equal(vals[pos], tvals)


@pytest.mark.parametrize("seed", range(8))
def test_ties_are_handled_or_refused(seed):
    """Coarse rows tie at every row's m-th entry: either the first k are the vector's or None."""
    rows, score = _rows(4, 2000, seed, ties=True)
    score = torch.zeros_like(score)  # equal prefixes: ties across rows too
    for k in (1, 4, 16):
        got = joint_candidates(rows, score, k)
        top, tvals, joint = _dense_first(rows, score, k)
        if got is None:
            continue
        ids, vals = got
        pos = torch.sort(vals, descending=True, stable=True).indices[:k]
        assert torch.equal(ids[pos], top) and torch.equal(vals[pos], tvals)


def test_ties_past_a_rows_top_are_refused():
    rows = torch.full((2, 100), -5.0, dtype=torch.float64)
    rows[0, 50] = -1.0
    assert joint_candidates(rows, torch.zeros(2, dtype=torch.float64), 3) is None  # -5 runs past m
    rows[1] = torch.linspace(-10, -2, 100, dtype=torch.float64)
    rows[0] = torch.linspace(-11, -3, 100, dtype=torch.float64)
    assert joint_candidates(rows, torch.zeros(2, dtype=torch.float64), 3) is not None


def test_nan_is_refused():
    rows, score = _rows(3, 500, 0)
    rows[1, 7] = float("nan")
    assert joint_candidates(rows, score, 4) is None


def test_minus_infinity_past_the_finite_entries_is_refused():
    rows = torch.full((1, 200), float("-inf"), dtype=torch.float64)
    rows[0, :3] = torch.tensor([-0.5, -1.0, -2.0], dtype=torch.float64)
    assert joint_candidates(rows, torch.zeros(1, dtype=torch.float64), 5) is None  # k-th is -inf


def _model(vocab, seed):
    return tiny_causal_lm("qwen2", vocab_size=vocab, hidden_size=16, num_heads=2, num_layers=1,
                          dtype=torch.float64, seed=seed, logit_scale=6.0)


@pytest.mark.parametrize("cls", [MJGD, MTJD])
@pytest.mark.parametrize("warping", [Warping(0.0), Warping(1.0, top_k=10, top_p=0.9),
                                     Warping(0.7, top_k=5), Warping(1.0, top_p=0.9)])
def test_decoders_match_the_vector_path(monkeypatch, cls, warping):
    """Generations with the rows' candidates equal those with the n x V vector, seed by seed, and
    the candidates' path is the one taken (counted)."""
    target = _model(5000, 0)
    runs = [([11, 4000, 7], 2), ([5, 9], 7), ([1, 2, 3, 4], 13)]

    def gen():
        eng = Engine(target, None, cls(gamma=3, method="beam", beam_width=6), warping)
        return [eng.generate(p, 9, seed=s).output_ids for p, s in runs]

    calls = {"sparse": 0}
    real = mjgd.joint_candidates

    def counted(*a, **kw):
        out = real(*a, **kw)
        calls["sparse"] += out is not None
        return out

    monkeypatch.setattr(mjgd, "joint_candidates", counted)
    sparse = gen()
    assert calls["sparse"] > 0
    monkeypatch.setattr(mjgd, "joint_candidates", lambda *a, **kw: None)
    assert gen() == sparse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_probs_workspace_equals_a_fresh_log_softmax(dtype):
    """The CPU workspace form gives ``double().log_softmax(-1)`` bit for bit, whatever the rows
    (-inf entries, fewer or more rows than before, another vocabulary), in buffers kept across
    calls."""
    dec = MJGD(method="beam", beam_width=4)
    gen = torch.Generator().manual_seed(3)
    seen = set()
    for n, vocab in [(1, 50), (4, 50), (3, 50), (6, 50), (2, 70), (4, 70)]:
        logits = (torch.randn(n, vocab, generator=gen, dtype=torch.float64) * 5).to(dtype)
        logits[0, :7] = float("-inf")
        got = dec._log_probs(logits)
        assert got.dtype == torch.float64 and got.shape == (n, vocab)
        assert torch.equal(got, logits.double().log_softmax(-1))
        seen.add((vocab, dec._ws[1].data_ptr()))
    assert len(seen) == 3  # reallocated only for more rows than kept (6 > 4) or another vocabulary
    assert "_ws" not in dec.config_dict()

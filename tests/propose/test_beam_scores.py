"""Beam sampling's scores read on the rows' candidates (``mtad.propose.beam._sparse_select``) pick
exactly what the dense W x V scores pick (``_select``): the same entries, scores, draft
probabilities and generator state, greedy (with ties) and sampled (top-k / top-p, duplicate slots),
float32 and float64."""

from __future__ import annotations

import pytest
import torch

from mtad.core.decoder import plain_probs
from mtad.core.sampling import DENSE_MAX
from mtad.core.warping import Warping
from mtad.propose.beam import _select, _sparse_select, scoring_probs


def _dense(warping, logits, which, weights, width, replacement, seed):
    probs = scoring_probs(warping, logits)
    rows = probs if which is None else torch.stack([probs[i] for i in which])
    wide = rows.to(torch.promote_types(rows.dtype, weights.dtype))
    scores = torch.cat([wide[i] * float(w) for i, w in enumerate(weights.tolist())])
    g = torch.Generator().manual_seed(seed)
    out = _select(scores, width, warping.greedy, replacement, g, None, rows.reshape(-1))
    return out, g.get_state()


def _sparse(warping, logits, which, weights, width, replacement, seed):
    probs = plain_probs(logits) if warping.greedy else None
    g = torch.Generator().manual_seed(seed)
    out = _sparse_select(warping, logits, probs, which, weights, width, replacement, g)
    return out, g.get_state()


def _weights(n, dtype, gen):
    w = torch.rand(n, generator=gen, dtype=dtype) + 0.01
    return w / w.sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("warping", [Warping(0.0), Warping(1.0, 10, 0.9), Warping(0.7, 5, 1.0)],
                         ids=["greedy", "topk_topp", "topk"])
@pytest.mark.parametrize("replacement", [True, False])
def test_candidate_scores_select_what_the_dense_scores_select(dtype, warping, replacement):
    gen = torch.Generator().manual_seed(0)
    vocab, width = DENSE_MAX + 904, 4
    taken = 0
    for trial in range(12):
        u = 1 + trial % 4
        logits = (torch.randn(u, vocab, generator=gen, dtype=dtype) * 3)
        if trial % 3 == 1:  # ties: coarse logits (as bfloat16 ones), tied top entries
            logits = (logits * 2).round() / 2
            logits[:, :3] = logits.max()
        which = None if trial % 2 == 0 else [i % u for i in range(u + 2)]  # duplicate slots
        n = u if which is None else len(which)
        weights = _weights(n, dtype, gen)
        if trial % 4 == 3:
            weights[0] = weights[1]  # tied weights: tied scores across slots
        want, want_state = _dense(warping, logits, which, weights, width, replacement, trial)
        got, got_state = _sparse(warping, logits, which, weights, width, replacement, trial)
        if got is None:  # a declined case takes the dense path
            continue
        taken += 1
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b)
        assert torch.equal(got_state, want_state)
    assert taken >= 8  # the candidate path ran on most cases, ties included


def test_many_candidates_select_on_tensors_what_the_dense_scores_select(monkeypatch):
    import mtad.propose.beam as beam

    monkeypatch.setattr(beam, "_HOST_ENTRIES", 8)  # every case on the tensor form
    for dtype in (torch.float32, torch.float64):
        test_candidate_scores_select_what_the_dense_scores_select(dtype, Warping(1.0, 10, 0.9), True)
        test_candidate_scores_select_what_the_dense_scores_select(dtype, Warping(0.7, 5, 1.0), False)


def test_greedy_declines_when_ties_run_past_the_rows_top_entries():
    vocab = DENSE_MAX + 10
    logits = torch.zeros(2, vocab)  # every entry tied
    probs = plain_probs(logits)
    g = torch.Generator().manual_seed(0)
    assert _sparse_select(Warping(0.0), logits, probs, None, torch.tensor([0.5, 0.5]), 4, True, g) is None

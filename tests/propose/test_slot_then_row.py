"""Beam sampling's inverse-CDF draws with replacement (``mtad.propose.beam._slot_then_row``: a slot
by its weight, then a token of its warped row) follow the flattened scores ``weight_i * q_i(v)``
that the race and the flattened draws read: a goodness-of-fit test over every (slot, token)
entry, duplicate slots and a zero weight included; and what a draw reports (its flattened id, its
score, ``q`` there) is the flattened scores' own values at that entry."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from mtad.core.sampling import generator
from mtad.core.warping import Warping
from mtad.propose.beam import _slot_then_row, scoring_probs

ALPHA = 1e-4


def _flat(warping, logits, which, weights):  # [n * V] the flattened scores, [n * V] q at each entry
    probs = scoring_probs(warping, logits)
    rows = probs if which is None else torch.stack([probs[i] for i in which])
    wide = rows.to(torch.promote_types(rows.dtype, weights.dtype))
    return (wide * weights.to(wide.dtype)[:, None]).reshape(-1), rows.reshape(-1)


@pytest.mark.parametrize("warping", [Warping(1.0), Warping(1.5, top_p=0.9)], ids=["plain", "top_p"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_draws_follow_the_flattened_scores(warping, dtype):
    g = torch.Generator().manual_seed(3)
    vocab = 9
    logits = (2 * torch.randn(3, vocab, generator=g, dtype=torch.float64)).to(dtype)  # 3 distinct rows
    which = [0, 2, 2, 1]  # 4 slots: slots 1 and 2 share a row
    weights = torch.tensor([0.5, 0.3, 0.0, 0.2], dtype=dtype)  # slot 2 can never be drawn
    scores, q = _flat(warping, logits, which, weights)
    width, n = 4, 2500
    counts = torch.zeros(scores.numel())
    gen = generator(warping, 11)
    assert warping.scheme == "inverse_cdf"
    for _ in range(n):
        ids, chosen, q_chosen = _slot_then_row(warping, logits, which, weights, width, gen)
        assert chosen.dtype == scores.dtype and q_chosen.dtype == q.dtype
        assert torch.equal(chosen, scores[ids]) and torch.equal(q_chosen, q[ids])  # the entries' own values
        counts += torch.bincount(ids, minlength=scores.numel())
    expected = scores.double() / scores.double().sum() * counts.sum()
    assert counts[expected == 0].sum() == 0  # no draw where a score is 0 (the zero weight, top-p's cut)
    keep = expected > 0
    big = expected[keep] >= 5
    obs = torch.cat([counts[keep][big], counts[keep][~big].sum()[None]])
    exp = torch.cat([expected[keep][big], expected[keep][~big].sum()[None]])
    if exp[-1] < 5:  # too few entries outside the big ones: fold them in the largest cell
        obs, exp = obs[:-1].clone(), exp[:-1].clone()
    assert len(obs) >= 10
    pval = stats.chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue
    assert pval > ALPHA, f"slot-then-row draws differ from the flattened scores (p={pval:.2e})"


def test_a_planted_wrong_slot_distribution_fails_the_test(monkeypatch):
    """The same test catches slots drawn uniformly instead of by weight."""
    import mtad.propose.beam as beam

    real = beam.cdf_list_indices
    monkeypatch.setattr(beam, "cdf_list_indices", lambda w, us: real([1.0 if x > 0 else 0.0 for x in w], us))
    with pytest.raises(AssertionError, match="differ from the flattened scores"):
        test_draws_follow_the_flattened_scores(Warping(1.0), torch.float64)


def test_two_uniforms_per_draw_and_the_same_draws_for_a_seed():
    logits = torch.randn(2, 50, dtype=torch.float64)
    weights = torch.tensor([0.6, 0.4], dtype=torch.float64)
    w = Warping(1.0)
    a, b = generator(w, 5), generator(w, 5)
    first = _slot_then_row(w, logits, None, weights, 4, a)
    assert all(torch.equal(x, y) for x, y in zip(first, _slot_then_row(w, logits, None, weights, 4, b)))
    ref = generator(w, 5)
    torch.rand(8, dtype=torch.float64, generator=ref)  # 2 x 4 uniforms
    assert torch.equal(a.get_state(), ref.get_state())


def test_no_weight_is_refused_in_one_line():
    w = Warping(1.0)
    with pytest.raises(RuntimeError, match="every draft score is zero"):
        _slot_then_row(w, torch.randn(2, 9), None, torch.zeros(2), 2, generator(w, 0))


@pytest.mark.slow  # 25-35 s each; the draws themselves are tested above in the default suite
@pytest.mark.parametrize("name", ["tree_mtad", "mtad", "beam_specinfer"])
def test_each_beam_decoder_keeps_its_distribution(toy_pair, name):
    """Decoders with no closed-form output distribution (MTAD's acceptance of a sampled beam,
    tree-MTAD's over every beam): at plain temperature the slot-then-row draws (the default) and
    the race's flattened draws (``draws="race"``, the stream before them) give the same
    distribution of the first tokens (two-sample chi-square homogeneity on independent seeds)."""
    from collections import Counter

    from mtad.core.engine import Engine
    from mtad.run.cli import load_decoder
    from mtad.testing import homogeneity_test, sample_sequences

    target, draft = toy_pair
    n, prompt, length = 1500, [0, 1], 3

    def counts(draws: str | None, seed0: int) -> Counter:
        decoder = load_decoder(name, gamma=3, width=3)
        return sample_sequences(Engine(target, draft, decoder, Warping(1.0, draws=draws)), prompt, length, n,
                                seed0=seed0)

    pval = homogeneity_test(counts(None, 0), counts("race", 10_000))
    assert pval > ALPHA, f"{name}: slot-then-row draws' distribution differs from the race's (p={pval:.2e})"

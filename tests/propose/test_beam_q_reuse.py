"""The walk's draft rows on a beam tree reuse the rows the beam's draws warped (``_Fed.warped``,
``warped_rows``' ``done``): on the CPU, a row that slot-then-row draws already warped is not warped
again, and what the walk reads is that warping of those logits, bit for bit; the run's tokens are
those of a run that warps every row again."""

from __future__ import annotations

import pytest
import torch

import mtad.core.sampling
from mtad.core import tree as tree_mod
from mtad.core.engine import Engine
from mtad.core.protocols import ROOT
from mtad.core.warping import Warping
from mtad.models.tiny import tiny_causal_lm
from mtad.propose import beam as beam_mod
from mtad.run.cli import load_decoder

VOCAB = mtad.core.sampling.DENSE_MAX + 904  # past DENSE_MAX: the walk reads host supports


@pytest.fixture(scope="module")
def pair():
    t = tiny_causal_lm("qwen2", vocab_size=VOCAB, dtype=torch.float32, seed=0, logit_scale=2.0)
    d = tiny_causal_lm("qwen2", vocab_size=VOCAB, hidden_size=16, num_heads=2, num_layers=1,
                       dtype=torch.float32, seed=1, logit_scale=2.0)
    return t, d


def _run(pair, warping, seed):
    dec = load_decoder("beam_specinfer", gamma=3, width=3)
    return Engine(*pair, dec, warping, VOCAB, ()).generate([3, 4, 5], 12, seed=seed).output_ids


@pytest.mark.parametrize("warping", [Warping(1.0), Warping(0.7), Warping(1.0, top_p=0.9)],
                         ids=["plain", "t0.7", "top_p"])
def test_the_walk_reads_the_rows_the_draws_warped(pair, warping, monkeypatch):
    real = tree_mod.warped_rows
    checked = []

    def check(tree, w, root, logits, pos, stay=False, done=None):
        for c, row in (done or {}).items():  # each reused row is the warping of its own logits
            x = root if c == ROOT else logits[pos[c]]
            assert torch.equal(row, w(x)), c
            checked.append(c)
        return real(tree, w, root, logits, pos, stay=stay, done=done)

    monkeypatch.setattr(beam_mod, "warped_rows", check)
    reused = [_run(pair, warping, s) for s in range(3)]
    assert len(checked) > 3 and ROOT in checked

    monkeypatch.setattr(beam_mod, "warped_rows", lambda *a, done=None, **k: real(*a, **k))  # every row again
    assert [_run(pair, warping, s) for s in range(3)] == reused


def test_only_the_cpus_slot_then_row_draws_keep_rows(pair, monkeypatch):
    """Greedy and top-k drafting draw no rows by slot then row: nothing is kept."""
    seen = []
    real = tree_mod.warped_rows
    monkeypatch.setattr(beam_mod, "warped_rows", lambda *a, done=None, **k: seen.append(dict(done or {}))
                        or real(*a, done=done, **k))
    for w in (Warping(0.0), Warping(1.0, top_k=10)):
        _run(pair, w, 0)
    assert seen and not any(seen)

"""BiLD and greedy decoding on long rows (CPU): the blockwise argmax and the warping's candidates
give exactly the tokens and steps of the dense rows (``torch.argmax``, ``read_supports``).

At a 10,000-token vocabulary both fast paths are live: ``argmax_rows`` takes its block path
(at least ``2 * BLOCK`` blocks) and a support is no longer drawn densely (``DENSE_MAX``).
"""

from __future__ import annotations

import copy

import pytest
import torch

import mtad.decoders.autoregressive as autoregressive
import mtad.propose.chain as chain
import mtad.verify.rollback as rollback
from mtad.core.engine import Engine
from mtad.core.sampling import DENSE_MAX
from mtad.core.topk import BLOCK
from mtad.core.warping import Warping
from mtad.decoders.autoregressive import Greedy
from mtad.decoders.bild import BiLD
from mtad.models.tiny import tiny_causal_lm
from mtad.verify.score import Scores

VOCAB = 10_000
PROMPT = [5, 17, 400, 9_000]
WARPINGS = {
    "T0": Warping(0.0),
    "topk_topp": Warping(1.0, 10, 0.9),
    "topk_T07": Warping(0.7, 20),
    "topp_alone": Warping(1.0, 0, 0.9),  # no candidates: the dense path on both sides
}


@pytest.fixture(scope="module")
def long_pair():
    """A peaked target and a draft that is the target with its weights perturbed: confident
    runs, agreement and disagreement all occur."""
    target = tiny_causal_lm("qwen2", vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, seed=3,
                            logit_scale=100.0)
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for w in draft.parameters():
            w.add_(torch.randn(w.shape, generator=g) * 0.1 * w.std())
    return target, draft


def _dense(monkeypatch):
    """The dense forms: ``torch.argmax`` and no candidates."""
    first = lambda rows: rows.argmax(-1)  # noqa: E731
    for mod in (chain, rollback, autoregressive):
        monkeypatch.setattr(mod, "argmax_rows", first)
    monkeypatch.setattr(Warping, "candidates", lambda self, logits: None)
    monkeypatch.setattr(Scores, "candidates", lambda self: None)


def _run(pair, decoder, warping, seeds=range(4), n=40):
    target, draft = pair
    out = []
    for seed in seeds:
        res = Engine(target, draft, decoder, warping, VOCAB).generate(PROMPT, n, seed=seed)
        out.append((res.output_ids, [(s.drafted, s.accepted, s.emitted, s.target_passes) for s in res.steps]))
    return out


def test_the_fast_paths_are_live_at_this_vocabulary():
    assert VOCAB > DENSE_MAX and VOCAB // BLOCK >= 2 * BLOCK


@pytest.mark.parametrize("warping", list(WARPINGS))
@pytest.mark.parametrize("mode,alpha_fb,alpha_rb", [("greedy", 0.6, 2.0), ("sampling", 0.6, 2.0)])
def test_bild_long_rows_equal_the_dense_rows(long_pair, monkeypatch, warping, mode, alpha_fb, alpha_rb):
    bild = BiLD(mode=mode, alpha_fb=alpha_fb, alpha_rb=alpha_rb, max_run=4)
    calls = {"candidates": 0}
    real = chain.candidate_support

    def counted(*a, **kw):
        got = real(*a, **kw)
        calls["candidates"] += got is not None  # a row drawn from its candidates
        return got

    monkeypatch.setattr(chain, "candidate_support", counted)
    fast = _run(long_pair, bild, WARPINGS[warping])
    sparse_warping = mode == "sampling" and warping != "topp_alone"
    assert (calls["candidates"] > 0) == sparse_warping  # the candidates path ran where it applies
    with monkeypatch.context() as m:
        _dense(m)
        dense = _run(long_pair, bild, WARPINGS[warping])
    assert fast == dense
    steps = [s for _, st in fast for s in st]
    # every branch of the rule ran: a fallback (a run short of max_run; none where q is one-hot),
    # a full run, a rollback
    assert any(d < 4 and p == 1 for d, _, _, p in steps) == (mode == "greedy" or warping != "T0"), steps
    assert any(d == 4 and p == 1 for d, _, _, p in steps), steps
    assert any(p == 2 for *_, p in steps), steps


def test_greedy_decoder_long_rows_equal_torch_argmax(long_pair, monkeypatch):
    fast = _run(long_pair, Greedy(), Warping(0.0), seeds=[0])
    with monkeypatch.context() as m:
        _dense(m)
        assert _run(long_pair, Greedy(), Warping(0.0), seeds=[0]) == fast

"""Tree-MTAD: one target pass over the beam tree, ancestor references, and agreement with chain MTAD."""

from __future__ import annotations

import math

import pytest
import torch

from mtad.core.engine import Engine
from mtad.core.runner import ModelRunner
from mtad.core.tree import Beams
from mtad.core.warping import Warping
from mtad.decoders.autoregressive import Greedy
from mtad.decoders.mtad import MTAD
from mtad.decoders.tree_mtad import TreeMTAD

PROMPT = [2, 3, 4]


def _caches_equal(a: ModelRunner, b: ModelRunner) -> bool:
    if a.cached_ids != b.cached_ids:
        return False
    return all(
        torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)
        for la, lb in zip(a.cache.layers, b.cache.layers)
    )


@pytest.mark.parametrize("warping", [Warping(1.0), Warping(0.7, top_k=4), Warping(0.0)])
@pytest.mark.parametrize("tau", [0.1, 0.5, 2.0])
def test_width_one_equals_chain_mtad(toy_pair, warping, tau):
    """W = 1: same seed => same beams, same tokens and per-step records, and equal pruned caches."""
    target, draft = toy_pair
    chain = Engine(target, draft, MTAD(gamma=3, width=1, tau=tau), warping)
    tree = Engine(target, draft, TreeMTAD(gamma=3, width=1, tau=tau), warping)
    for seed in range(3):
        a, b = chain.generate(PROMPT, 14, seed=seed), tree.generate(PROMPT, 14, seed=seed)
        assert a.output_ids == b.output_ids
        assert [(s.accepted, s.emitted) for s in a.steps] == [
            (s.accepted, s.emitted) for s in b.steps
        ]
        assert _caches_equal(chain.target, tree.target)
        assert _caches_equal(chain.draft, tree.draft)


def test_tree_accepts_at_least_the_chain_on_the_same_beams(toy_pair):
    """Same seed => same beams in the first step; the best beam's path is in the tree with the
    same reference, so the tree's accepted depth is never below the chain's."""
    target, draft = toy_pair
    for tau in (0.2, 0.6):
        chain = Engine(target, draft, MTAD(gamma=4, width=4, tau=tau), Warping(1.0))
        tree = Engine(target, draft, TreeMTAD(gamma=4, width=4, tau=tau), Warping(1.0))
        for seed in range(25):
            a = chain.generate(PROMPT, 6, seed=seed).steps[0].accepted
            b = tree.generate(PROMPT, 6, seed=seed).steps[0].accepted
            assert b >= a


@pytest.mark.parametrize("compat", [False, True])
def test_gamma_one_works(toy_pair, compat):
    target, draft = toy_pair
    eng = Engine(
        target, draft, TreeMTAD(gamma=1, width=4, tau=0.5, compat_slot_index=compat), Warping(1.0)
    )
    res = eng.generate(PROMPT, 12, seed=0)
    assert len(res.output_ids) == 12
    assert all(s.emitted in (1, 2) and s.tree_size <= 4 for s in res.steps)


def test_one_target_pass_per_step(toy_pair):
    target, draft = toy_pair
    eng = Engine(target, draft, TreeMTAD(gamma=3, width=4, tau=0.5), Warping(1.0))
    res = eng.generate(PROMPT, 15, seed=1)
    assert eng.target.forward_calls == 1 + res.num_steps  # prefill + one pass per step
    assert all(s.tree_size <= 12 for s in res.steps)


class RecordingTreeMTAD(TreeMTAD):
    """Keeps every StepOutput (with its info) for inspection."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.outputs = []

    def step(self, ctx):
        out = super().step(ctx)
        self.outputs.append(out)
        return out


def test_accepted_path_passes_its_reference(toy_pair):
    """Recomputed from scratch: P(accepted path) > tau * exp(ref[a]) in every step."""
    target, draft = toy_pair
    warping = Warping(1.0)
    tau = 0.4
    dec = RecordingTreeMTAD(gamma=3, width=4, tau=tau)
    eng = Engine(target, draft, dec, warping)
    rt = ModelRunner(target, 6)
    res = eng.generate(PROMPT, 15, seed=3)
    ctx = list(PROMPT)
    for s, out in zip(res.steps, dec.outputs):
        a = s.accepted
        if a:
            toks = out.tokens[:a]
            p = warping(rt.score(ctx + toks)[len(ctx) - 1 : len(ctx) - 1 + a])
            log_p = p[torch.arange(a), torch.tensor(toks)].log().sum()
            assert log_p - out.info["ref"][a - 1] > math.log(tau) - 1e-9
            assert out.info["pass"][a - 1] and not any(out.info["pass"][a:])
        ctx += out.tokens[: s.emitted]


def test_temperature_zero_equals_greedy(toy_pair):
    target, draft = toy_pair
    ref = Engine(target, None, Greedy(), Warping(0)).generate(PROMPT, 20).output_ids
    out = Engine(target, draft, TreeMTAD(gamma=3, width=3, tau=0.5), Warping(0)).generate(
        PROMPT, 20
    )
    assert out.output_ids == ref


# ------------------------------------------------------------------ hand-built trees
def _beams() -> Beams:
    """Two beams, re-permuted at depth 2: final slot 0 descends from depth-1 slot 1."""
    return Beams(
        tokens=[torch.tensor([1, 2]), torch.tensor([3, 4])],
        parents=[torch.tensor([-1, -1]), torch.tensor([1, 0])],
        cum_logq=[torch.tensor([-1.0, -2.0]), torch.tensor([-2.5, -3.0])],
        weights=torch.tensor([0.6, 0.4]),
    )


def test_reference_follows_the_ancestry_not_the_slot():
    beams = _beams()
    assert beams.ancestry(0) == [1, 0] and beams.path_tokens(0) == [2, 3]
    assert TreeMTAD().reference(beams).tolist() == [-2.0, -2.5]
    assert TreeMTAD(compat_slot_index=True).reference(beams).tolist() == [-1.0, -2.5]


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"gamma": 0}, "gamma"),
        ({"width": -1}, "width"),
        ({"tau": 0.0}, "tau"),
        ({"compat_slot_index": 1}, "compat_slot_index"),
    ],
)
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TreeMTAD(**kwargs)

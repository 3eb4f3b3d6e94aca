"""Compositions by name (mtad.decoders.compose): beam drafts verified by SpecInfer's rule.

conf/decoder/beam_specinfer.yaml is picked up by the globbing tests too (test_lossless,
test_decoders_generic, test_devices); here: its distribution over the first 2 tokens against
the target's exact one (chi-square and total variation, float64 toy pair, many seeds), its
greedy equality at T=0, and the pairs the composition refuses.
"""

from __future__ import annotations

import pytest

from mtad.core.engine import Engine
from mtad.core.warping import Warping
from mtad.decoders.autoregressive import Greedy
from mtad.decoders.compose import Speculative
from mtad.run.cli import load_decoder
from mtad.testing import chi_square_gof, exact_joint, prefix_marginal, sample_sequences

PROMPT = [2, 3]
ALPHA = 1e-4


@pytest.mark.parametrize("warping", [Warping(1.0), pytest.param(Warping(0.8, top_k=4, top_p=0.9), marks=pytest.mark.slow)],
                         ids=["T1", "T0.8-k4-p0.9"])
def test_beam_specinfer_is_lossless_over_the_first_two_tokens(toy_pair, warping):
    target, draft = toy_pair
    dec = load_decoder("beam_specinfer", gamma=2, width=3)
    joint = prefix_marginal(exact_joint(target, PROMPT, 2, warping), 2)
    n = 3000
    counts = sample_sequences(Engine(target, draft, dec, warping), PROMPT, 2, n, seed0=11)
    _, pval, dof = chi_square_gof(counts, joint)
    assert dof >= 10 and pval > ALPHA, f"beam + SpecInfer differs from the target (p={pval:.2e})"
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in joint.items())
    assert tv < 0.08  # sampling noise at n = 3000 over <= 36 cells is about 0.04


def test_beam_specinfer_equals_greedy_at_temperature_zero(toy_pair):
    target, draft = toy_pair
    ref = Engine(target, None, Greedy(), Warping(0)).generate(PROMPT, 20).output_ids
    for width in (1, 3):
        dec = Speculative("beam", "specinfer", gamma=3, width=width)
        assert Engine(target, draft, dec, Warping(0)).generate(PROMPT, 20, seed=4).output_ids == ref


def test_beam_specinfer_drafts_several_candidates_per_depth(toy_pair):
    target, draft = toy_pair
    res = Engine(target, draft, Speculative("beam", "specinfer", gamma=3, width=4),
                 Warping(1.0)).generate(PROMPT, 16, seed=0)
    assert any(s.tree_size > s.drafted for s in res.steps)  # a tree, not a chain
    assert all(s.accepted <= s.drafted <= 3 for s in res.steps)


@pytest.mark.parametrize("proposer, verifier", [("beam", "speculative"), ("beam", "spectr"),
                                                ("chain", "specinfer"), ("beam", "mcss")])
def test_pairs_that_would_not_be_lossless_are_refused(proposer, verifier):
    with pytest.raises(ValueError, match="verifier|proposer"):
        Speculative(proposer, verifier)


def test_auto_shape_keys_on_the_pieces(toy_pair, monkeypatch, tmp_path):
    monkeypatch.setenv("MTAD_COST_PRIOR", str(tmp_path / "none.json"))
    dec = Speculative("beam", "specinfer", gamma="auto", width="auto")
    assert dec._auto.kind == "tree_mtad"  # beam drafts, a target pass over the tree
    target, draft = toy_pair
    res = Engine(target, draft, dec, Warping(1.0)).generate(PROMPT, 8, seed=0)
    assert all(s.shape is not None for s in res.steps[:-1])
    assert len(res.output_ids) == 8

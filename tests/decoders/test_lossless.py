"""Every lossless decoder under conf/decoder/ reproduces the warped target joint over whole
sequences (chi-square on a toy model), found by globbing the decoder configs. A known-lossy
decoder (keep the longest of k independent SpD checks) is rejected by the same test."""

import pytest
import torch

from mtad.core.decoder import Decoder, StepContext, StepOutput
from mtad.core.engine import Engine
from mtad.core.warping import Warping
from mtad.propose.tree import draft_chains
from mtad.run.cli import group_options, load_decoder
from mtad.testing import chi_square_gof, exact_joint, sample_sequences
from mtad.verify.chain import verify_chain
from mtad.verify.score import score

PROMPT = [2, 3]
LENGTH = 3
ALPHA = 1e-4
WARPINGS = {"T1": Warping(1.0), "T0.8-k4-p0.9": Warping(0.8, top_k=4, top_p=0.9)}


def _decoder(name):
    return load_decoder(name, gamma=2, width=2)


LOSSLESS = [n for n in group_options("decoder")
            if getattr(_decoder(n), "lossless", True) and getattr(_decoder(n), "stochastic", True)]


class LongestOfKSpD(Decoder):
    """Lossy on purpose: k chains, each checked by SpD independently; keep the longest acceptance."""

    name = "longest_of_k_spd"

    def __init__(self, k=3, gamma=2):
        super().__init__()
        self.k, self.gamma = k, gamma

    def step(self, ctx: StepContext) -> StepOutput:
        tree = draft_chains(ctx, self.k, self.gamma)
        p = score(ctx, tree).rows()
        best = None
        for c in range(self.k):
            rows = [1 + c + self.k * d for d in range(self.gamma)]
            toks = [tree.tokens[r] for r in rows]
            prow = torch.stack([p[0].dense()] + [p[r].dense() for r in rows])  # host supports -> [V]
            qrow = torch.stack([tree.q[0].dense()] + [tree.q[r].dense() for r in rows[:-1]])
            n, y = verify_chain(toks, prow, qrow, ctx.generator)
            if best is None or n > best[0]:
                best = (n, toks[:n] + [y])
        return StepOutput(tokens=best[1], drafted=self.gamma, accepted=best[0], tree_size=tree.size)


def _pvalue(toy_pair, decoder, warping, n):
    target, draft = toy_pair
    joint = exact_joint(target, PROMPT, LENGTH, warping)
    counts = sample_sequences(Engine(target, draft, decoder, warping), PROMPT, LENGTH, n, seed0=123)
    stat, pval, dof = chi_square_gof(counts, joint)
    assert dof >= 10, "too few cells: the test would have little power"
    return pval


@pytest.mark.stack
@pytest.mark.parametrize("name", LOSSLESS)
def test_lossless_fast(toy_pair, name):
    pval = _pvalue(toy_pair, _decoder(name), WARPINGS["T0.8-k4-p0.9"], 1500)
    assert pval > ALPHA, f"{name}: output differs from the warped target joint (p={pval:.2e})"


@pytest.mark.stack
def test_lossy_control_rejected_fast(toy_pair):
    assert _pvalue(toy_pair, LongestOfKSpD(), WARPINGS["T0.8-k4-p0.9"], 1500) < ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("warping", list(WARPINGS), ids=list(WARPINGS))
@pytest.mark.parametrize("name", LOSSLESS)
def test_lossless_slow(toy_pair, name, warping):
    pval = _pvalue(toy_pair, _decoder(name), WARPINGS[warping], 8000)
    assert pval > ALPHA, f"{name}: output differs from the warped target joint (p={pval:.2e})"


@pytest.mark.slow
@pytest.mark.parametrize("warping", list(WARPINGS), ids=list(WARPINGS))
def test_lossy_control_rejected_slow(toy_pair, warping):
    assert _pvalue(toy_pair, LongestOfKSpD(), WARPINGS[warping], 8000) < ALPHA

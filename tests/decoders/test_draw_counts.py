"""Every decoder's draws at plain temperature and top-p alone take O(1) random numbers each,
however long the vocabulary: counted on the one generator's stream, step by step, on a
32,000-token pair (a draw by the exponential race there takes 64,000 numbers: one exponential,
two 32-bit numbers, per entry; an inverse-CDF draw takes one uniform double, two)."""

from __future__ import annotations

import pytest
import torch

from mtad.core.engine import Engine
from mtad.core.warping import Warping
from mtad.models.tiny import tiny_causal_lm
from mtad.run.cli import group_options, load_decoder
from mtad.testing import unsupported_by
from mtad.testing.streams import words_between

VOCAB = 32_000
#: 32-bit numbers a step may take: 200 uniform doubles (the largest trees here draw ~40 children
#: and a few outcome draws; one race draw over the vocabulary would take 64,000)
PER_STEP = 400
WARPINGS = {"plain": Warping(1.0), "top-p": Warping(1.0, top_p=0.9)}


class Counted:
    """A decoder whose steps record the random numbers they take."""

    def __init__(self, dec):
        self.dec, self.counts = dec, []

    def __getattr__(self, name):
        return getattr(self.dec, name)

    def step(self, ctx):
        state = ctx.generator.get_state()
        out = self.dec.step(ctx)
        self.counts.append(words_between(state, ctx.generator.get_state()))
        return out


@pytest.fixture(scope="module")
def pair():
    t = tiny_causal_lm("qwen2", vocab_size=VOCAB, hidden_size=16, num_heads=2, num_layers=1,
                       dtype=torch.float32, seed=0, logit_scale=4.0)
    d = tiny_causal_lm("qwen2", vocab_size=VOCAB, hidden_size=16, num_heads=2, num_layers=1,
                       dtype=torch.float32, seed=1, logit_scale=4.0)
    return t, d


@pytest.mark.parametrize("setting", list(WARPINGS))
@pytest.mark.parametrize("name", group_options("decoder"))
def test_a_step_takes_random_numbers_in_proportion_to_its_draws_not_the_vocabulary(pair, name, setting):
    if why := unsupported_by(load_decoder(name), WARPINGS[setting]):
        pytest.skip(why)
    dec = Counted(load_decoder(name))
    Engine(*pair, dec, WARPINGS[setting]).generate([3, 4, 5], 8, seed=1)
    assert dec.counts and max(dec.counts) <= PER_STEP, (
        f"{name} at {setting}: a step took more than {PER_STEP} random numbers ({dec.counts})")

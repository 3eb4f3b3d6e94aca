"""Greedy match (``mtad.verify.greedy``): hand-built argmaxes with exact expected tokens, equality
with greedy decoding on the float64 tiny pair whatever the draft, and the refusal of any other
temperature in one line (by the engine, from the verifier's ``sampling`` declaration)."""

from __future__ import annotations

import pytest
import torch

from mtad.core.engine import Engine
from mtad.core.warping import Warping
from mtad.decoders.autoregressive import Greedy
from mtad.decoders.compose import Speculative
from mtad.testing import tiny_pair
from mtad.verify.greedy import greedy_match_length


@pytest.mark.parametrize("draft, best, expected", [
    ([5, 7, 9], [5, 7, 2, 4], (2, 2)),  # the first mismatch: the target's argmax there
    ([5, 7, 9], [5, 7, 9, 4], (3, 4)),  # all accepted: the bonus
    ([5, 7, 9], [1, 7, 9, 4], (0, 1)),  # a later match after a mismatch does not count
    ([6], [6, 0], (1, 0)),
])
def test_hand_built_argmaxes(draft, best, expected):
    assert greedy_match_length(torch.tensor(draft), torch.tensor(best)) == expected


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_equal_to_greedy_decoding_with_any_draft(gamma):
    target, draft = tiny_pair()
    ref = Engine(target, None, Greedy(), Warping(0)).generate([3, 4, 5], 40).output_ids
    for d in (draft, target):
        res = Engine(target, d, Speculative("chain", "greedy_match", gamma=gamma), Warping(0)).generate(
            [3, 4, 5], 40, seed=1)
        assert res.output_ids == ref
        if d is target:  # the target's own argmaxes: every drafted token accepted
            assert all(s.accepted == s.drafted for s in res.steps)


@pytest.mark.parametrize("warping", [Warping(1.0), Warping(0.5, top_k=10), Warping(1.0, top_p=0.9)])
def test_refuses_any_other_temperature_in_one_line(warping):
    target, draft = tiny_pair()
    with pytest.raises(ValueError) as e:
        Engine(target, draft, Speculative("chain", "greedy_match"), warping)
    assert str(e.value) == (
        f"decoder 'speculative': verifier 'greedy_match' supports temperature 0 only (it accepts a draft token "
        f"iff it is the target's argmax), got temperature={warping.temperature:g}; set temperature=0")

"""Every decoder under conf/decoder/ runs through the engine (found by globbing: no test edits
needed for a new decoder), at the sampling settings its pieces support (another setting is
skipped with the reason). Lossless decoders equal target greedy at temperature 0, with the tiny
draft (which the target rejects almost always) and with the target's own weights as the draft
(every draft token is the target's argmax: acceptance is exercised)."""

import gc
from collections import Counter

import pytest

from mtad.core.engine import Engine
from mtad.core.warping import Warping
from mtad.decoders.autoregressive import Greedy
from mtad.run.cli import group_options, load_decoder
from mtad.testing import tiny_pair, unsupported_by


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


def _decoder(name, **over):
    return load_decoder(name, **over)


@pytest.mark.parametrize("name", group_options("decoder"))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_decoder_runs_and_records_are_consistent(pair, name, temperature):
    target, draft = pair
    dec, w = _decoder(name), Warping(temperature, top_k=10, top_p=0.9)
    if why := unsupported_by(dec, w):
        pytest.skip(why)
    res = Engine(target, draft, dec, w).generate([3, 4, 5], 24, seed=1)
    assert len(res.output_ids) == 24
    assert all(0 <= t < 40 for t in res.output_ids)
    assert sum(s.emitted for s in res.steps) == 24
    for s in res.steps:
        assert 1 <= s.emitted and 0 <= s.accepted <= s.emitted and s.accepted <= s.drafted


WARPINGS = {"greedy": Warping(0.0), "top-k+top-p": Warping(1.0, top_k=10, top_p=0.9),
            "top-p alone": Warping(1.0, top_p=0.9), "plain T": Warping(0.7)}


@pytest.mark.parametrize("name", group_options("decoder"))
@pytest.mark.parametrize("mode", list(WARPINGS))
def test_a_generation_leaves_no_reference_cycles(pair, name, mode):
    """Everything a step makes is freed by reference counting when the step ends: a reference
    cycle (a token tree holding rows that hold the tree) keeps the step's logits alive until the
    garbage collector runs, so memory churns through fresh pages (on the CPU, page faults at
    every step at 151,936 tokens)."""
    target, draft = pair
    dec, w = _decoder(name), WARPINGS[mode]
    if why := unsupported_by(dec, w):
        pytest.skip(why)
    Engine(target, draft, dec, w).generate([3, 4, 5], 4, seed=1)  # warm-up: lazy imports, caches
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        Engine(target, draft, dec, w).generate([3, 4, 5], 16, seed=1)
        gc.collect()
        kinds = Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not kinds, f"{name} at {mode}: objects freed only by the garbage collector: {dict(kinds)}"


# MTAD-family, BiLD and typical acceptance are lossy by design: they are not expected to equal greedy.
LOSSLESS = [n for n in group_options("decoder") if getattr(_decoder(n), "lossless", True)]


#: Mean draft tokens accepted per step (of the steps that drafted) that a decoder with a draft must
#: reach when its draft is the target itself at temperature 0 (every draft token is the target's
#: argmax; gamma = 4: the shipped lossless decoders accept 2.75 to 4).
AGREEING_ACCEPTANCE = 2.0


@pytest.mark.parametrize("name", LOSSLESS)
@pytest.mark.parametrize("draft_kind", ["tiny draft", "target as draft"])
def test_lossless_decoders_equal_greedy_at_temperature_zero(pair, name, draft_kind):
    """Equal to greedy decoding; with the target as its own draft, acceptance happens (the tiny
    draft is rejected almost always, so it checks the corrections, not the rule's acceptance)."""
    target, draft = pair
    draft = target if draft_kind == "target as draft" else draft
    dec = _decoder(name)
    if why := unsupported_by(dec, Warping(0)):
        pytest.skip(why)
    ref = Engine(target, None, Greedy(), Warping(0)).generate([3, 4, 5], 30).output_ids
    res = Engine(target, draft, dec, Warping(0)).generate([3, 4, 5], 30, seed=2)
    assert res.output_ids == ref
    if draft_kind == "target as draft" and getattr(dec, "uses_draft", True):
        drafting = [s for s in res.steps if s.drafted]
        if not drafting:  # e.g. a confidence-stopped run whose threshold is above the tiny model's probabilities
            pytest.skip(f"{name} drafted no token with the target as its draft: equal to greedy, acceptance "
                        "not exercised on this pair")
        mean = sum(s.accepted for s in drafting) / len(drafting)
        assert mean > AGREEING_ACCEPTANCE, f"{name}: {mean:.2f} draft tokens accepted per drafting step"


@pytest.mark.parametrize("name", ["specinfer", "tree_mtad"])
def test_engine_takes_runner_objects(pair, name):
    """Runner objects (mtad.core.protocols.TreeRunner) are used as given, models are wrapped:
    the same seeded output either way; ``stop_after`` ends after the step reaching it."""
    from mtad.core.runner import ModelRunner

    target, draft = pair
    w = Warping(1.0, top_k=10, top_p=0.9)
    ref = Engine(target, draft, _decoder(name), w).generate([3, 4, 5], 20, seed=3)
    eng = Engine(ModelRunner(target), ModelRunner(draft), _decoder(name), w)
    assert isinstance(eng.target, ModelRunner)
    assert eng.generate([3, 4, 5], 20, seed=3).output_ids == ref.output_ids
    short = eng.generate([3, 4, 5], 20, seed=3, stop_after=5)
    assert short.stop_reason == "stop_after" and 5 <= len(short.output_ids) < 20
    assert short.output_ids == ref.output_ids[: len(short.output_ids)]
    with pytest.raises(TypeError, match="TreeRunner"):
        Engine(object(), None, Greedy(), w)

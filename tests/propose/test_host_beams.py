"""Beam sampling's bookkeeping on the host (``mtad.propose.beam.HOST_BEAMS``: ``_HostBeams`` and
``_slot_then_row_host``) gives the tensor form's beams bit for bit: the same tokens, parents,
cumulative log Q and weights (values and dtypes) at every depth of every step, the same generator
state, and so the same run; a planted rounding or search that is off by one unit fails it."""

from __future__ import annotations

import pytest
import torch

import mtad.core.sampling
from mtad.core import hostfloat
from mtad.core.engine import Engine
from mtad.core.sampling import generator
from mtad.core.warping import Warping
from mtad.models.tiny import tiny_causal_lm
from mtad.propose import beam as beam_mod
from mtad.run.cli import load_decoder

VOCAB = mtad.core.sampling.DENSE_MAX + 904  # past DENSE_MAX: the sparse and slot-then-row paths run
_BEAM_SAMPLE = beam_mod._beam_sample
pytestmark = pytest.mark.stack  # the host's arithmetic against the installed torch's kernels


def _pair(dtype):
    t = tiny_causal_lm("qwen2", vocab_size=VOCAB, dtype=dtype, seed=0, logit_scale=2.0)
    d = tiny_causal_lm("qwen2", vocab_size=VOCAB, hidden_size=16, num_heads=2, num_layers=1,
                       dtype=dtype, seed=1, logit_scale=2.0)
    return t, d


@pytest.fixture(scope="module")
def pairs():
    return {torch.float32: _pair(torch.float32), torch.float64: _pair(torch.float64)}


def _runs(pair, name, warping, width, monkeypatch, host):
    """Every step's beams (as tuples of tensors) and the outputs, for seeds 0..2."""
    monkeypatch.setattr(beam_mod, "HOST_BEAMS", host)
    seen = []
    real = _BEAM_SAMPLE

    def spy(ctx, gamma, width, replacement):
        tree = real(ctx, gamma, width, replacement)
        b = tree.beams
        seen.append((list(b.tokens), list(b.parents), list(b.cum_logq), b.weights, list(tree.tokens),
                     list(tree.parents)))
        return tree

    monkeypatch.setattr(beam_mod, "_beam_sample", spy)
    dec = load_decoder(name, gamma=3, width=width)
    outs = [Engine(*pair, dec, warping, VOCAB, ()).generate([3, 4, 5], 10, seed=s).output_ids for s in range(3)]
    return seen, outs


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _check(pair, name, warping, width, monkeypatch):
    host, host_out = _runs(pair, name, warping, width, monkeypatch, True)
    ref, ref_out = _runs(pair, name, warping, width, monkeypatch, False)
    assert host_out == ref_out
    assert len(host) == len(ref) > 3
    for h, r in zip(host, ref):
        for field in range(3):  # tokens, parents, cumulative log Q: per depth
            assert len(h[field]) == len(r[field])
            assert all(_same(x, y) for x, y in zip(h[field], r[field])), (field, h[field], r[field])
        assert _same(h[3], r[3]), (h[3], r[3])  # the final weights
        assert h[4:] == r[4:]  # the token tree


WARPINGS = [Warping(1.0), Warping(0.7), Warping(1.0, top_p=0.9), Warping(1.0, top_k=10), Warping(0.0)]
IDS = ["plain", "t0.7", "top_p", "top_k10", "greedy"]


@pytest.mark.parametrize("warping", WARPINGS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_host_beams_are_the_tensor_forms(pairs, warping, dtype, monkeypatch):
    _check(pairs[dtype], "tree_mtad", warping, 4, monkeypatch)


@pytest.mark.parametrize("name,width", [("mtad", 1), ("mtad", 6), ("beam_specinfer", 3)])
@pytest.mark.parametrize("warping", [WARPINGS[0], WARPINGS[2], WARPINGS[4]], ids=["plain", "top_p", "greedy"])
def test_host_beams_other_decoders_and_widths(pairs, name, width, warping, monkeypatch):
    _check(pairs[torch.float32], name, warping, width, monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("which", [None, [0, 2, 2, 1, 0]], ids=["own_rows", "shared_rows"])
def test_slot_then_row_host_draws_are_slot_then_rows(dtype, which):
    """The host draws against ``_slot_then_row`` on the same rows and seeds: slots, tokens, ``q``
    there and the generator's state."""
    g = torch.Generator().manual_seed(7)
    n = 3 if which is not None else 5
    w = Warping(1.0)
    for trial in range(40):
        logits = (3 * torch.randn(n, 2000, generator=g, dtype=torch.float64)).to(dtype)
        slots = len(which) if which is not None else n
        weights = torch.rand(slots, generator=g, dtype=dtype)
        a, b = generator(w, trial), generator(w, trial)
        ids, _, q_t = beam_mod._slot_then_row(w, logits, which, weights, 5, a)
        got = beam_mod._slot_then_row_host(w, logits, which, weights.tolist(), 5, b)
        assert [s * 2000 + t for s, t in zip(got.slots, got.tokens)] == ids.tolist()
        assert got.q == q_t.tolist() and got.dtype == q_t.dtype
        assert torch.equal(a.get_state(), b.get_state())


def test_the_host_draws_refuse_no_weight_in_one_line():
    w = Warping(1.0)
    with pytest.raises(RuntimeError, match="every draft score is zero"):
        beam_mod._slot_then_row_host(w, torch.randn(2, 9), None, [0.0, 0.0], 2, generator(w, 0))


def test_a_planted_rounding_fails(pairs, monkeypatch):
    """Weights left in double precision (not rounded to float32) differ in their last bits."""
    real = hostfloat.rounding
    monkeypatch.setattr(hostfloat, "rounding", lambda dt: (lambda x: x, lambda xs: xs) if dt == torch.float32
                        else real(dt))
    with pytest.raises(AssertionError):
        _check(pairs[torch.float32], "tree_mtad", WARPINGS[0], 4, monkeypatch)


def test_a_planted_search_fails(pairs, monkeypatch):
    """A draw's token one entry to the left of the search's moves the run."""
    real_host = beam_mod._slot_then_row_host

    def planted(warping, logits, which, w, width, gen, warped=None, owner=None):
        pick = real_host(warping, logits, which, w, width, gen, warped, owner)
        return pick._replace(tokens=[max(t - 1, 0) if i == 0 else t for i, t in enumerate(pick.tokens)])

    monkeypatch.setattr(beam_mod, "_slot_then_row_host", planted)
    with pytest.raises(AssertionError):
        _check(pairs[torch.float32], "tree_mtad", WARPINGS[0], 4, monkeypatch)


def test_slot_then_row_host_by_blocks_is_slot_then_row(monkeypatch):
    """Where ``cdf_blocks.SITES`` searches a beam's rows by blocks (off by default), the host draws
    search them so too, in the picked rows' order (a run of rows drawn out of order included)."""
    from mtad.core import cdf_blocks

    monkeypatch.setattr(cdf_blocks, "SITES", {**cdf_blocks.SITES, "rows": True})
    calls = []
    monkeypatch.setattr(cdf_blocks.Blocks, "_row", lambda self, *a, _f=cdf_blocks.Blocks._row: calls.append(1)
                        or _f(self, *a))
    g = torch.Generator().manual_seed(11)
    w = Warping(1.0)
    n = cdf_blocks.MIN_LENGTH + 17
    for trial in range(6):
        logits = 3 * torch.randn(3, n, generator=g)
        weights = torch.rand(3, generator=g)
        a, b = generator(w, trial), generator(w, trial)
        ids, _, q_t = beam_mod._slot_then_row(w, logits, None, weights, 4, a)
        got = beam_mod._slot_then_row_host(w, logits, None, weights.tolist(), 4, b)
        assert [s * n + t for s, t in zip(got.slots, got.tokens)] == ids.tolist()
        assert got.q == q_t.tolist() and torch.equal(a.get_state(), b.get_state())
    assert calls  # the blocks searched


def test_the_host_loop_keeps_the_rows_it_warps_for_the_walk(pairs, monkeypatch):
    """The host loop hands the walk's q the very rows its draws warped (``REUSE_DRAWN_ROWS``),
    under each row's canonical tree row: a beam SpecInfer run reads them, and its tokens are the
    run's without them (``tests/propose/test_beam_q_reuse.py`` checks the values)."""
    seen = []
    real = beam_mod._lazy_q

    def spy(tree, warping, root, fed, stay=False):
        seen.append((dict(fed.warped), list(tree.canon)))
        return real(tree, warping, root, fed, stay)

    monkeypatch.setattr(beam_mod, "_lazy_q", spy)
    dec = load_decoder("beam_specinfer", gamma=3, width=3)
    out = Engine(*pairs[torch.float32], dec, Warping(1.0), VOCAB, ()).generate([3, 4, 5], 8, seed=1).output_ids
    assert seen and all(warped and all(canon[r] == r for r in warped if r) for warped, canon in seen)
    monkeypatch.setattr(beam_mod, "REUSE_DRAWN_ROWS", False)
    again = Engine(*pairs[torch.float32], dec, Warping(1.0), VOCAB, ()).generate([3, 4, 5], 8, seed=1).output_ids
    assert again == out

"""KV-cache bookkeeping of ``ModelRunner``: prefill, steps, rollback, ``score``.

Every check compares with a fresh no-cache computation, for Qwen2, Llama, OPT and
GPT-2 with eager and sdpa attention in float64. Tolerance 1e-9, except 1e-6 for the
stock eager kernels of Qwen2, Llama and OPT, whose softmax runs in float32 whatever
the model dtype (see tests/core/test_tree_attention.py, which proves those exact too).
"""

from __future__ import annotations

import functools
import random

import pytest
import torch

from mtad.core.engine import Engine
from mtad.core.runner import ROOT, ModelRunner
from mtad.core.warping import Warping
from mtad.decoders.spd import SpD
from mtad.models.tiny import ARCHS, tiny_causal_lm

pytestmark = pytest.mark.stack  # depends on transformers' cache API (make test-stack)

V = 64
CONFIGS = [(a, k) for a in ARCHS for k in ("eager", "sdpa")]
ids_of = [f"{a}-{k}" for a, k in CONFIGS]


def tol(arch: str, impl: str) -> float:
    return 1e-6 if (impl == "eager" and arch != "gpt2") else 1e-9


@functools.cache
def model(arch: str, impl: str, seed: int = 0, hidden: int = 32, logit_scale: float = 1.0):
    return tiny_causal_lm(arch, vocab_size=V, hidden_size=hidden, seed=seed, dtype=torch.float64,
                          attn_implementation=impl, logit_scale=logit_scale)


@torch.no_grad()
def sequential(m, ids) -> torch.Tensor:
    return m(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max()) if a.numel() else 0.0


def assert_cache_is_fresh_prefill(m, runner: ModelRunner, ids, t: float) -> None:
    """The runner caches exactly ``ids[:-1]``, with a fresh prefill's keys and values."""
    fresh = ModelRunner(m)
    fresh.prefill(ids)
    assert runner.cached_ids == list(ids[:-1]) == fresh.cached_ids
    assert runner.cache.get_seq_length() == len(ids) - 1
    if len(ids) > 1:
        for a, b in zip(runner.cache.layers, fresh.cache.layers, strict=True):
            assert max_diff(a.keys, b.keys) <= t
            assert max_diff(a.values, b.values) <= t


@pytest.mark.parametrize(("arch", "impl"), CONFIGS, ids=ids_of)
def test_prefill_then_steps_match_no_cache(arch, impl):
    m, t = model(arch, impl), tol(arch, impl)
    rng = random.Random(f"{arch}{impl}")
    runner = ModelRunner(m)
    for prompt_len in (1, 9):
        committed = [rng.randrange(2, V) for _ in range(prompt_len)]
        runner.prefill(committed)
        assert runner.cached_ids == committed[:-1]
        for i in range(6):  # autoregressive steps: root logits only
            runner.begin(committed)
            if i % 3 == 1:  # a step that feeds nothing: 3 pending rows in the next one
                committed = committed + [rng.randrange(2, V), rng.randrange(2, V)]
            else:
                assert max_diff(runner.root_logits, sequential(m, committed)[-1]) <= t
                committed = committed + [rng.randrange(2, V)]
            runner.end(committed)
        assert_cache_is_fresh_prefill(m, runner, committed, t)
        assert max_diff(runner.score(committed), sequential(m, committed)) <= 1e-12


@pytest.mark.parametrize("accepted", [0, 2, 5])
@pytest.mark.parametrize(("arch", "impl"), CONFIGS, ids=ids_of)
def test_rollback_after_partly_rejected_chain(arch, impl, accepted):
    """An SpD step by hand: draft a chain token by token, verify it in one target pass,
    keep ``accepted`` draft tokens plus a correction (or bonus) token."""
    target, draft = model(arch, impl), model(arch, impl, seed=1, hidden=16)
    t = tol(arch, impl)
    rng = random.Random(f"{arch}{impl}{accepted}")
    tr, dr = ModelRunner(target, name="target"), ModelRunner(draft, name="draft")
    committed = [rng.randrange(2, V) for _ in range(6)]
    tr.prefill(committed)
    dr.prefill(committed)
    gamma = 5
    for _ in range(3):
        for r in (tr, dr):
            r.begin(committed)
        chain, logits = [], dr.root_logits
        for i in range(gamma):
            chain.append(int(logits.argmax()))
            if i < gamma - 1:
                logits = dr.forward([chain[-1]], [i])[0]
        p = tr.forward(chain, list(range(gamma)))
        ref = sequential(target, committed + chain)
        assert max_diff(torch.cat([tr.root_logits[None], p]), ref[len(committed) - 1 :]) <= t
        if accepted < gamma:  # rejected at ``accepted``: a correction token != the draft's
            fix = rng.choice([x for x in range(2, V) if x != chain[accepted]])
        else:
            fix = rng.randrange(2, V)  # all accepted: a bonus token from p
        committed = committed + chain[:accepted] + [fix]
        for r, m in ((tr, target), (dr, draft)):
            r.end(committed)
            # the draft never fed its last chain token: when all are accepted it stays pending
            lag = 1 if (r is dr and accepted == gamma) else 0
            assert_cache_is_fresh_prefill(m, r, committed[: len(committed) - lag], t)
            r.begin(committed)
            assert max_diff(r.root_logits, sequential(m, committed)[-1]) <= t


@pytest.mark.parametrize(("arch", "impl"), CONFIGS, ids=ids_of)
def test_pending_tokens_and_tree_in_one_call(arch, impl):
    """Tokens committed but never fed (several pending rows) plus tree nodes in one call."""
    m, t = model(arch, impl), tol(arch, impl)
    rng = random.Random(f"{arch}{impl}pending")
    runner = ModelRunner(m)
    committed = [rng.randrange(2, V) for _ in range(5)]
    runner.prefill(committed)
    runner.begin(committed)
    runner.forward([7, 8], [ROOT, 1])
    committed = committed + [9, 10, 11, 12]  # diverges at once from the fed nodes
    runner.end(committed)
    assert runner.cached_ids == committed[:5]
    runner.begin(committed)  # 4 pending rows: old endpoint + 3 tokens never fed
    tokens, parents = [20, 21, 22, 23, 24], [ROOT, 1, ROOT, 3, 1]
    got = runner.forward(tokens, parents)
    base = len(committed) - 1
    for node, path in enumerate([[0], [0, 1], [2], [2, 3], [0, 4]]):
        ref = sequential(m, committed + [tokens[n] for n in path])
        assert max_diff(got[node], ref[base + len(path)]) <= t
        assert max_diff(runner.root_logits, ref[base]) <= t
    committed = committed + [20, 24, 30]
    runner.end(committed)
    assert_cache_is_fresh_prefill(m, runner, committed, t)


@pytest.mark.parametrize(("arch", "impl"), [("llama", "sdpa"), ("opt", "eager"), ("gpt2", "sdpa")])
def test_begin_with_diverged_sequence_crops_to_common_prefix(arch, impl):
    m, t = model(arch, impl), tol(arch, impl)
    runner = ModelRunner(m)
    a = [3, 4, 5, 6, 7, 8, 9]
    runner.prefill(a)
    runner.begin(a)
    runner.forward([10, 11], [ROOT, 1])
    runner.end(a + [10, 11, 12])
    b = a[:3] + [40, 41]  # shares only 3 tokens with the cache
    runner.begin(b)
    assert runner.cached_ids == a[:3]
    got = runner.forward([50], [ROOT])
    ref = sequential(m, b + [50])
    assert max_diff(runner.root_logits, ref[-2]) <= t
    assert max_diff(got[0], ref[-1]) <= t
    b = b + [50, 51]
    runner.end(b)
    assert_cache_is_fresh_prefill(m, runner, b, t)
    runner.begin(a[:4])  # a shorter sequence that the cache extends past
    assert runner.cached_ids == a[:3]
    assert max_diff(runner.root_logits, sequential(m, a[:4])[-1]) <= t
    runner.forward([60, 61], [ROOT, 1])
    runner.end(a[:4])  # nothing new committed (and the endpoint itself not): roll back
    assert_cache_is_fresh_prefill(m, runner, a[:4], t)


@pytest.mark.parametrize(("arch", "impl"), [("qwen2", "sdpa"), ("gpt2", "eager")])
def test_end_without_forward_and_vocab_cut(arch, impl):
    m, t = model(arch, impl), tol(arch, impl)
    runner = ModelRunner(m, vocab_size=50)
    ids = [5, 6, 7, 8]
    runner.prefill(ids)
    runner.begin(ids)
    runner.end(ids + [9])  # nothing fed: the cache is still a prefix
    assert runner.cached_ids == ids[:-1]
    runner.begin(ids + [9])  # two pending rows
    got = runner.forward([11, 12], [ROOT, ROOT])
    assert got.shape == (2, 50) and runner.root_logits.shape == (50,)
    ref = sequential(m, ids + [9, 11])[:, :50]
    assert max_diff(runner.root_logits, ref[-2]) <= t
    assert max_diff(got[0], ref[-1]) <= t
    assert max_diff(runner.score(ids), sequential(m, ids)[:, :50]) <= 1e-12
    assert runner.forward([], []).shape == (0, 50)


def test_forward_validation_leaves_state_unchanged():
    runner = ModelRunner(model("llama", "sdpa"))
    with pytest.raises(RuntimeError, match="begin"):
        runner.forward([3], [ROOT])
    runner.prefill([3, 4, 5])
    runner.begin([3, 4, 5])
    runner.forward([6], [ROOT])
    with pytest.raises(ValueError, match="parent 5"):
        runner.forward([7, 8], [0, 5])
    with pytest.raises(ValueError, match="same length"):
        runner.forward([7], [0, 0])
    assert runner.num_nodes == 1 and runner.cache.get_seq_length() == 4
    out = runner.forward([7, 8], [1, 2])  # parents may be nodes of the same call
    assert out.shape == (2, V) and runner.depth(3) == 3 and runner.depth(ROOT) == 0
    runner.end([3, 4, 5, 6, 7, 8, 9])
    assert runner.cached_ids == [3, 4, 5, 6, 7, 8]
    with pytest.raises(RuntimeError, match="begin"):
        runner.forward([3], [ROOT])


@pytest.mark.parametrize("arch", ARCHS)
def test_engine_spd_leaves_exact_caches(arch):
    """Through the engine (SpD, sampled, rejections happen): after generation each
    runner's cache is a fresh prefill of what it caches, and the next step is exact."""
    target = model(arch, "sdpa", logit_scale=20.0)
    draft = model(arch, "sdpa", seed=1, hidden=16, logit_scale=20.0)
    engine = Engine(target, draft, SpD(gamma=4), Warping(temperature=1.0))
    prompt = [3, 14, 15, 9, 26]
    res = engine.generate(prompt, 16, seed=3)
    assert len(res.output_ids) == 16
    assert any(s.accepted < s.drafted for s in res.steps)  # some drafts were rejected
    committed = prompt + res.output_ids
    for r, m in ((engine.target, target), (engine.draft, draft)):
        n = len(r.cached_ids)
        assert r.cached_ids == committed[:n] and n < len(committed)
        assert_cache_is_fresh_prefill(m, r, r.cached_ids + [committed[n]], 1e-9)
        r.begin(committed)
        assert max_diff(r.root_logits, sequential(m, committed)[-1]) <= 1e-9


# ------------------------------------------------ per-step cost independent of the context
class _Moved(torch.overrides.TorchFunctionMode):
    """Bytes torch calls write: new tensors (not views of an argument) and in-place writes."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name == "__setitem__" and isinstance(args[2], torch.Tensor):
            self.bytes += args[2].nbytes
        elif isinstance(out, torch.Tensor) and name not in ("__get__",):
            ins = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            if out.untyped_storage().data_ptr() not in ins:
                self.bytes += out.nbytes
        return out


class _Reads(list):
    """A committed sequence that counts the elements read from it."""

    reads = 0

    def __getitem__(self, i):
        got = super().__getitem__(i)
        _Reads.reads += len(got) if isinstance(i, slice) else 1
        return got

    def __iter__(self):
        _Reads.reads += len(self)
        return super().__iter__()

    def __add__(self, other):
        return _Reads(list(self) + list(other))


def _step_cost(n_ctx: int) -> tuple[int, int, int]:
    """(bytes written, committed elements read) by begin + end around a tree step whose
    accepted path is not a prefix of the fed nodes, and the bytes of one cached position."""
    m = tiny_causal_lm("qwen2", vocab_size=V, seed=3, max_positions=4096)
    runner = ModelRunner(m)
    rng = random.Random(n_ctx)
    committed = _Reads(rng.randrange(2, V) for _ in range(n_ctx))
    runner.prefill(committed)
    runner.begin(committed)
    runner.forward([10, 11, 12, 13], [ROOT, ROOT, 2, 3])  # two branches; the second is kept
    committed = committed + [11, 12, 13, 20]
    runner.end(committed)
    moved = _Moved()
    after = committed + [31, 32, 40]  # (the test's own concatenation is not counted)
    _Reads.reads = 0
    with moved:
        runner.begin(committed)
        runner.forward([30, 31, 32], [ROOT, ROOT, 2])
        moved.bytes = 0  # the pass itself is not begin/end's cost
        runner.end(after)
        runner.begin(after)
    reads, committed = _Reads.reads, after
    per_pos = sum(t.nbytes // t.shape[-2] for layer in runner.cache.layers for t in (layer.keys, layer.values))
    assert runner.cached_ids == list(committed[:-1])
    return moved.bytes, reads, per_pos


def test_begin_end_cost_does_not_grow_with_the_context():
    """Bytes moved by the cache compaction and tokens read by begin/end: the same at 128
    and 2,048 tokens of context; the compaction moves the kept path's entries only."""
    short, long_ = _step_cost(128), _step_cost(2048)
    assert short[:2] == long_[:2], (short, long_)
    bytes_moved, _, per_pos = short
    # the kept path (2 positions) is gathered and written back: 2 copies; plus its index
    assert 0 < bytes_moved <= 2 * 2 * per_pos + 64, (bytes_moved, per_pos)


def test_end_compaction_keeps_the_path_exactly():
    """A kept branch that is not a prefix of node order: the cache equals a fresh prefill."""
    m = model("qwen2", "sdpa")
    runner = ModelRunner(m)
    committed = [5, 6, 7, 8]
    runner.prefill(committed)
    runner.begin(committed)
    runner.forward([10, 11, 12, 13, 14], [ROOT, ROOT, 2, 1, 3])
    committed = committed + [11, 12, 14, 9]
    runner.end(committed)
    assert_cache_is_fresh_prefill(m, runner, committed, 1e-9)

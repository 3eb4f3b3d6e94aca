"""Tree attention of ``ModelRunner`` is exact for every architecture our configs use.

For Qwen2, Llama, OPT and GPT-2, with eager and sdpa attention, in float64:

* every node of a random token tree (a single node, chains, bushy trees; fed in one
  ``forward`` call or over several calls as beam drafting does; after prompts of
  several lengths and after earlier steps, so the cache holds committed tokens)
  gets the logits of a plain no-cache causal pass over prompt + path-to-node, and
  ``root_logits`` are that pass's endpoint logits;
* ``end(committed)`` leaves exactly the cache a fresh prefill of ``committed[:-1]``
  would build (every layer's keys and values), for an empty path, a prefix of node
  order (crop), a path that is not one (``index_select``) and a path that continues
  under the second of two equal siblings; the following step is exact again;
* kernels that ignore 4-D masks, sliding-window caches and models without
  ``position_ids`` are refused at construction.

Tolerance: 1e-9. The stock eager kernels of Qwen2, Llama and OPT take the softmax in
float32 whatever the model dtype (GPT-2's does not), which alone moves logits by
~1e-8; the ``exact_eager`` fixture swaps in the same kernel with the softmax in the
model dtype, and ``test_stock_eager_kernels`` checks the stock ones at 1e-6. Real
mask or position mistakes move these logits by > 1e-3 (``test_reference_has_power``).
"""

from __future__ import annotations

import functools
import random

import pytest
import torch
from transformers.models.llama import modeling_llama
from transformers.models.opt import modeling_opt
from transformers.models.qwen2 import modeling_qwen2

import mtad.core.runner as runner_mod
from mtad.core.runner import ROOT, ModelRunner
from mtad.models.tiny import ARCHS, tiny_causal_lm

pytestmark = pytest.mark.stack  # depends on transformers' masks and cache API (make test-stack)

V = 64
TOL = 1e-9
CONFIGS = [(a, k) for a in ARCHS for k in ("eager", "sdpa")]
ids_of = [f"{a}-{k}" for a, k in CONFIGS]


@functools.cache
def model(arch: str, impl: str):
    return tiny_causal_lm(arch, vocab_size=V, dtype=torch.float64, attn_implementation=impl)


def _eager_softmax_in_dtype(module, query, key, value, attention_mask, scaling=None,
                            dropout=0.0, **kwargs):
    """The stock eager kernel, but with the softmax in the model dtype (not float32)."""
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


@pytest.fixture
def exact_eager(monkeypatch):
    for mod in (modeling_llama, modeling_qwen2, modeling_opt):
        monkeypatch.setattr(mod, "eager_attention_forward", _eager_softmax_in_dtype)


@torch.no_grad()
def sequential(m, ids) -> torch.Tensor:
    """Logits of a plain causal pass without a cache: [len(ids), V]."""
    return m(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max()) if a.numel() else 0.0


def random_tree(rng: random.Random, n: int, kind: str) -> tuple[list[int], list[int]]:
    """``n`` nodes (rows 1..n) in insertion order: tokens[i] and parents[i] are row i + 1's
    token and parent row; some siblings share a token (independent drafts)."""
    if kind == "chain":
        parents = list(range(n))
    else:
        parents = [rng.randrange(0, i + 1) for i in range(n)]
    tokens = []
    for i, p in enumerate(parents):
        sib = [j for j in range(i) if parents[j] == p]
        tokens.append(tokens[rng.choice(sib)] if sib and rng.random() < 0.3 else rng.randrange(2, V))
    return tokens, parents


def root_path(parents: list[int], node: int) -> list[int]:
    """Rows from the root's child down to ``node`` (a row)."""
    path = []
    while node != ROOT:
        path.append(node)
        node = parents[node - 1]
    return path[::-1]


def feed(runner: ModelRunner, tokens, parents, rng: random.Random, incremental: bool):
    """All nodes in one call, or root logits first then random chunks in node order."""
    if not incremental:
        return runner.forward(tokens, parents)
    runner.root_logits  # noqa: B018 (drafting reads the root distribution first)
    out, i = [], 0
    while i < len(tokens):
        k = rng.randint(1, 5)
        out.append(runner.forward(tokens[i : i + k], parents[i : i + k]))
        i += k
    return torch.cat(out)


def check_tree(m, committed, tokens, parents, got, root, tol=TOL) -> None:
    """Each node's logits (and the root's) against one no-cache pass per leaf path."""
    assert got.shape == (len(tokens), V)
    has_child = set(parents)
    base = len(committed) - 1
    seen = set()
    rows = range(1, len(tokens) + 1)
    for leaf in [r for r in rows if r not in has_child] or [None]:
        path = [] if leaf is None else root_path(parents, leaf)
        ref = sequential(m, committed + [tokens[r - 1] for r in path])
        assert max_diff(root, ref[base]) <= tol, "root logits"
        for d, node in enumerate(path, start=1):
            err = max_diff(got[node - 1], ref[base + d])
            assert err <= tol, f"row {node} (depth {d}): max |diff| {err:.3g}"
            seen.add(node)
    assert seen == set(rows)


def commit_through(rng, committed, tokens, parents, node) -> list[int]:
    """committed + root-to-row path + one extra token that no child of the row carries."""
    path = root_path(parents, node)
    taken = {tokens[c] for c, p in enumerate(parents) if p == node}
    extra = rng.choice([t for t in range(2, V) if t not in taken])
    return committed + [tokens[r - 1] for r in path] + [extra]


def assert_cache_is_fresh_prefill(m, runner: ModelRunner, committed, tol=TOL) -> None:
    fresh = ModelRunner(m)
    fresh.prefill(committed)
    assert runner.cached_ids == committed[:-1] == fresh.cached_ids
    assert runner.cache.get_seq_length() == len(committed) - 1
    for i, (a, b) in enumerate(zip(runner.cache.layers, fresh.cache.layers, strict=True)):
        if len(committed) == 1:
            continue  # nothing cached by a prefill of one token
        for what in ("keys", "values"):
            err = max_diff(getattr(a, what), getattr(b, what))
            assert err <= tol, f"layer {i} {what}: max |diff| {err:.3g}"


# ------------------------------------------------------------------------ logits
STEPS = [(1, "tree"), (6, "chain"), (9, "tree"), (24, "tree")]


@pytest.mark.parametrize("incremental", [False, True], ids=["one-call", "incremental"])
@pytest.mark.parametrize(("arch", "impl"), CONFIGS, ids=ids_of)
def test_tree_logits_match_sequential(arch, impl, incremental, exact_eager):
    m = model(arch, impl)
    rng = random.Random(f"{arch}{impl}{incremental}")
    runner = ModelRunner(m)
    for prompt_len in (1, 2, 11):
        committed = [rng.randrange(2, V) for _ in range(prompt_len)]
        runner.prefill(committed)
        for n, kind in STEPS:  # later steps run with earlier steps' tokens cached
            runner.begin(committed)
            tokens, parents = random_tree(rng, n, kind)
            got = feed(runner, tokens, parents, rng, incremental)
            check_tree(m, committed, tokens, parents, got, runner.root_logits)
            committed = commit_through(rng, committed, tokens, parents, rng.randrange(0, n + 1))
            runner.end(committed)
        assert_cache_is_fresh_prefill(m, runner, committed)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "opt"])
def test_stock_eager_kernels(arch):
    """Unpatched eager kernels (float32 softmax): exact up to float32 softmax rounding."""
    m = model(arch, "eager")
    rng = random.Random(arch)
    runner = ModelRunner(m)
    committed = [rng.randrange(2, V) for _ in range(7)]
    runner.prefill(committed)
    for n, kind in STEPS:
        runner.begin(committed)
        tokens, parents = random_tree(rng, n, kind)
        got = feed(runner, tokens, parents, rng, incremental=n > 6)
        check_tree(m, committed, tokens, parents, got, runner.root_logits, tol=1e-6)
        committed = commit_through(rng, committed, tokens, parents, rng.randrange(0, n + 1))
        runner.end(committed)
    assert_cache_is_fresh_prefill(m, runner, committed, tol=1e-6)


# ------------------------------------------------------------------- end / cache
# (tokens, parent rows, row whose root path gets committed, expected cache route)
A, B, C, D, E = 10, 11, 12, 13, 14
END_CASES = {
    "empty": ([A, B, C], [ROOT, 1, ROOT], ROOT, "crop"),
    "no-nodes": ([], [], ROOT, "crop"),
    "prefix": ([A, B, C, D], [ROOT, 1, 2, ROOT], 3, "crop"),
    "gather": ([A, B, C, D, E], [ROOT, ROOT, 2, 1, 3], 5, "index_select"),
    "gather-deep": ([A, B, C, D, E, A], [ROOT, 1, 1, 3, 4, 2], 5, "index_select"),
    "equal-siblings": ([A, A, B], [ROOT, ROOT, 2], 3, "index_select"),
}


@pytest.mark.parametrize("case", list(END_CASES))
@pytest.mark.parametrize(("arch", "impl"), CONFIGS, ids=ids_of)
def test_end_keeps_committed_path(arch, impl, case, exact_eager, monkeypatch):
    m = model(arch, impl)
    rng = random.Random(f"{arch}{impl}{case}")
    routes = []
    keep = runner_mod.keep_cache_positions
    monkeypatch.setattr(
        runner_mod, "keep_cache_positions",
        lambda cache, k, **kw: (routes.append("crop" if isinstance(k, int) else "index_select"),
                                keep(cache, k, **kw))[1],
    )
    runner = ModelRunner(m)
    committed = [rng.randrange(2, V) for _ in range(5)]
    runner.prefill(committed)
    runner.begin(committed)  # an earlier step, so the cache holds emitted tokens too
    tokens, parents = random_tree(rng, 5, "tree")
    runner.forward(tokens, parents)
    committed = commit_through(rng, committed, tokens, parents, 5)
    runner.end(committed)

    tokens, parents, node, route = END_CASES[case]
    runner.begin(committed)
    got = feed(runner, tokens, parents, rng, incremental=case == "gather-deep")
    check_tree(m, committed, tokens, parents, got, runner.root_logits)
    committed = commit_through(rng, committed, tokens, parents, node)
    routes.clear()
    runner.end(committed)
    assert routes == [route]
    assert_cache_is_fresh_prefill(m, runner, committed)

    runner.begin(committed)  # and the next step computes on the rolled-back cache
    tokens, parents = random_tree(rng, 8, "tree")
    got = runner.forward(tokens, parents)
    check_tree(m, committed, tokens, parents, got, runner.root_logits)


# ----------------------------------------------------------------- refusals
@pytest.mark.parametrize("impl", ["flash_attention_2", "flash_attention_3", "flex_attention"])
def test_mask_ignoring_kernels_refused(impl):
    m = tiny_causal_lm("llama", vocab_size=V)
    m.config._attn_implementation = impl
    with pytest.raises(ValueError, match=f"attn_implementation='{impl}'.*'sdpa' or 'eager'"):
        ModelRunner(m)


def test_sliding_window_cache_refused():
    m = tiny_causal_lm("qwen2", vocab_size=V)
    m.config.sliding_window = 4
    m.config.layer_types = ["sliding_attention", "full_attention"]
    with pytest.raises(ValueError, match="DynamicSlidingWindowLayer"):
        ModelRunner(m)


def test_model_without_position_ids_refused():
    inner = tiny_causal_lm("gpt2", vocab_size=V)

    class NoPositions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, input_ids=None, attention_mask=None, cache=None, **kwargs):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, cache=cache)

    with pytest.raises(ValueError, match="position_ids"):
        ModelRunner(NoPositions())


# ------------------------------------------------------------------- power
@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_reference_has_power(arch):
    """The mistakes tree attention could make move logits far beyond the tolerances."""
    m = model(arch, "sdpa")
    ids = [5, 17, 33, 41, 8, 9, 30]
    right = sequential(m, ids)[-1]
    leaked = sequential(m, ids[:-1] + [20, ids[-1]])[-1]  # a sibling left visible
    pos = torch.arange(len(ids))[None].clone()
    pos[0, -1] += 1  # a node one position off (wrong depth)
    shifted = m(input_ids=torch.tensor([ids]), position_ids=pos).logits[0, -1]
    assert max_diff(right, leaked) > 1e-3
    assert max_diff(right, shifted) > 1e-4

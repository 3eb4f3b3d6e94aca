"""CPU linear kernels: exact kernels match F.linear, int8 runs and stays close."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtad.models.kernels import (
    EXACT_KERNELS,
    KERNELS,
    KernelLinear,
    apply_cpu_kernel,
    check_kernel,
    kernel_of,
    set_kernel,
)
from mtad.models.tiny import tiny_causal_lm

VOCAB = 97


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (1, n), generator=g)


@torch.no_grad()
def _logits_with_cache(model, prefix: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """Logits of a prefill then of a multi-token step on the cache (the speculative pattern)."""
    out = model(prefix, use_cache=True)
    step_out = model(step, past_key_values=out.past_key_values, use_cache=True)
    return torch.cat([out.logits, step_out.logits], dim=1)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "opt", "gpt2"])
@pytest.mark.parametrize("kind", EXACT_KERNELS)
@pytest.mark.parametrize("max_rows", [4, 64])
def test_exact_kernels_match_default(arch, kind, max_rows):
    ref = tiny_causal_lm(arch, vocab_size=VOCAB, hidden_size=48, seed=1)
    model = tiny_causal_lm(arch, vocab_size=VOCAB, hidden_size=48, seed=1)
    apply_cpu_kernel(model, kind, max_rows=max_rows)
    assert kernel_of(model) == kind
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(m, KernelLinear) for m in linears)
    assert isinstance(model.get_output_embeddings(), KernelLinear)
    # 1-token, k-token (k <= max_rows and k > max_rows) passes on a 12-token cache
    for k in (1, 5, 9):
        prefix, step = _ids(12, seed=k), _ids(k, seed=100 + k)
        a = _logits_with_cache(ref, prefix, step)
        b = _logits_with_cache(model, prefix, step)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_wxt_leaves_other_dtypes_on_f_linear():
    ref = tiny_causal_lm("qwen2", vocab_size=VOCAB, dtype=torch.bfloat16, seed=2)
    model = tiny_causal_lm("qwen2", vocab_size=VOCAB, dtype=torch.bfloat16, seed=2)
    apply_cpu_kernel(model, "wxt")
    x = _ids(7)
    with torch.no_grad():
        assert torch.equal(model(x).logits, ref(x).logits)


def test_wxt_output_is_contiguous_and_keeps_bias():
    lin = nn.Linear(16, 24, bias=True)
    ref = nn.Linear(16, 24, bias=True)
    ref.load_state_dict(lin.state_dict())
    lin.__class__ = KernelLinear
    lin.kernel = "wxt"
    x = torch.randn(2, 3, 16)
    y = lin(x)
    assert y.is_contiguous() and y.shape == (2, 3, 24)
    torch.testing.assert_close(y, ref(x))
    y.view(2, 3, 4, 6)  # what attention projections do with their output


@pytest.mark.parametrize("arch", ["qwen2", "opt"])
@pytest.mark.parametrize("kind", ["int8", "int8-body", "int8w"])
def test_int8_runs_and_stays_close(arch, kind):
    ref = tiny_causal_lm(arch, vocab_size=VOCAB, hidden_size=64, seed=3)
    model = tiny_causal_lm(arch, vocab_size=VOCAB, hidden_size=64, seed=3)
    apply_cpu_kernel(model, kind)
    prefix, step = _ids(10), _ids(4, seed=9)
    a = _logits_with_cache(ref, prefix, step)
    b = _logits_with_cache(model, prefix, step)
    assert b.shape == a.shape and torch.isfinite(b).all()
    rel = (b - a).abs().max() / a.abs().max()
    assert rel < 0.1, f"int8 logits too far from float: {rel:.3f}"
    head = model.get_output_embeddings()
    assert head.kernel == ("wxt" if kind == "int8-body" else kind)
    body = [m for m in model.modules() if isinstance(m, KernelLinear) and m is not head]
    assert body and all(m.kernel == kind.removesuffix("-body") for m in body)
    # float weights of int8 linears are freed, shapes kept
    assert all(m.weight.device.type == "meta" for m in body)
    assert head.weight.shape[0] == VOCAB


@pytest.mark.parametrize("kind", ["int8", "int8w"])
def test_int8_on_bfloat16_model_returns_bfloat16(kind):
    model = tiny_causal_lm("qwen2", vocab_size=VOCAB, dtype=torch.bfloat16, seed=4)
    apply_cpu_kernel(model, kind)
    with torch.no_grad():
        logits = model(_ids(5)).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_switching_kernels_on_kept_weights():
    ref = tiny_causal_lm("qwen2", vocab_size=VOCAB, seed=5)
    model = tiny_causal_lm("qwen2", vocab_size=VOCAB, seed=5)
    x = _ids(6)
    apply_cpu_kernel(model, "int8", keep_float=True)
    with torch.no_grad():
        q = model(x).logits
        set_kernel(model, "wxt")
        torch.testing.assert_close(model(x).logits, ref(x).logits, rtol=1e-5, atol=1e-5)
        set_kernel(model, "int8")
        assert torch.equal(model(x).logits, q)
        set_kernel(model, "int8w")
        w = model(x).logits
        assert not torch.equal(w, q)
        set_kernel(model, "default")
        torch.testing.assert_close(model(x).logits, ref(x).logits, rtol=1e-5, atol=1e-5)


def test_freed_weights_cannot_go_back_to_float_kernels():
    model = tiny_causal_lm("qwen2", vocab_size=VOCAB, seed=6)
    apply_cpu_kernel(model, "int8")
    with pytest.raises(RuntimeError, match="reload the model"):
        set_kernel(model, "wxt")
    with pytest.raises(RuntimeError, match="reload the model"):
        set_kernel(model, "int8w")


def test_int8w_is_closer_than_dynamic_int8():
    ref = tiny_causal_lm("qwen2", vocab_size=VOCAB, hidden_size=64, seed=7)
    x = _ids(16)
    errs = {}
    for kind in ("int8", "int8w"):
        model = tiny_causal_lm("qwen2", vocab_size=VOCAB, hidden_size=64, seed=7)
        apply_cpu_kernel(model, kind)
        with torch.no_grad():
            errs[kind] = (model(x).logits - ref(x).logits).abs().max().item()
    assert errs["int8w"] < errs["int8"]


def test_unknown_kernel_names_field_and_choices():
    model = tiny_causal_lm("qwen2", vocab_size=VOCAB)
    with pytest.raises(ValueError) as err:
        apply_cpu_kernel(model, "fast")
    msg = str(err.value)
    assert "`kernel`" in msg and "'fast'" in msg
    assert all(k in msg for k in KERNELS)
    assert check_kernel("wxt") == "wxt"


def test_cpu_flags_and_bf16_probe():
    from mtad.core.machine import NATIVE_BF16_FLAGS
    from mtad.models.kernels import cpu_flags, has_native_bf16

    flags = cpu_flags()
    assert isinstance(flags, set)
    assert {"avx512_bf16", "amx_bf16"} <= set(NATIVE_BF16_FLAGS)
    assert has_native_bf16() == bool(flags & set(NATIVE_BF16_FLAGS))

"""CPU matmul kernels for the linear layers of a causal LM.

Speculative and joint decoding pay off only when a k-token target pass costs about
as much as a 1-token pass. :func:`apply_cpu_kernel` turns every ``nn.Linear`` of a
model (the output head included) into a :class:`KernelLinear`, a subclass whose
``forward`` picks the kernel:

``default``
    ``F.linear`` (``x @ W.T``), i.e. the model as it was.
``wxt``
    float32 only: ``(W @ x.T).T`` when the input has at most ``max_rows`` rows
    (:data:`WXT_MAX_ROWS`), else ``F.linear``; a single row is duplicated first,
    because the BLAS matrix-vector path runs on one thread while the 2-column
    matrix product uses all of them. Same maths through other BLAS calls, equal to
    ``default`` up to float rounding; other dtypes use ``F.linear``.
``int8``
    dynamic int8 quantization (fbgemm ``quantized::linear_dynamic``, the kernel
    behind ``torch.ao.quantization.quantize_dynamic``): weights int8 symmetric per
    output channel, activations quantized per call. Inputs of other dtypes are cast
    to float32 and the output back. Not exact: ``bench/pass_cost.py --accuracy``
    measures the logit error.
``int8-body``
    ``int8`` for every linear except the output head, which keeps its float weight
    (``wxt``): the logits stay closer to the float model's.
``int8w``
    weight-only int8 (``aten._weight_int8pack_mm``): weights int8 symmetric per
    output channel, activations rounded to bfloat16 (not quantized), accumulation
    in float, output cast back to the input dtype. Not exact, but much closer to
    the float model than ``int8`` (activation quantization is what costs ``int8``
    most of its accuracy).

Measured with ``bench/pass_cost.py`` on a 2-core AMD EPYC with AVX-512 and native
bfloat16 (``avx512_bf16``), 2 threads, 300-token cache: the float32 target costs
306 ms per 1-token pass and 582-637 ms for 2-8 tokens with ``default``, 185-569 ms
with ``wxt``; in bfloat16 it costs 137-160 ms for any k in 1..8; ``int8w`` brings
the draft to 28-35 ms for k <= 4. Without native bfloat16 (AVX2 only) bfloat16
matmuls are emulated and much slower: ``mtad.models.cpu_choice`` measures which dtype
the default pair uses.

The swap is in place (the module keeps its parameters; for the int8 kernels the
float weights are freed unless ``keep_float=True``). :func:`set_kernel` switches an
already converted model between the kernels it still has weights for — the
benchmark uses it to interleave kernels on one copy of the weights.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from mtad.core.machine import NATIVE_BF16_FLAGS, cpu_flags  # noqa: F401  (cpu_flags: bench/pass_cost.py)

KERNELS = ("default", "wxt", "int8", "int8-body", "int8w")
EXACT_KERNELS = ("default", "wxt")
INT8_KERNELS = ("int8", "int8-body", "int8w")

# Largest row count (tokens in the pass) for which `wxt` uses (W @ x.T).T in float32;
# above it F.linear. Measured with `bench/pass_cost.py --micro` (target shapes, weights
# streamed from memory, 2 threads): (W @ x.T).T is 2-4x faster at 2-4 rows, a little
# faster up to 64 and even or slower from 128 on.
WXT_MAX_ROWS = 64


def has_native_bf16() -> bool:
    """Whether the CPU has bfloat16 instructions (AVX-512 BF16, AMX, Arm BF16), by its flags.

    The default pair decides by measuring instead (``mtad.models.cpu_choice``)."""
    return bool(cpu_flags() & set(NATIVE_BF16_FLAGS))


def check_kernel(kind: str) -> str:
    """``kind`` if it names a kernel, else a ValueError naming the config field."""
    if kind not in KERNELS:
        raise ValueError(
            f"unknown kernel {kind!r} (config field `kernel`); valid choices: {', '.join(KERNELS)}"
        )
    return kind


def _quantized_engine() -> None:
    engines = torch.backends.quantized.supported_engines
    if "fbgemm" in engines:
        torch.backends.quantized.engine = "fbgemm"
    elif "x86" in engines:
        torch.backends.quantized.engine = "x86"


def pack_int8(weight: torch.Tensor, bias: torch.Tensor | None):
    """fbgemm-packed int8 weight (symmetric, per output channel) with float32 bias."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1).clamp_min(1e-12) / 127.0).double()
    zero_points = torch.zeros(w.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch 2.13 flags quantized tensors as deprecated
        warnings.simplefilter("ignore", UserWarning)
        qw = torch.quantize_per_channel(w, scales, zero_points, 0, torch.qint8)
        b = None if bias is None else bias.detach().float()
        return torch.ops.quantized.linear_prepack(qw, b)


def pack_int8_weight_only(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight [out, in], bfloat16 scale per output channel) for ``_weight_int8pack_mm``."""
    w = weight.detach().float()
    scales = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scales.to(torch.bfloat16)


def _wxt(w: torch.Tensor, x2d: torch.Tensor) -> torch.Tensor:  # [rows, out], row-major
    """``x2d @ w.T`` as ``(w @ x2d.T).T``; a single row is duplicated first, because the BLAS
    matrix-vector path runs on one thread while the 2-column product uses all of them."""
    rows = x2d.shape[0]
    y = torch.mm(w, x2d.repeat(2, 1).t())[:, :1] if rows == 1 else torch.mm(w, x2d.t())
    return y.t().contiguous()  # mm(W, x.T) is [out, rows]: row-major so callers may .view() it


class KernelLinear(nn.Linear):
    """``nn.Linear`` whose ``forward`` uses the kernel named by ``self.kernel``."""

    kernel: str = "default"
    max_rows: int = WXT_MAX_ROWS
    _packed = None  # fbgemm packed int8 weight ("int8"), once made
    _w8 = None  # (int8 weight, bfloat16 scales) ("int8w"), once made

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = self.kernel
        if kernel == "int8":
            # reduce_range=True (7-bit activations), as quantize_dynamic does for fbgemm:
            # here the full-range variant was both slower and, on non-VNNI CPUs, can saturate
            y = torch.ops.quantized.linear_dynamic(x.float().contiguous(), self._packed, True)
            return y if x.dtype == torch.float32 else y.to(x.dtype)
        if kernel == "int8w":
            q, scales = self._w8
            x2d = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
            y = torch.ops.aten._weight_int8pack_mm(x2d, q, scales).to(x.dtype)
            if self.bias is not None:
                y += self.bias.to(x.dtype)
            return y.reshape(*x.shape[:-1], q.shape[0])
        w = self.weight
        if kernel == "wxt" and x.dtype == torch.float32 and w.dtype == torch.float32:
            x2d = x.reshape(-1, x.shape[-1])
            rows = x2d.shape[0]
            if rows <= self.max_rows:
                y = _wxt(w, x2d)
                if self.bias is not None:
                    y += self.bias
                return y.reshape(*x.shape[:-1], w.shape[0])
        return F.linear(x, w, self.bias)

    def has_float_weight(self) -> bool:
        return self.weight.device.type != "meta"

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kernel={self.kernel}"


def _linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def _head(model: nn.Module):
    get = getattr(model, "get_output_embeddings", None)
    return get() if get is not None else None


def _module_kernel(kind: str, module: nn.Module, head) -> str:
    if kind == "int8-body":
        return "wxt" if module is head else "int8"
    return kind


def apply_cpu_kernel(
    model: nn.Module, kind: str = "default", *, max_rows: int | None = None, keep_float: bool = False
) -> nn.Module:
    """Give every ``nn.Linear`` of ``model`` the kernel ``kind``, in place; returns ``model``.

    ``max_rows`` overrides :data:`WXT_MAX_ROWS` for ``wxt``. For the int8 kernels the
    float weights are replaced by empty ``meta`` tensors of the same shape (so
    ``.weight.shape`` still works) unless ``keep_float``; an output head tied to the
    input embeddings never frees the shared weight. ``model.config.mtad_kernel``
    records the choice.
    """
    check_kernel(kind)
    head = _head(model)
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if kind in INT8_KERNELS:
        _quantized_engine()
    for _, m in _linears(model):
        if type(m) is nn.Linear:
            m.__class__ = KernelLinear
        if not isinstance(m, KernelLinear):
            continue  # some other Linear subclass (e.g. a quantized one): leave it alone
        if max_rows is not None:
            m.max_rows = max_rows
        k = _module_kernel(kind, m, head)
        if k in ("int8", "int8w"):
            if (m._packed if k == "int8" else m._w8) is None:
                if not m.has_float_weight():
                    raise RuntimeError(
                        f"kernel {k!r} needs the float weights to quantize, but they were freed; "
                        f"reload the model"
                    )
                if k == "int8":
                    m._packed = pack_int8(m.weight, m.bias)
                else:
                    m._w8 = pack_int8_weight_only(m.weight)
            tied = emb is not None and getattr(emb, "weight", None) is m.weight
            if not keep_float and not tied and m.has_float_weight():
                m.weight = nn.Parameter(
                    torch.empty(m.weight.shape, dtype=m.weight.dtype, device="meta"),
                    requires_grad=False,
                )
        elif not m.has_float_weight():
            raise RuntimeError(
                f"kernel {kind!r} needs float weights, but they were freed by an int8 kernel; "
                f"reload the model"
            )
        m.kernel = k
    _tag(model, kind)
    return model


def set_kernel(model: nn.Module, kind: str) -> nn.Module:
    """Switch a model already passed through :func:`apply_cpu_kernel` to ``kind``.

    Cheap when the weights ``kind`` needs are there (int8 packs are made on first
    use and kept); the float weights must still be present for ``default``/``wxt``.
    """
    return apply_cpu_kernel(model, kind, keep_float=True)


def _tag(model: nn.Module, kind: str) -> None:
    cfg = getattr(model, "config", None)
    if cfg is not None:
        cfg.mtad_kernel = kind


def kernel_of(model: nn.Module) -> str:
    """The kernel last applied to ``model`` (``default`` if none)."""
    return getattr(getattr(model, "config", None), "mtad_kernel", "default")


#: How ``bf16_linears_in_float32`` computes a bfloat16 linear, as audit rows and docs state it.
BF16_IN_FLOAT32 = "bfloat16 linears in float32"


def _float32_forward(self, x: torch.Tensor) -> torch.Tensor:
    x2d = x.reshape(-1, x.shape[-1]).float()
    w, rows = self._w32, x2d.shape[0]
    if rows <= WXT_MAX_ROWS:  # (W @ x.T).T, as ``wxt``: the fast BLAS call for few rows
        y = _wxt(w, x2d)
    else:
        y = x2d @ w.t()
    if self._b32 is not None:
        y += self._b32
    return y.to(x.dtype).reshape(*x.shape[:-1], w.shape[0])


def bf16_linears_in_float32(model: nn.Module) -> int:
    """Compute every bfloat16 ``nn.Linear`` of ``model`` (output head included) in float32, in place;
    returns how many were changed (0 for a model without bfloat16 linears, or one already changed).

    A host setting for CPUs that emulate bfloat16 (AVX2 only), where torch's bfloat16 matmul
    runs ~5x (prefill) to ~2x (decoding) slower than float32 on this project's 2-core machine
    (``docs/results.md``). The input and a float32 copy of the weight (bfloat16 values are exact
    in float32, so every product is exact) are multiplied with float32 accumulation, the bias
    added, and the sum rounded to bfloat16 once: the arithmetic of a native bfloat16 matmul
    (AVX-512 BF16, AMX), in the summation order of float32 BLAS. Not bit-identical to any
    machine's bfloat16 kernel, so never a point's setting: the audit names it where it was used
    (``mtad-audit --bf16-linears float32``). Costs a float32 copy of the bfloat16 weights.
    """
    import types

    changed = 0
    for _, m in _linears(model):
        if m.weight.dtype != torch.bfloat16 or getattr(m, "_w32", None) is not None:
            continue
        if getattr(m, "kernel", "default") != "default":
            raise ValueError(f"{BF16_IN_FLOAT32}: a linear with kernel {m.kernel!r} is not a bfloat16 matmul")
        m._w32 = m.weight.detach().float()
        m._b32 = None if m.bias is None else m.bias.detach().float()
        m.forward = types.MethodType(_float32_forward, m)
        changed += 1
    return changed

"""CPU matmul kernels for the linear layers of a causal LM.

Speculative and joint decoding pay off only when a k-token target pass costs about
as much as a 1-token pass. On CPU, PyTorch's default ``F.linear`` (``x @ W.T``) is
far from that for small row counts in float32, so :func:`apply_cpu_kernel` swaps
every ``nn.Linear`` (the output head included) for a subclass whose ``forward``
picks a kernel:

``default``
    leave the model as it is (``F.linear``).
``wxt``
    float32 only: compute ``(W @ x.T).T`` when the input has at most
    ``WXT_MAX_ROWS`` rows, else ``F.linear``. Same maths, different BLAS call;
    equal to ``default`` up to float rounding. Other dtypes use ``F.linear``.
``int8``
    dynamic int8 quantization (fbgemm ``quantized::linear_dynamic``): weights int8
    per output channel, activations quantized per call. Not exact (see
    ``bench/pass_cost.py`` for the logit error); the float weights are freed.
``int8-body``
    ``int8`` for every linear except the output head, which stays as ``wxt`` (keeps
    the logits closer to the float model).

Exact kernels are in :data:`EXACT_KERNELS`; a kernel is applied once, in place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KERNELS = ("default", "wxt", "int8", "int8-body")
EXACT_KERNELS = ("default", "wxt")

# Largest number of rows (tokens) for which `(W @ x.T).T` is used in float32; above it
# F.linear is as fast or faster. Chosen with `bench/pass_cost.py --micro`.
WXT_MAX_ROWS = 32


def _check_kind(kind: str) -> str:
    if kind not in KERNELS:
        raise ValueError(f"unknown kernel {kind!r} (config field `kernel`); valid choices: {KERNELS}")
    return kind


class WxtLinear(nn.Linear):
    """``nn.Linear`` computing ``(W @ x.T).T`` for few rows in float32."""

    max_rows: int = WXT_MAX_ROWS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if x.dtype != torch.float32 or w.dtype != torch.float32:
            return F.linear(x, w, self.bias)
        x2d = x.reshape(-1, x.shape[-1])
        if x2d.shape[0] > self.max_rows:
            return F.linear(x, w, self.bias)
        # mm(W, x.T) is [out, rows]; .T.contiguous() so that callers may .view() it
        y = torch.mm(w, x2d.t()).t()
        if self.bias is not None:
            y = y + self.bias
        else:
            y = y.contiguous()
        return y.reshape(*x.shape[:-1], w.shape[0])


class Int8DynamicLinear(nn.Linear):
    """``nn.Linear`` with int8 weights (per output channel) and dynamically quantized inputs.

    The float weight is dropped after packing; ``.weight`` then returns a dequantized
    copy, built on each access (for shape checks and tests, not for the hot path).
    """

    def _pack(self) -> None:
        w = self.weight.detach().float()
        bias = None if self.bias is None else self.bias.detach().float()
        scales = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        zero_points = torch.zeros(w.shape[0], dtype=torch.long)
        qw = torch.quantize_per_channel(w, scales.double(), zero_points, 0, torch.qint8)
        self._packed = torch.ops.quantized.linear_prepack(qw, bias)
        self._float_dtype = self.weight.dtype
        del self.weight  # unregisters the float parameter
        if self.bias is not None:
            del self.bias
            self.register_buffer("bias", bias.to(self._float_dtype), persistent=False)

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        qw, _ = torch.ops.quantized.linear_unpack(self._packed)
        return qw.dequantize().to(self._float_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.quantized.linear_dynamic(x.float().contiguous(), self._packed, True)
        return y.to(x.dtype) if x.dtype != torch.float32 else y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 dynamic"


def _linears(model: nn.Module):
    return [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]


def apply_cpu_kernel(model: nn.Module, kind: str = "default", max_rows: int | None = None) -> nn.Module:
    """Switch every ``nn.Linear`` of ``model`` to kernel ``kind``, in place; returns ``model``.

    ``max_rows`` overrides :data:`WXT_MAX_ROWS` for ``wxt``. The model's config gets
    ``mtad_kernel = kind`` so that results can record it.
    """
    _check_kind(kind)
    if kind == "default":
        _set_tag(model, kind)
        return model
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if kind in ("int8", "int8-body"):
        torch.backends.quantized.engine = "fbgemm" if "fbgemm" in torch.backends.quantized.supported_engines else torch.backends.quantized.engine
    for _, m in _linears(model):
        if kind == "wxt" or (kind == "int8-body" and m is head):
            m.__class__ = WxtLinear
            if max_rows is not None:
                m.max_rows = max_rows
        else:
            tied = head is not None and m is head and _is_tied(model, m)
            if tied:
                # keep the input embeddings' float weight; give the head its own copy to pack
                m.weight = nn.Parameter(m.weight.detach().clone(), requires_grad=False)
            m.__class__ = Int8DynamicLinear
            m._pack()
    _set_tag(model, kind)
    return model


def _is_tied(model: nn.Module, head: nn.Module) -> bool:
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return emb is not None and getattr(emb, "weight", None) is head.weight


def _set_tag(model: nn.Module, kind: str) -> None:
    cfg = getattr(model, "config", None)
    if cfg is not None:
        cfg.mtad_kernel = kind


def kernel_of(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "mtad_kernel", "default")

"""``bf16_linears_in_float32``: a bfloat16 linear computed as a native bfloat16 matmul does
(exact products, float32 accumulation, one rounding), and named wherever the audit uses it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn

from mtad.models.kernels import BF16_IN_FLOAT32, apply_cpu_kernel, bf16_linears_in_float32
from mtad.models.tiny import tiny_causal_lm
from mtad.run.audit import machine_group, this_machine
from mtad.run.audit import main as audit_main
from mtad.run.results.segments import describe_provenance

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 97


def _bf16_model(seed: int = 3):
    return tiny_causal_lm("qwen2", vocab_size=VOCAB, hidden_size=64, dtype=torch.bfloat16, seed=seed)


def _ulp(x: torch.Tensor) -> torch.Tensor:
    """The bfloat16 spacing at |x| (8 significant bits)."""
    e = torch.floor(torch.log2(x.abs().clamp_min(2.0 ** -120)))
    return 2.0 ** (e - 7)


@torch.no_grad()
def test_every_bfloat16_linear_is_the_float64_sum_rounded_once():
    model = _bf16_model()
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert bf16_linears_in_float32(model) == len(linears) > 0
    assert bf16_linears_in_float32(model) == 0  # already changed: nothing done twice
    g = torch.Generator().manual_seed(0)
    biased = 0
    for m in linears:
        for rows in (1, 3, 80):  # the (W @ x.T).T path and the F.linear path
            x = torch.randn(2, rows, m.in_features, generator=g).to(torch.bfloat16)
            y = m(x)
            assert y.dtype == torch.bfloat16 and y.shape == (2, rows, m.out_features)
            exact = x.double() @ m.weight.double().t() + (0 if m.bias is None else m.bias.double())
            rounded = exact.to(torch.bfloat16)
            # float32 accumulation: at most one bfloat16 step from the exact sum, and equal to its
            # rounding wherever the sum is not within float32 noise of a rounding boundary
            assert ((y.double() - exact).abs() <= _ulp(exact)).all()
            assert (y == rounded).double().mean() > 0.995
        biased += m.bias is not None
    assert biased > 0  # Qwen2's q/k/v biases are added before the rounding


@torch.no_grad()
def test_the_model_stays_close_to_its_bfloat16_self_and_leaves_float32_alone():
    stock, changed = _bf16_model(), _bf16_model()
    bf16_linears_in_float32(changed)
    ids = torch.randint(2, VOCAB, (1, 20), generator=torch.Generator().manual_seed(1))
    a, b = stock(ids).logits.float(), changed(ids).logits.float()
    torch.testing.assert_close(b, a, atol=0.1, rtol=0.05)  # bfloat16 rounding of 2 layers apart
    f32 = tiny_causal_lm("qwen2", vocab_size=VOCAB, hidden_size=64, seed=3)
    assert bf16_linears_in_float32(f32) == 0
    int8 = _bf16_model()
    apply_cpu_kernel(int8, "int8w")
    try:
        bf16_linears_in_float32(int8)
    except ValueError as e:
        assert "int8w" in str(e)
    else:  # pragma: no cover
        raise AssertionError("a quantized linear was taken for a bfloat16 matmul")


def test_the_audit_names_the_kernel_in_every_row(tmp_path):
    point = tmp_path / "point"
    shutil.copytree(ROOT / "results/sweeps/table2_smoke/22805486e9c6", point)  # tiny pair, float weights
    out = tmp_path / "audit.jsonl"
    assert audit_main([str(point), "--n", "1", "--out", str(out), "--bf16-linears", "float32"]) == 0
    (row,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert BF16_IN_FLOAT32 in row["audited_on"]
    assert row["result"] == "identical"  # no bfloat16 linear in the tiny pair: nothing changed
    # never counted as the machine kind that made a record, even this very machine's
    here = this_machine()
    assert machine_group(here, describe_provenance(here)) == "same machine kind as the audit"
    assert machine_group(here, row["audited_on"]).startswith("another machine kind")

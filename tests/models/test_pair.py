"""Model pairs: tokenizer compatibility is checked on ids and special tokens; a big model
on GPUs is never offloaded to the CPU silently (placement checked with tiny saved models
and a mocked ``torch.cuda``)."""

import pytest
import torch
import transformers

from mtad.models.pair import (
    check_fits,
    check_same_tokenizer,
    format_bytes,
    hub_pair,
    tiny_pair,
    weights_bytes,
)
from mtad.models.tiny import TinyTokenizer, tiny_causal_lm


def test_same_tokenizer_passes():
    check_same_tokenizer(TinyTokenizer(50), TinyTokenizer(50), "target-a", "draft-b")


def test_mismatched_tokenizers_name_both_models():
    with pytest.raises(ValueError, match="draft-b.*target-a"):
        check_same_tokenizer(TinyTokenizer(50), TinyTokenizer(60), "target-a", "draft-b")


def test_different_special_tokens_rejected():
    with pytest.raises(ValueError, match="special token ids differ"):
        check_same_tokenizer(TinyTokenizer(50), TinyTokenizer(50, eos_token_id=3), "t", "d")


def test_tiny_pair_records_ids_and_checksums():
    pair = tiny_pair(vocab_size=30, dtype="float64")
    assert pair.vocab_size == 30 and pair.target_id != pair.draft_id
    assert len(pair.info["target_checksum"]) == 16
    with pytest.raises(ValueError, match="model.dtype"):
        tiny_pair(dtype="float8")


VOCAB = 99


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A tiny model saved like a hub checkpoint (config + weights), and its parameter count."""
    path = tmp_path_factory.mktemp("tiny_hub_model")
    model = tiny_causal_lm("llama", vocab_size=VOCAB, hidden_size=32, num_layers=2)
    model.save_pretrained(path)
    return str(path), sum(p.numel() for p in model.parameters())


@pytest.fixture
def fake_cuda(monkeypatch):
    """``torch.cuda`` with ``free`` bytes free on each visible GPU (a dict index -> bytes)."""

    def install(free):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(free))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (free[i], 2 * free[i]))

    return install


@pytest.fixture
def fake_loader(monkeypatch):
    """``from_pretrained`` returning a tiny CPU model carrying a given ``hf_device_map``; calls recorded."""
    calls = []
    tok = TinyTokenizer(VOCAB)

    def install(device_map_by_id):
        def from_pretrained(model_id, **kwargs):
            calls.append((model_id, kwargs))
            model = tiny_causal_lm("llama", vocab_size=VOCAB, hidden_size=32, num_layers=2)
            model.hf_device_map = device_map_by_id[model_id]
            return model

        monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
        monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda model_id, **kw: tok)
        return calls

    return install


def _refuse_loading(monkeypatch):
    def from_pretrained(*a, **kw):
        raise AssertionError("the model must be refused before any weight is loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)


def test_weights_bytes_from_the_config_alone(saved_model):
    path, n_params = saved_model
    assert weights_bytes(path, torch.float16) == (n_params, 2 * n_params)
    assert weights_bytes(path, torch.float32) == (n_params, 4 * n_params)


def test_target_larger_than_max_memory_refused_before_loading(saved_model, monkeypatch):
    path, n_params = saved_model
    need = 2 * n_params
    budget = need // 2
    _refuse_loading(monkeypatch)
    spec = {"id": path, "dtype": "float16", "device_map": "auto", "max_memory": {0: budget}}
    with pytest.raises(RuntimeError, match="does not fit") as e:
        hub_pair("big", target=spec, draft=spec, device="cuda")
    msg = str(e.value)
    assert format_bytes(need) in msg and format_bytes(budget) in msg
    assert "model.target" in msg and "max_memory 0:" in msg


def test_free_gpu_memory_is_the_budget_without_max_memory(saved_model, fake_cuda):
    path, n_params = saved_model
    need = 4 * n_params
    spec = {"id": path, "dtype": "float32", "device_map": "auto"}
    fake_cuda({0: need // 3, 1: need // 3})  # together still short of the weights
    with pytest.raises(RuntimeError, match="does not fit") as e:
        check_fits("target", spec, "cuda")
    assert "cuda:0" in str(e.value) and "cuda:1" in str(e.value)
    fake_cuda({0: need // 2 + 1, 1: need // 2 + 1})  # split over both GPUs it fits
    check_fits("target", spec, "cuda")
    # a model placed whole (no device_map) may only use its own device's free memory
    with pytest.raises(RuntimeError, match="cuda:0"):
        check_fits("draft", {"id": path, "dtype": "float32"}, "cuda")
    check_fits("target", spec, "cpu")  # CPU placement asked: nothing to check


def test_offload_after_loading_refused_and_max_memory_passed(saved_model, fake_cuda, fake_loader):
    path, n_params = saved_model
    fake_cuda({0: 8 * n_params, 1: 8 * n_params})
    calls = fake_loader({path: {"model.embed_tokens": 0, "model.layers": 1, "lm_head": "cpu"}})
    # keys as a command-line override gives them ("0"): passed on as accelerate's GPU ints
    max_memory = {"0": 8 * n_params, "1": 8 * n_params}
    spec = {"id": path, "dtype": "float16", "device_map": "auto", "max_memory": max_memory}
    with pytest.raises(RuntimeError, match=r"offloaded \(lm_head -> cpu\)"):
        hub_pair("split", target=spec, draft=spec, device="cuda")
    assert calls[0][1]["device_map"] == "auto"
    assert calls[0][1]["max_memory"] == {0: max_memory["0"], 1: max_memory["1"]}


def test_gpu_split_loads_and_records_its_map(saved_model, fake_cuda, fake_loader):
    path, n_params = saved_model
    fake_cuda({0: 8 * n_params, 1: 8 * n_params})
    dmap = {"model.embed_tokens": 0, "model.layers": 1, "lm_head": 1}
    fake_loader({path: dmap})
    spec = {"id": path, "dtype": "float16", "device_map": "auto"}
    pair = hub_pair("split", target=spec, draft=spec, device="cuda")
    assert pair.info["target"]["device_map"] == {k: str(v) for k, v in dmap.items()}


def test_explicit_cpu_entry_in_max_memory_accepts_offload(saved_model, fake_loader):
    path, n_params = saved_model
    fake_loader({path: {"model": 0, "lm_head": "cpu"}})
    spec = {"id": path, "dtype": "float16", "device_map": "auto", "max_memory": {0: n_params, "cpu": 8 * n_params}}
    pair = hub_pair("offload", target=spec, draft=spec, device="cuda")
    assert pair.info["target"]["device_map"]["lm_head"] == "cpu"


def test_max_memory_without_device_map_refused(saved_model):
    path, n_params = saved_model
    spec = {"id": path, "dtype": "float16", "max_memory": {0: n_params}}
    with pytest.raises(ValueError, match="max_memory needs model.target.device_map"):
        hub_pair("bad", target=spec, draft=spec, device="cuda")

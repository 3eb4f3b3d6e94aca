"""What depends on the torch / transformers versions (marker ``stack``).

``make test-stack TORCH=... TRANSFORMERS=...`` runs ``-m "stack and not slow"`` in a side
environment of that stack (torch, transformers, numpy, pytest, scipy, hydra-core; outputs in
``results/stacks/``); the default suite runs the same tests on the pinned stack. Marked
``stack`` elsewhere: the runner's logits against full passes for chains and trees
(``tests/core/test_runner_cache.py``, ``tests/core/test_tree_attention.py``), the device checker
(``tests/decoders/test_devices.py``), the chi-square losslessness subset
(``tests/decoders/test_lossless.py``) and the GPU check's dry run (``tests/test_gpu.py``).

Here: the declared range and its refusal (one line, before any model loads), the cache keyword
read from the forward signature, the start-up probe (passes on every architecture and kernel,
fails when the cache is ignored), every lossless decoder at T=0 equal to transformers' own
``generate`` on tiny Qwen2, Llama, OPT and GPT-2 models, and every decoder running on each.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch

from mtad.core import stack
from mtad.core.engine import Engine
from mtad.core.runner import ModelRunner
from mtad.core.warping import Warping
from mtad.models.tiny import ARCHS, tiny_causal_lm
from mtad.testing import unsupported_by

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402  (decoders from conf/decoder/*.yaml without Hydra)

pytestmark = pytest.mark.stack

DECODERS = gpu_check.decoder_names()
LOSSLESS = [n for n in DECODERS if getattr(gpu_check.load_decoder(n), "lossless", True)]
PROMPT = [3, 4, 5, 6, 7, 8]


# ------------------------------------------------------------------------ the range
def test_pyproject_declares_the_supported_range():
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {d.split(">")[0].split("<")[0].split("=")[0].strip(): d for d in deps}
    for name, spec in stack.SUPPORTED.items():
        assert declared[name] == name + spec


def test_the_installed_stack_is_in_the_range():
    found = stack.check_versions()
    assert found == stack.installed() and not stack.outside(found)


@pytest.mark.parametrize("versions", [
    {"torch": "2.10.0", "transformers": "5.17.0"},
    {"torch": "2.13.0+cpu", "transformers": "5.25.0"},
    {"torch": "2.14.0+cu130", "transformers": "5.24.0"},
    {"torch": "2.12.0", "transformers": None},
], ids=["old-torch", "new-transformers", "new-torch", "no-transformers"])
def test_a_stack_outside_the_range_is_refused_in_one_line(versions):
    with pytest.raises(stack.StackError) as e:
        stack.check_versions(versions)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("unsupported stack: ")
    assert f"torch {versions['torch']}" in msg
    assert f"transformers {versions['transformers'] or 'missing'}" in msg
    assert "torch>=2.11,<2.14" in msg and "transformers>=5.17,<5.25" in msg


@pytest.mark.parametrize("versions", [
    {"torch": "2.11.0+cu130", "transformers": "5.17.0"},
    {"torch": "2.13.1", "transformers": "5.24.3"},
    {"torch": "2.12.0.dev20260101+cu128", "transformers": "5.20.0"},
], ids=["low-end", "pin", "dev-build"])
def test_a_stack_in_the_range_passes(versions):
    assert stack.check_versions(versions) == versions


def test_an_entry_point_refuses_with_exit_2_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(stack, "installed", lambda: {"torch": "2.10.0", "transformers": "5.17.0"})
    with pytest.raises(SystemExit) as e:
        stack.require_supported_stack()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unsupported stack: torch 2.10.0, transformers 5.17.0 (torch outside")
    assert err.count("\n") == 1


def test_the_record_says_which_checks_passed():
    ModelRunner(tiny_causal_lm("qwen2", attn_implementation="sdpa"))
    rec = stack.record()
    assert rec["range_check"] == "passed" and rec["supported"] == stack.SUPPORTED
    assert rec["torch"] == stack.installed()["torch"]
    probe = rec["probes"]["Qwen2ForCausalLM/sdpa"]
    assert probe["passed"] and probe["max_abs_diff"] <= stack.PROBE_ATOL


# ------------------------------------------------------------------ the cache keyword
@pytest.mark.parametrize("arch", ARCHS)
def test_the_runner_passes_the_cache_by_the_keyword_forward_names(arch):
    model = tiny_causal_lm(arch)
    named = inspect.signature(model.forward).parameters
    expected = "cache" if "cache" in named else "past_key_values"
    assert stack.cache_keyword(model) == expected
    seen = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: seen.append(set(kw)), with_kwargs=True)
    try:
        runner = ModelRunner(model)
        seen.clear()
        runner.prefill(PROMPT)
        runner.begin(PROMPT)
        runner.forward([9, 10], [0, 1])
    finally:
        hook.remove()
    assert seen and all(expected in kw and not (kw & (set(stack.CACHE_KEYWORDS) - {expected})) for kw in seen)


def test_a_forward_naming_no_cache_keyword_is_refused():
    class NoCache(torch.nn.Module):
        def forward(self, input_ids=None, position_ids=None, **kwargs):
            return None

    with pytest.raises(stack.StackError, match="names no cache keyword"):
        stack.cache_keyword(NoCache())


# ------------------------------------------------------------------------- the probe
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_the_probe_passes_on_every_architecture_and_kernel(arch, impl, monkeypatch):
    monkeypatch.setattr(stack, "_probes", {})
    model = tiny_causal_lm(arch, attn_implementation=impl)
    state = torch.random.get_rng_state()
    res = stack.probe(model, ModelRunner)
    assert res["passed"] and res["max_abs_diff"] <= stack.PROBE_ATOL
    assert torch.equal(torch.random.get_rng_state(), state), "the probe leaves the global RNG as it was"


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_the_probe_fails_when_the_model_ignores_the_cache(arch, monkeypatch):
    """A keyword the forward swallows in ``**kwargs`` (the failure on a stack whose models renamed
    it): the runner's cache stays empty, and the probe refuses in one line."""
    monkeypatch.setattr(stack, "_probes", {})
    monkeypatch.setattr(stack, "cache_keyword", lambda model: "kv_cache_unknown_to_the_model")
    with pytest.raises(stack.StackError) as e:
        ModelRunner(tiny_causal_lm(arch))
    msg = str(e.value)
    assert "\n" not in msg and "differ from full forward passes" in msg and "tested range" in msg


@pytest.mark.parametrize("arch", ARCHS)
def test_the_probe_tolerance_is_far_below_what_a_lost_token_moves(arch):
    """PROBE_ATOL's margin, measured: on the probe's own tiny model (eager kernel: float32 attention
    probabilities), deleting any one token of the probe's sequences moves the last logits by far
    more than the tolerance, which stays above the eager kernels' float32 rounding."""
    tiny = stack.tiny_like(tiny_causal_lm(arch, attn_implementation="eager"))
    ids = [3, 7, 11, 5, 2, 9, 4, 8, 6, 12, 13, 15]
    moved = []
    for n in range(6, len(ids) + 1):
        ref = stack._full(tiny, ids[:n])[-1]
        for j in range(n - 1):
            lost = ids[:j] + ids[j + 1:n]
            moved.append(float((stack._full(tiny, lost)[-1] - ref).abs().max()))
    assert min(moved) > 1000 * stack.PROBE_ATOL, min(moved)


# ------------------------------------------------------- decoders against transformers
def _pair(arch):
    kw = dict(vocab_size=40, dtype=torch.float64, logit_scale=4.0, attn_implementation="sdpa")
    target = tiny_causal_lm(arch, seed=0, **kw)
    draft = tiny_causal_lm(arch, hidden_size=16, num_heads=2, num_layers=1, seed=1, **kw)
    return target, draft


@pytest.fixture(scope="module", params=ARCHS)
def pair(request):
    return request.param, _pair(request.param)


def hf_greedy(model, prompt, n) -> list[int]:
    """transformers' own greedy ``generate``, ``n`` new tokens (no end-of-sequence stop)."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                         pad_token_id=0, temperature=None, top_k=None, top_p=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("name", LOSSLESS)
def test_lossless_decoders_equal_transformers_generate_at_t0(pair, name):
    arch, (target, draft) = pair
    ref = hf_greedy(target, PROMPT, 24)
    assert len(ref) == 24
    out = Engine(target, draft, gpu_check.load_decoder(name), Warping(0)).generate(PROMPT, 24, seed=2)
    assert out.output_ids == ref, f"{name} on {arch}"


@pytest.mark.parametrize("name", DECODERS)
def test_every_decoder_runs_on_each_architecture(pair, name):
    arch, (target, draft) = pair
    dec, w = gpu_check.load_decoder(name), Warping(1.0, top_k=10, top_p=0.9)
    if why := unsupported_by(dec, w):
        pytest.skip(why)
    res = Engine(target, draft, dec, w).generate(PROMPT, 16, seed=1)
    assert len(res.output_ids) == 16 and all(0 <= t < 40 for t in res.output_ids)
    assert sum(s.emitted for s in res.steps) == 16
    assert all(1 <= s.emitted and 0 <= s.accepted <= s.drafted for s in res.steps)

"""The torch / transformers stack the harness runs on: its supported range, the cache keyword,
and the start-up probe that proves the runner's cache is honoured.

* ``SUPPORTED``: the versions the harness is tested on, the same specifiers as the
  ``dependencies`` of ``pyproject.toml`` (a test checks that they agree). Both ends are run by
  ``make test-stack`` (``results/stacks/``). ``check_versions`` refuses any other stack in one
  line that names the installed versions and the range; it reads package metadata only, so
  callers run it before any model loads.
* ``cache_keyword(model)``: the keyword the model's ``forward`` takes its KV cache by, read
  from its signature: ``cache`` (transformers 5.24) or ``past_key_values`` (5.17). A model
  whose ``forward`` has ``**kwargs`` silently drops a keyword it does not know, so the
  keyword is never guessed: a forward naming neither is refused.
* ``probe(model, runner_class)``: builds a tiny random model of the same class and attention
  kernel (float64 on the CPU, a few ms) and checks, through the runner class it is given
  (``mtad.core.runner.ModelRunner``, which passes itself), that logits after
  cached steps equal full forward passes over the same tokens: a prefill, a chain, a tree
  (branches, a node under a node), and a step after the cache kept a non-prefix path. An
  ignored cache, a mask the kernel drops or a position the model does not take shows up
  there. It runs once per (class, kernel) in a process.
* ``checked_cache_keyword(model, runner_class)``: all three, for ``ModelRunner``'s constructor.
  This module does not import the runner (the runner imports it): imports go one way.
* ``record()``: what ran in this process (versions, range, which checks passed, the keyword
  and every probe's largest difference), for a run's provenance.

The probe checks the transformers API on the CPU; GPU kernels' rounding is the GPU tests'
(``tests/test_gpu.py``).
"""

from __future__ import annotations

import copy
import inspect
from importlib import metadata
from typing import Any

#: package -> PEP 440 specifier of the versions tested (``pyproject.toml`` declares the same)
SUPPORTED = {"torch": ">=2.11,<2.14", "transformers": ">=5.17,<5.25"}
#: the keywords a causal LM's forward may take its cache by, newest first
CACHE_KEYWORDS = ("cache", "past_key_values")
#: probe tolerance on float64 logits (of scale ~1-10). transformers' eager kernels (Qwen2, Llama,
#: OPT) compute attention probabilities in float32 (``softmax(..., dtype=torch.float32)``) even for a
#: float64 model, so their logits carry float32 rounding that depends on the row's length and on the
#: CPU's vector width: cached and full passes differed by 2.0e-7 on an AVX2 AMD EPYC, by 0 on an
#: AVX-512 Intel Xeon (sdpa: 2.2e-16 on both). What the probe is for is far above that: a lost token
#: moves the tiny probe model's last logits by at least 0.058 (Qwen2) / 0.19 (OPT), measured over
#: every deletion in the probe's sequences (``tests/test_stack.py`` checks both sides).
PROBE_ATOL = 1e-5

_probes: dict[str, dict[str, Any]] = {}  # "Class/kernel" -> result, this process
_probing: set[str] = set()
_versions_checked: dict[str, str] | None = None


class StackError(RuntimeError):
    """The installed torch / transformers cannot be trusted (outside the range, or the probe failed)."""


def versions(names) -> dict[str, str | None]:
    """Installed version of each distribution (None where it is not installed); metadata only."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def installed() -> dict[str, str | None]:
    return versions(SUPPORTED)


def range_text() -> str:
    return ", ".join(f"{name}{spec}" for name, spec in SUPPORTED.items())


def stack_text(versions: dict[str, str | None] | None = None) -> str:
    versions = versions or installed()
    return ", ".join(f"{name} {versions.get(name) or 'missing'}" for name in SUPPORTED)


def outside(versions: dict[str, str | None]) -> list[str]:
    """Packages of ``versions`` outside ``SUPPORTED`` (a dev build of an in-range release counts in)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    bad = []
    for name, spec in SUPPORTED.items():
        v = versions.get(name)
        try:
            ok = v is not None and SpecifierSet(spec).contains(Version(v), prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            bad.append(name)
    return bad


def check_versions(versions: dict[str, str | None] | None = None) -> dict[str, str | None]:
    """Refuse (``StackError``, one line) a stack outside ``SUPPORTED``; return the versions."""
    global _versions_checked
    found = versions or installed()
    bad = outside(found)
    if bad:
        raise StackError(
            f"unsupported stack: {stack_text(found)} ({', '.join(bad)} outside the tested range "
            f"{range_text()}, pyproject.toml); install versions in range, e.g. "
            f"pip install {' '.join(repr(n + s) for n, s in SUPPORTED.items())}")
    if versions is None:
        _versions_checked = found
    return found


def cache_keyword(model) -> str:
    """The keyword ``model.forward`` takes its KV cache by (see the module docstring)."""
    params = inspect.signature(model.forward).parameters
    for kw in CACHE_KEYWORDS:
        if kw in params:
            return kw
    raise StackError(
        f"{type(model).__name__}.forward names no cache keyword ({' or '.join(CACHE_KEYWORDS)}) "
        f"on {stack_text()}; a keyword it does not name may be silently ignored, so the runner "
        f"cannot cache for it (tested range: {range_text()})")


def _probe_key(model) -> str:
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    return f"{type(model).__name__}/{impl}"


#: config fields shrunk for the probe's model, where the config has them
_TINY = {"vocab_size": 48, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 32, "ffn_dim": 32,
         "n_inner": 32, "word_embed_proj_dim": 16, "max_position_embeddings": 64}
_DROP = ("layer_types", "quantization_config", "torch_dtype", "dtype")
_NO_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def tiny_like(model):
    """A tiny random float64 CPU model of ``model``'s class and attention kernel (weights of
    scale ~0.3, so logits of scale ~1-10 and attention far from uniform). The global random
    state is left as it was."""
    import torch

    cfg = model.config
    values = {k: v for k, v in cfg.to_dict().items() if k not in _DROP}
    names = {getattr(cfg, "attribute_map", {}).get(k, k): v for k, v in _TINY.items()}
    for key, value in names.items():
        if key in values:
            values[key] = value
    tiny_cfg = type(cfg)(**{**values, **_NO_IDS})
    tiny_cfg._attn_implementation = getattr(cfg, "_attn_implementation", None) or "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        tiny = type(model)(tiny_cfg)
        with torch.no_grad():
            for p in tiny.parameters():
                p.normal_(0.0, 0.3)
    return tiny.to(device="cpu", dtype=torch.float64).eval()


def _full(model, ids: list[int]):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].double()


def run_probe(tiny, runner_class) -> float:
    """Largest |runner logit - full-pass logit| over the probe's steps on ``tiny`` (see the
    module docstring): a prefill, a chain, a tree, and a step after a non-prefix path was kept.
    ``runner_class(tiny)`` builds the runner (``mtad.core.runner.ModelRunner``)."""
    from mtad.core.protocols import ROOT

    runner = runner_class(tiny)
    prompt = [3, 7, 11, 5, 2, 9]
    worst = 0.0

    def diff(got, ids):
        nonlocal worst
        worst = max(worst, float((got.double() - _full(tiny, ids)[-1]).abs().max()))

    runner.prefill(prompt)
    # a chain: the endpoint and three nodes, each at its own depth
    runner.begin(prompt)
    chain = [4, 8, 1]
    out = runner.forward(chain, [ROOT, 1, 2])
    diff(runner.root_logits, prompt)
    for i in range(len(chain)):
        diff(out[i], prompt + chain[: i + 1])
    committed = prompt + chain[:2] + [6]
    runner.end(committed)  # keeps a prefix of the chain (a crop)
    # a tree: two children of the root, a node under the second, one under that
    runner.begin(committed)
    tokens, parents = [10, 12, 13, 14], [ROOT, ROOT, 2, 3]
    out = runner.forward(tokens, parents)
    diff(runner.root_logits, committed)
    paths = {0: [], 1: [10], 2: [12], 3: [12, 13], 4: [12, 13, 14]}
    for row in range(1, len(tokens) + 1):
        diff(out[row - 1], committed + paths[row])
    committed = committed + [12, 13, 15]
    runner.end(committed)  # keeps rows 2, 3: not a prefix of the node order (a gather)
    runner.begin(committed)
    out = runner.forward([16, 17], [ROOT, 1])
    diff(runner.root_logits, committed)
    diff(out[0], committed + [16])
    diff(out[1], committed + [16, 17])
    runner.end(committed + [16])
    return worst


def probe(model, runner_class) -> dict[str, Any]:
    """Run (once per class and kernel in this process) the probe through ``runner_class``
    (``mtad.core.runner.ModelRunner``); refuse in one line on failure."""
    key = _probe_key(model)
    if key in _probes:
        return _probes[key]
    import torch

    _probing.add(key)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny passes: more threads only wait on each other (seconds on a busy CPU)
    try:
        tiny = tiny_like(model)
        worst = run_probe(tiny, runner_class)
    except StackError:
        raise
    except Exception as e:  # noqa: BLE001  (any failure of the runner on this stack refuses it)
        raise StackError(
            f"the cache probe on a tiny {key} failed on {stack_text()} "
            f"(tested range: {range_text()}): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    finally:
        _probing.discard(key)
        torch.set_num_threads(threads)
    if not worst <= PROBE_ATOL:
        raise StackError(
            f"the cache probe on a tiny {key} failed on {stack_text()}: the runner's cached logits "
            f"differ from full forward passes by {worst:.3g} (> {PROBE_ATOL:g}; cache keyword "
            f"{cache_keyword(model)!r}), so cached decoding would be silently wrong "
            f"(tested range: {range_text()})")
    _probes[key] = {"passed": True, "max_abs_diff": worst, "atol": PROBE_ATOL,
                    "cache_keyword": cache_keyword(model)}
    return _probes[key]


def checked_cache_keyword(model, runner_class) -> str:
    """For ``ModelRunner``: the range check, the cache keyword, and the probe for ``model``'s
    class and kernel through ``runner_class`` (the probe's own runner skips its probe)."""
    if _versions_checked is None:
        check_versions()
    kw = cache_keyword(model)
    if _probe_key(model) not in _probing:
        probe(model, runner_class)
    return kw


def record() -> dict[str, Any]:
    """This process's stack checks, for a run's provenance: versions, range, which passed."""
    versions = installed()
    return {
        "torch": versions["torch"],
        "transformers": versions["transformers"],
        "supported": dict(SUPPORTED),
        "range_check": "passed" if not outside(versions) else "failed",
        "probes": copy.deepcopy(_probes),
    }


def require_supported_stack() -> None:
    """For command-line entry points, before any model loads: exit 2 with the one-line refusal."""
    import sys

    try:
        check_versions()
    except StackError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None

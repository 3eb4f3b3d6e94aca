#!/usr/bin/env python
"""The harness's check on a GPU node, in one run of at most ~5 minutes on one GPU (``make gpu-check``).

Everything goes into one folder (``--out``):

* ``gpu_check.json``: every number, the versions found (``mtad.run.provenance.provenance``: torch,
  CUDA, transformers, driver, GPU names, compute capability, count) and each phase's status;
  rewritten after every phase, so a run cut short keeps what it measured;
* ``pytest.log``: the ``gpu`` tests (``tests/test_gpu.py``: every decoder on CUDA, greedy
  equality of the lossless decoders, seeded GPU runs equal to CPU runs in float64, one
  synchronisation per step);
* ``report.md``: the headline numbers.

Phases (each timed and recorded, also when it fails; a phase that would overrun ``--budget-s``
is skipped and says so):

1. ``tests``: ``pytest -m gpu tests/test_gpu.py``.
2. ``forward``: ms per k-token pass (k = 1..16) through the tree runner on a 128-token cache,
   CUDA events, median over repeats (k interleaved): a 1B-shaped random target at two
   vocabularies (Qwen2-like, 151,936; Llama-like, 32,000) and the small draft, bfloat16.
3. ``overhead``: our SpD and tree-MTAD against transformers' assisted generation
   (``target.generate(..., assistant_model=draft)``, a constant ``gamma`` draft tokens as
   ``bench/speed.py``'s ``hf_assisted`` row), on the same models, interleaved, greedy,
   sampled with top-k/top-p and at plain temperature (T=1: our draws on the device,
   ``docs/devices.md``), with the small draft (random models accept few tokens) and with a copy of the
   target as its own draft (nearly every token accepted). Per run: wall time of the whole
   call (engine construction and prefill included, as HF's ``generate`` includes its own
   setup and prefill), forward time of both models (CUDA events in forward hooks, the same
   hooks for both sides), and the metric ``overhead_ms_per_pass`` = (wall - forward) /
   target forward passes (prefill included on both sides). One extra run of each, not timed,
   counts host synchronisations: explicit ``torch.cuda.synchronize`` calls, and implicit ones
   outside the models' forward passes (``torch.cuda.set_sync_debug_mode("warn")``: a
   device-to-host read, a copy from pageable host memory, ``nonzero``), by source line.
4. ``energy``: J/token of SpD and tree-MTAD on the small-draft pair (T=1), NVML
   (``mtad.run.energy``), interleaved, each window at least a few seconds; an idle window for
   the baseline. Without NVML the phase records why.

The models are built in-process from configs with random weights: no download, no hub, no
data. Needs torch, transformers and this checkout (no Hydra: decoders are built from
``conf/decoder/*.yaml`` by ``load_decoder`` below, tested equal to ``mtad.run.cli.load_decoder``).
Without CUDA it stops with one line ("no CUDA device: ...", exit 2); ``--dry-run`` runs every
phase on the CPU with tiny shapes in seconds (the default test suite does).

What it does not do: load real checkpoints, measure acceptance rates of real pairs, or
compare GPU numerics with the CPU beyond the float64 tests.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
CONF = ROOT / "conf"
_KNOB = re.compile(r"^\$\{(\w+)\}$")


# ----------------------------------------------------------------------------- decoders
def decoder_names() -> list[str]:
    """Every ``conf/decoder/*.yaml`` (as ``mtad.run.cli.group_options("decoder")``)."""
    return sorted(p.stem for p in (CONF / "decoder").glob("*.yaml"))


def load_decoder(name: str, **knobs):
    """``conf/decoder/<name>.yaml`` instantiated without Hydra: ``${knob}`` fields from ``knobs``,
    else ``conf/config.yaml``'s top-level values; a knob the decoder does not use is an error."""
    import yaml

    spec = yaml.safe_load((CONF / "decoder" / f"{name}.yaml").read_text())
    defaults = yaml.safe_load((CONF / "config.yaml").read_text())
    module, _, cls = spec.pop("_target_").rpartition(".")
    used, kwargs = set(), {}
    for key, value in spec.items():
        m = _KNOB.match(value) if isinstance(value, str) else None
        if m:
            used.add(m.group(1))
            value = knobs.get(m.group(1), defaults[m.group(1)])
        kwargs[key] = value
    if set(knobs) - used:
        raise ValueError(f"decoder {name!r} uses no knob {sorted(set(knobs) - used)}")
    return getattr(importlib.import_module(module), cls)(**kwargs)


# ------------------------------------------------------------------------------- models
@dataclass(frozen=True)
class Shape:
    arch: str  # "qwen2" or "llama"
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


SHAPES = {  # name -> shape; "gpu": 1B-shaped targets and a small draft, "dry": tiny stand-ins
    "gpu": {"target_152k": Shape("qwen2", 151936, 2048, 16, 32, 8, 8192),
            "target_32k": Shape("llama", 32000, 2048, 22, 32, 4, 5632),
            "draft_152k": Shape("qwen2", 151936, 512, 4, 8, 2, 1408)},
    "dry": {"target_152k": Shape("qwen2", 4500, 64, 2, 4, 2, 128),  # past sampling.DENSE_MAX
            "target_32k": Shape("llama", 320, 64, 2, 4, 2, 128),
            "draft_152k": Shape("qwen2", 4500, 32, 1, 2, 1, 64)},
}


def build_model(shape: Shape, dtype: torch.dtype, device: str, seed: int):
    """A random causal LM of ``shape``, built on ``device`` (init there: seconds for 1B on a GPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM),
                          "llama": (LlamaConfig, LlamaForCausalLM)}[shape.arch]
    cfg = cfg_cls(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                  num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                  num_key_value_heads=shape.kv_heads, max_position_embeddings=4096,
                  tie_word_embeddings=False, bos_token_id=0, eos_token_id=None, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(cfg)
    return model.to(dtype).eval()


# -------------------------------------------------------------------- greedy near-ties
#: bfloat16 / float16: a top-2 gap within this many spacings of the dtype at |top-1 logit| may flip
#: between two kernels (docs/devices.md). Two passes over the same context differ in the gap by at
#: most 2 spacings from the final rounding of the two logits (half a spacing each, in each pass),
#: plus, per pass, one rounding of the last hidden state h (relative eps/2), which moves the gap by
#: at most eps/2 * |w_a - w_b| * |h| (w_a, w_b: the top two tokens' output rows).
#: ``bench/bf16_greedy_check.py`` measures that term on the test models, in spacings, over 200
#: prompts x 24 positions: median 3.06, p99 4.35, max 7.05 (results/bench/bf16_greedy_check.json;
#: ``tests/test_gpu.py`` re-checks 2 + 2 * p99 <= the margin). 2 + 2 * 7.05 = 16.1: 16 covers
#: every position but the rarest at that worst-case alignment.
NEAR_TIE_ULPS = 16
#: float32: a fixed margin, ~2^13 spacings at |logit| ~ 8, far above summation-order differences
FLOAT32_MARGIN = 1e-3


def spacing(dtype: torch.dtype, x: torch.Tensor) -> torch.Tensor:
    """The distance between adjacent values of ``dtype`` at |x| (its resolution there): eps * 2^floor(log2|x|)."""
    fi = torch.finfo(dtype)
    mag = x.abs().float().clamp_min(fi.tiny)
    return fi.eps * torch.exp2(torch.floor(torch.log2(mag)))


def near_tie_margin(dtype: torch.dtype, top1: torch.Tensor) -> torch.Tensor:
    """Per position: the top-2 gap below which another kernel's rounding may flip the argmax."""
    if dtype in (torch.bfloat16, torch.float16):
        return NEAR_TIE_ULPS * spacing(dtype, top1)
    if dtype == torch.float32:
        return torch.full_like(top1.float(), FLOAT32_MARGIN)
    return torch.zeros_like(top1.float())  # float64: exact equality expected


def greedy_mismatch(model, prompt: list[int], ref: list[int], out: list[int]) -> str | None:
    """The check of a lossless decoder's T=0 output ``out`` against target greedy decoding ``ref``
    in a low-precision dtype: they may differ only from a position where the target's top-2
    logits (one full pass over ``prompt`` + the shared prefix) lie within ``near_tie_margin``,
    where another kernel's rounding may flip the argmax (every later token then differs).
    None when the check passes, else why not."""
    if len(out) != len(ref):
        return f"{len(out)} tokens, greedy decoding made {len(ref)}"
    d = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), None)
    if d is None:
        return None
    param = next(model.parameters())
    ids = torch.tensor([prompt + ref[:d]], device=param.device)
    with torch.no_grad():
        top2 = model(input_ids=ids).logits[0, -1].float().topk(2).values
    gap, margin = float(top2[0] - top2[1]), float(near_tie_margin(param.dtype, top2[:1])[0])
    if gap < margin:
        return None
    return (f"differs from greedy decoding at position {d} of {len(ref)}, where the target's top-2 "
            f"logits are {gap:.4g} apart (no near-tie: margin {margin:.4g})")


# ------------------------------------------------------------------------- measurement
def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def hf_assisted(target, draft, prompt, n, warping, gamma, seed) -> list[int]:
    """transformers' assisted generation, ``gamma`` draft tokens per step (constant schedule,
    confidence stopping off: ``bench/speed.py``'s ``hf_assisted`` row)."""
    kw = dict(max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    if warping.greedy:
        kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kw.update(do_sample=True, temperature=warping.temperature, top_k=warping.top_k or None,
                  top_p=warping.top_p)
    gc = draft.generation_config
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = (
        gamma, "constant", 0.0)
    torch.manual_seed(seed)
    inp = torch.tensor([prompt], device=target.device)
    out = target.generate(inp, attention_mask=torch.ones_like(inp), assistant_model=draft, **kw)
    return out[0, len(prompt):].tolist()


def ours(target, draft, name, prompt, n, warping, gamma, seed) -> tuple[list[int], dict]:
    """Our decoder ``name`` through ``Engine.generate`` (no EOS: exactly ``n`` tokens)."""
    from mtad.core.engine import Engine

    res = Engine(target, draft, load_decoder(name, gamma=gamma), warping).generate(prompt, n, seed=seed)
    return res.output_ids, {"steps": res.num_steps, "accepted": res.accepted,
                            "block_efficiency": res.block_efficiency}


def run_once(method, target, draft, prompt, n, warping, gamma, seed, count_syncs=False) -> dict:
    """One call of ``method`` (``hf_assisted`` or one of our decoders), timed."""
    from mtad.run.probes import HookTimer, SyncCounter

    timers = [HookTimer(target), HookTimer(draft)]
    counter = SyncCounter([target, draft]) if count_syncs else None
    try:
        sync()
        t0 = time.perf_counter()
        with counter or _nothing():
            if method == "hf_assisted":
                ids, extra = hf_assisted(target, draft, prompt, n, warping, gamma, seed), {}
            else:
                ids, extra = ours(target, draft, method, prompt, n, warping, gamma, seed)
            sync()
        wall = time.perf_counter() - t0
        fwd = [t.timer.seconds for t in timers]
    finally:
        for t in timers:
            t.remove()
    row = {"method": method, "tokens": len(ids), "wall_s": wall, "forward_s": sum(fwd),
           "target_passes": timers[0].calls, "draft_passes": timers[1].calls, "ids": ids, **extra,
           "overhead_ms_per_pass": 1000 * (wall - sum(fwd)) / max(timers[0].calls, 1)}
    if counter is not None:
        row.update(explicit_syncs=counter.explicit, explicit_sync_s=counter.explicit_s,
                   implicit_syncs=counter.implicit, sync_sites=dict(counter.sites.most_common(12)))
    return row


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------------------- phases
def phase_tests(args, budget_s: float) -> dict:
    if args.skip_pytest:
        return {"status": "skipped", "reason": "--skip-pytest"}
    if importlib.util.find_spec("pytest") is None:
        return {"status": "skipped", "reason": "pytest is not installed (pip install pytest)"}
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
           str(ROOT / "tests" / "test_gpu.py")]
    log = Path(args.out) / "pytest.log"
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget_s)
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = f"{e.stdout or ''}{e.stderr or ''}\n[timed out after {budget_s:.0f} s]", None
    log.write_text(text if isinstance(text, str) else text.decode(errors="replace"))
    summary = next((ln.strip("= ") for ln in reversed(text.splitlines()) if re.search(r"\d+ (passed|failed|skipped|error)", ln)), "")
    ran = args.dry_run or " passed" in summary  # on a GPU, all skipped means CUDA was not seen
    return {"status": "ok" if rc == 0 and ran else "failed", "returncode": rc, "summary": summary,
            "command": " ".join(cmd[1:]), "log": "pytest.log"}


def phase_forward(models, args) -> dict:
    """Median ms per k-token pass (pending endpoint + k-1 chain nodes) on a fixed cache."""
    from mtad.core.runner import ModelRunner

    out = {}
    gen = torch.Generator().manual_seed(0)
    for name, model in models.items():
        vocab = model.config.vocab_size
        prefix = torch.randint(2, vocab, (args.prefix,), generator=gen).tolist()
        chain = torch.randint(2, vocab, (max(args.ks),), generator=gen).tolist()
        runner = ModelRunner(model, name=name)
        runner.prefill(prefix)
        times: dict[int, list[float]] = {k: [] for k in args.ks}
        for rep in range(args.forward_repeats + 1):  # the first round warms up
            for k in sorted(args.ks, key=lambda k: hash((k, rep)) % 997):
                runner.begin(prefix)
                before = runner.forward_time
                runner.forward(chain[: k - 1], list(range(k - 1)))
                runner.end(prefix)
                sync()
                if rep:
                    times[k].append(runner.forward_time - before)
        med = {k: 1000 * statistics.median(v) for k, v in times.items()}
        out[name] = {"ms_per_pass": med, "ratio_to_k1": {k: v / med[1] for k, v in med.items()},
                     "params_millions": sum(p.numel() for p in model.parameters()) / 1e6}
    return {"status": "ok", "cache_tokens": args.prefix, "models": out}


def phase_overhead(target, drafts, args, deadline: float = float("inf")) -> dict:
    from mtad.core.warping import Warping

    # plain: T=1 without top-k or top-p, where draws and multi-draft walks run on the device
    modes = {"greedy": Warping(0.0), "sample": Warping(1.0, top_k=10, top_p=0.9), "plain": Warping(1.0)}
    methods = ["spd", "tree_mtad", "hf_assisted"]
    prompt = torch.randint(2, target.config.vocab_size, (args.prefix,),
                           generator=torch.Generator().manual_seed(1)).tolist()
    rows, counts, cut = [], [], []
    # greedy first: a case cut short by the deadline loses sampling, not the HF token comparison
    for mode, draft_name in [(m, d) for m in modes for d in drafts]:
        w, draft = modes[mode], drafts[draft_name]
        if time.perf_counter() > deadline:
            cut.append(f"{draft_name}/{mode}")
            continue
        for m in methods:  # warm-up
            run_once(m, target, draft, prompt, 4, w, args.gamma, 0)
        for rep in range(args.repeats):
            shift = rep % len(methods)
            for m in methods[shift:] + methods[:shift]:
                r = run_once(m, target, draft, prompt, args.max_new_tokens, w, args.gamma, rep)
                rows.append({"draft": draft_name, "mode": mode, "repeat": rep, **r})
        for m in methods:
            r = run_once(m, target, draft, prompt, args.max_new_tokens, w, args.gamma, 0, count_syncs=True)
            counts.append({"draft": draft_name, "mode": mode, **r})
    summary = []
    for key in sorted({(r["draft"], r["mode"], r["method"]) for r in rows}):
        rs = [r for r in rows if (r["draft"], r["mode"], r["method"]) == key]
        c = next(c for c in counts if (c["draft"], c["mode"], c["method"]) == key)
        passes = max(c["target_passes"], 1)
        summary.append({
            "draft": key[0], "mode": key[1], "method": key[2],
            "tokens_per_s": statistics.median(r["tokens"] / r["wall_s"] for r in rs),
            "overhead_ms_per_pass": statistics.median(r["overhead_ms_per_pass"] for r in rs),
            "forward_share": statistics.median(r["forward_s"] / r["wall_s"] for r in rs),
            "tokens_per_target_pass": statistics.median(r["tokens"] / max(r["target_passes"], 1) for r in rs),
            "explicit_syncs_per_pass": c["explicit_syncs"] / passes,
            "implicit_syncs_per_pass": None if c["implicit_syncs"] is None else c["implicit_syncs"] / passes,
            "sync_sites": c["sync_sites"]})
    greedy_equal = {}
    for draft_name in drafts:
        a = [r["ids"] for r in rows if (r["draft"], r["mode"], r["method"]) == (draft_name, "greedy", "spd")]
        b = [r["ids"] for r in rows if (r["draft"], r["mode"], r["method"]) == (draft_name, "greedy", "hf_assisted")]
        same = [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), len(p)) for p, q in zip(a, b)]
        greedy_equal[draft_name] = {"equal_runs": f"{sum(s == len(a[0]) for s in same)}/{len(same)}",
                                    "first_difference": same}
    return {"status": "ok", "summary": summary, "spd_vs_hf_greedy_tokens": greedy_equal, "cut_short": cut,
            "rows": rows, "sync_counts": counts, "max_new_tokens": args.max_new_tokens,
            "gamma": args.gamma, "prompt_tokens": args.prefix}


def phase_energy(target, draft, args) -> dict:
    from mtad.core.warping import Warping
    from mtad.run.energy import EnergyMeter

    meter = EnergyMeter.for_models(target, draft)
    if not meter.available:
        return {"status": "unavailable", "reason": meter.reason}
    w = Warping(1.0, top_k=10, top_p=0.9)
    prompt = torch.randint(2, target.config.vocab_size, (args.prefix,),
                           generator=torch.Generator().manual_seed(2)).tolist()
    sync()
    meter.start()
    t0 = time.perf_counter()
    time.sleep(args.energy_window_s / 2)
    idle, idle_s = meter.stop(), time.perf_counter() - t0
    rows = []
    methods = ["spd", "tree_mtad"]
    for rep in range(2):
        for m in methods[rep % 2:] + methods[: rep % 2]:
            tokens, runs = 0, 0
            sync()
            meter.start()
            t0 = time.perf_counter()
            while runs == 0 or time.perf_counter() - t0 < args.energy_window_s:
                tokens += len(ours(target, draft, m, prompt, args.max_new_tokens, w, args.gamma, 100 * rep + runs)[0])
                runs += 1
            sync()
            seconds, joules = time.perf_counter() - t0, meter.stop()
            rows.append({"method": m, "repeat": rep, "runs": runs, "tokens": tokens, "seconds": seconds,
                         "joules": joules, "j_per_token": None if joules is None else joules / tokens,
                         "watts": None if joules is None else joules / seconds})
    per = {m: statistics.median(r["j_per_token"] for r in rows if r["method"] == m)
           for m in methods if all(r["j_per_token"] is not None for r in rows)}
    return {"status": "ok", "source": meter.source, "devices": meter.devices,
            "idle_watts": None if idle is None else idle / idle_s,
            "j_per_token": per, "rows": rows}


# ---------------------------------------------------------------------------- the run
def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="output folder (default results/gpu_check/<host>-<time>)")
    ap.add_argument("--dry-run", action="store_true", help="every phase on the CPU, tiny shapes (seconds)")
    ap.add_argument("--skip-pytest", action="store_true", help="leave out the tests phase")
    ap.add_argument("--budget-s", type=float, default=300.0, help="phases that would overrun it are skipped")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None, help="timed runs of each method and case")
    ap.add_argument("--gamma", type=int, default=4)
    args = ap.parse_args(argv)
    dry = args.dry_run
    if dry:
        torch.set_num_threads(1)  # tiny shapes: one thread is fastest, and shares a busy machine
    args.device, args.dtype = ("cpu", torch.float32) if dry else ("cuda", torch.bfloat16)
    args.max_new_tokens = args.max_new_tokens or (8 if dry else 64)
    args.repeats = args.repeats or (1 if dry else 3)
    args.prefix, args.forward_repeats = (16, 2) if dry else (128, 10)
    args.ks = list(range(1, 5 if dry else 17))
    args.energy_window_s = 0.05 if dry else 3.0
    # seconds each phase needs at most on a GPU (estimates; the dry run takes seconds in all)
    args.estimates = {"tests": 150, "forward": 30, "overhead": 100, "energy": 20}
    if args.out is None:
        import platform

        args.out = str(ROOT / "results" / "gpu_check" / f"{platform.node() or 'host'}-{time.strftime('%Y%m%d-%H%M%S')}")
    return args


def stack_line() -> str:
    """The stack found, one line: Python, torch (its CUDA build), transformers and the other packages
    the check uses (``missing`` where absent)."""
    import platform
    from importlib import metadata

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "missing"

    pkgs = ", ".join(f"{n} {version(n)}" for n in ("transformers", "numpy", "pytest", "nvidia-ml-py"))
    return (f"stack: python {platform.python_version()}, torch {torch.__version__} "
            f"(CUDA build: {torch.version.cuda or 'none'}), {pkgs}")


def main(argv=None) -> int:
    args = parse_args(argv)
    from mtad.core.stack import StackError, check_versions
    from mtad.core.stack import record as stack_record

    print(stack_line(), flush=True)
    try:  # before any model is built: a stack outside the tested range is refused
        check_versions()
    except StackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.dry_run and not torch.cuda.is_available():
        print(f"no CUDA device: torch {torch.__version__} (CUDA build: {torch.version.cuda or 'none'}) "
              "sees none; run on a GPU node, or pass --dry-run for the CPU dry run", file=sys.stderr)
        return 2
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from mtad.run.provenance import provenance

    record = {"dry_run": args.dry_run, "device": args.device, "dtype": str(args.dtype).removeprefix("torch."),
              "budget_s": args.budget_s, "provenance": provenance(seed=0), "phases": {},
              "shapes": {k: asdict(v) for k, v in SHAPES["dry" if args.dry_run else "gpu"].items()}}
    record["provenance"]["packages"]["transformers"] = importlib.import_module("transformers").__version__
    record["provenance"]["packages"]["torch"] = torch.__version__
    shapes = SHAPES["dry" if args.dry_run else "gpu"]
    models: dict = {}

    def left() -> float:
        return args.budget_s - (time.perf_counter() - start)

    def phase(name: str, fn) -> None:
        need = 0 if args.dry_run else args.estimates[name]
        if left() < need:
            res = {"status": "skipped", "reason": f"{left():.0f} s of the budget left, needs ~{need} s"}
        else:
            t0 = time.perf_counter()
            try:
                res = fn()
            except Exception as e:  # recorded, and the next phase runs
                res = {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            res["seconds"] = time.perf_counter() - t0
        record["phases"][name] = res
        print(f"[{time.perf_counter() - start:6.1f} s] {name}: {res['status']}"
              + (f" ({res.get('reason') or res.get('error') or res.get('summary')})" if res["status"] != "ok"
                 or res.get("summary") and isinstance(res["summary"], str) else ""), flush=True)
        record["seconds"] = time.perf_counter() - start
        record["provenance"]["stack"] = stack_record()  # with the cache probes the phase ran
        (out / "gpu_check.json").write_text(json.dumps(record, indent=1, default=str))

    def need_models():
        if not models:
            t0 = time.perf_counter()
            for i, (name, shape) in enumerate(shapes.items()):
                models[name] = build_model(shape, args.dtype, args.device, seed=i)
            models["self_draft"] = copy.deepcopy(models["target_152k"])
            record["build_s"] = time.perf_counter() - t0
        return models

    phase("tests", lambda: phase_tests(args, max(min(args.estimates["tests"], left() - 120), 30)))
    phase("forward", lambda: phase_forward({k: v for k, v in need_models().items() if k != "self_draft"}, args))
    phase("overhead", lambda: phase_overhead(need_models()["target_152k"],
                                             {"small": models["draft_152k"], "self": models["self_draft"]}, args,
                                             deadline=start + args.budget_s - args.estimates["energy"] - 5))
    phase("energy", lambda: phase_energy(need_models()["target_152k"], models["draft_152k"], args))
    if torch.cuda.is_available():
        record["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 1024**3
    record["seconds"] = time.perf_counter() - start
    (out / "gpu_check.json").write_text(json.dumps(record, indent=1, default=str))
    (out / "report.md").write_text(report(record))
    bad = [k for k, v in record["phases"].items() if v["status"] in ("error", "failed")]
    print(f"written: {out}/ (gpu_check.json, report.md{', pytest.log' if (out / 'pytest.log').exists() else ''}) "
          f"in {record['seconds']:.1f} s" + (f"; failed: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


def report(rec: dict) -> str:
    dev = rec["provenance"]["device"]
    gpu = dev.get("gpu") or {}
    pk = rec["provenance"]["packages"]
    lines = [f"# GPU check{' (CPU dry run)' if rec['dry_run'] else ''}", "",
             f"- torch {pk.get('torch')} (CUDA {gpu.get('cuda')}), transformers {pk.get('transformers')}, "
             f"driver {gpu.get('driver')}, {gpu.get('count', 0)} GPU(s): "
             + (", ".join(f"{d['name']} (cc {d['compute_capability']}, {d['memory_gib']} GiB)"
                          for d in gpu.get("devices", [])) or "none"),
             f"- git {rec['provenance']['git'].get('commit')} (dirty: {rec['provenance']['git'].get('dirty')}); "
             f"{rec['seconds']:.0f} s; {rec['dtype']} models on {rec['device']}", "",
             "| phase | status | seconds | note |", "| --- | --- | ---: | --- |"]
    for name, p in rec["phases"].items():
        note = p.get("reason") or p.get("error") or (p.get("summary") if isinstance(p.get("summary"), str) else "")
        lines.append(f"| {name} | {p['status']} | {p.get('seconds', 0):.1f} | {note} |")
    fw = rec["phases"].get("forward", {})
    if fw.get("status") == "ok":
        ks = [k for k in (1, 2, 4, 8, 16) if k in next(iter(fw["models"].values()))["ms_per_pass"]]
        lines += ["", f"## ms per k-token pass (cache {fw['cache_tokens']} tokens)", "",
                  "| model | params (M) | " + " | ".join(f"k={k}" for k in ks) + " |",
                  "| --- | ---: |" + " ---: |" * len(ks)]
        for name, m in fw["models"].items():
            lines.append(f"| {name} | {m['params_millions']:.0f} | "
                         + " | ".join(f"{m['ms_per_pass'][k]:.2f}" for k in ks) + " |")
    ov = rec["phases"].get("overhead", {})
    if ov.get("status") == "ok":
        lines += ["", f"## Ours vs transformers' assisted generation ({ov['max_new_tokens']} tokens, gamma "
                  f"{ov['gamma']})", "", "overhead = (wall - forward of both models) / target passes; "
                  "syncs per target pass: explicit `torch.cuda.synchronize` / implicit outside forward passes", "",
                  "| draft | mode | method | tok/s | overhead ms/pass | fwd share | tokens/pass | syncs/pass |",
                  "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
        for s in ov["summary"]:
            imp = "-" if s["implicit_syncs_per_pass"] is None else f"{s['implicit_syncs_per_pass']:.1f}"
            lines.append(f"| {s['draft']} | {s['mode']} | {s['method']} | {s['tokens_per_s']:.1f} | "
                         f"{s['overhead_ms_per_pass']:.2f} | {s['forward_share']:.0%} | "
                         f"{s['tokens_per_target_pass']:.2f} | {s['explicit_syncs_per_pass']:.1f} / {imp} |")
        lines += ["", "Greedy SpD tokens equal to HF assisted: "
                  + ", ".join(f"{k} draft {v['equal_runs']}" for k, v in ov["spd_vs_hf_greedy_tokens"].items())
                  + " (bf16: a near-tie may flip an argmax; `first_difference` in the JSON)."]
    en = rec["phases"].get("energy", {})
    if en.get("status") == "ok" and en.get("j_per_token"):
        lines += ["", f"## Energy ({en['source']}, {', '.join(en['devices'])}; idle "
                  f"{en['idle_watts'] or 0:.0f} W)", ""]
        lines += [f"- {m}: {j:.3f} J/token" for m, j in en["j_per_token"].items()]
    elif en:
        lines += ["", f"Energy: {en['status']} ({en.get('reason') or en.get('error', '')})"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

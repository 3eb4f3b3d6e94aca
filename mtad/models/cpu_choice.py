"""Which offline pair suits this CPU: bfloat16 where the CPU multiplies it fast, else float32.

``conf/model/qwen_coder_offline_auto.yaml`` (the default pair) takes its name, dtypes and
kernels from ``${mtad_cpu_pair:KEY}``, an OmegaConf resolver that reads KEY from the pair
:func:`choose` picks, so the auto pair resolves to exactly one of

- ``qwen_coder_offline``: bfloat16 target, float32 draft with weight-only int8 (``int8w``);
- ``qwen_coder_offline_avx2``: float32 everywhere, ``wxt`` kernels.

The choice rests on two detections, so that the machine's load at the moment cannot flip it:

- **The hardware** (:func:`bf16_hardware`): bfloat16 dot products in hardware (``avx512_bf16``,
  ``amx_bf16`` or Arm ``bf16`` in the CPU flags) with torch's oneDNN bfloat16 path available
  (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``) is ``native``; an x86 CPU without any
  AVX-512 and without those flags is ``emulated`` (bfloat16 converted to float32 in software);
  anything else (AVX-512 without BF16, other architectures) is undecided.
- **The probe** (:func:`probe_bf16`): the target's largest linear (1536 -> 8960, Qwen2.5-Coder-
  1.5B's MLP) on 1 and 8 rows in bfloat16 (``default`` kernel) and in float32 (``wxt``), timed in
  the CPU time of one thread (``time.thread_time``; torch held to one thread for the probe), the
  two dtypes interleaved round by round, the ratio the median of the rounds' ratios. Wall time
  measured load: a process preempted by others waits, and with two threads the slower one sets
  the pace (on an AMD EPYC with ``avx512_bf16`` the earlier wall-clock probe read 0.88 under load
  and 0.31 quiet). CPU time counts the work, which other processes change far less (not at
  all would be too strong: caches and memory are shared; on a busy AVX2 machine the ratio
  moved between 1.07 and 1.61, where the wall-clock probe moved between 0.57 and 1.80), hence
  the hardware first and the probe as its check.

:func:`decide`: an undecided CPU takes bfloat16 when the ratio is at most ``BF16_MAX_RATIO``; a
``native`` one takes bfloat16 unless bfloat16 measures slower than float32 (ratio above
``NATIVE_OVERRULE``: a torch build that does not use the hardware); an ``emulated`` one takes
float32 unless bfloat16 measures clearly faster (below ``EMULATED_OVERRULE``). Only a
measurement far from the threshold overrules the hardware. The CPU's model, flags, torch's
``get_cpu_capability()`` and the oneDNN answer are recorded with the measurement.

The decision is made once per machine and kept in ``<cache>/cpu_choice.json`` (``mtad.core.io.
cache_dir``), keyed by CPU model, flags and torch version, so that a machine always
resolves the auto pair the same way: the resolved dtype is part of a point's identity, a flip
between runs would split one point in two. ``python -m mtad.models.cpu_choice --reprobe``
measures again. This module knows nothing about runs; it never sees an unresolved ``auto``
reach a record, because the resolver returns concrete values only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from mtad.core.machine import cpu_info

CONF_MODEL_DIR = Path(__file__).resolve().parents[2] / "conf" / "model"
AUTO_PAIR = "qwen_coder_offline_auto"
BF16_PAIR = "qwen_coder_offline"
FP32_PAIR = "qwen_coder_offline_avx2"
#: bfloat16 is chosen when its probe time is at most this fraction of float32's.
BF16_MAX_RATIO = 0.8
#: (in_features, out_features) of the probed linear and the row counts timed.
PROBE_SHAPE = (1536, 8960)
PROBE_ROWS = (1, 8)
PROBE_REPEATS = 7
CACHE_FILE = "cpu_choice.json"
RESOLVER = "mtad_cpu_pair"
#: A ``native`` CPU takes float32 only when bfloat16 measures above this (slower than float32);
#: an ``emulated`` one takes bfloat16 only when it measures below this.
NATIVE_OVERRULE = 1.0
EMULATED_OVERRULE = 0.6
#: Version of the probe and rule: a new version decides again instead of reading an old entry
#: (version 1: wall-clock probe alone; 2: hardware, and a CPU-time probe as its check).
PROBE_VERSION = "2"


@dataclass
class Choice:
    """The pair chosen for this CPU, and what the choice rests on."""

    pair: str  # BF16_PAIR or FP32_PAIR
    dtype: str  # the target's dtype in that pair
    reason: str
    probe: dict[str, Any] = field(default_factory=dict)  # ms per call, ratio (see probe_bf16)
    cpu: dict[str, Any] = field(default_factory=dict)  # model, vendor, capability, isa (mtad.core.machine)
    decided_utc: str | None = None
    basis: str = ""  # "hardware", "probe", or "probe over hardware" (version 1 entries: "")
    cached: bool = False  # read from the per-machine cache rather than measured in this process

    def line(self) -> str:
        """One line for the start of a run."""
        cpu = self.cpu
        src = "cached" if self.cached else "measured"
        return (f"model={AUTO_PAIR} -> {self.pair} (target {self.dtype}) on {cpu.get('model')} "
                f"[{cpu.get('torch_capability')}, native bf16: {'yes' if cpu.get('native_bf16') else 'no'}]: "
                f"{self.reason} ({src}; python -m mtad.models.cpu_choice --reprobe measures again)")


def probe_bf16(repeats: int = PROBE_REPEATS, shape: tuple[int, int] = PROBE_SHAPE,
               rows: tuple[int, ...] = PROBE_ROWS) -> dict[str, Any]:
    """Time one target-sized linear in bfloat16 (``default``) and float32 (``wxt``), in CPU time.

    One thread; each round calls every (dtype, rows) once, interleaved. Returns the least CPU ms
    per call of each (dtype, rows), each round's ratio (bfloat16 over float32, summed over
    ``rows``) and ``ratio``, their median. Random weights: speed does not depend on values.
    """
    import statistics

    import torch
    from torch import nn

    from mtad.models.kernels import apply_cpu_kernel

    gen = torch.Generator().manual_seed(0)
    fin, fout = shape
    weight = torch.randn(fout, fin, generator=gen) * fin**-0.5
    layers = {}
    for dtype, kernel in (("bfloat16", "default"), ("float32", "wxt")):
        lin = nn.Linear(fin, fout, bias=False)
        lin.weight.data = weight.to(getattr(torch, dtype))
        layers[dtype] = apply_cpu_kernel(nn.Sequential(lin), kernel)
    xs = {(dt, k): torch.randn(k, fin, generator=gen).to(getattr(torch, dt)) for dt in layers for k in rows}
    best = {key: float("inf") for key in xs}
    round_ratios = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the work of one thread, all of it in this thread's CPU time
    try:
        with torch.inference_mode():
            for key, x in xs.items():  # warm-up: first calls pay for allocation and packing
                layers[key[0]](x)
            for _ in range(repeats):
                spent = dict.fromkeys(layers, 0.0)
                for (dt, k), x in xs.items():
                    t0 = time.thread_time()
                    layers[dt](x)
                    ms = (time.thread_time() - t0) * 1e3
                    best[(dt, k)] = min(best[(dt, k)], ms)
                    spent[dt] += ms
                round_ratios.append(spent["bfloat16"] / max(spent["float32"], 1e-9))
    finally:
        torch.set_num_threads(threads)
    return {
        "shape": list(shape), "rows": list(rows), "repeats": repeats, "threads": 1, "clock": "thread_time",
        "ms": {f"{dt}/{k}": round(best[(dt, k)], 3) for dt, k in best},
        "round_ratios": [round(r, 3) for r in round_ratios],
        "ratio": round(statistics.median(round_ratios), 3),
    }


def onednn_bf16() -> bool | None:
    """Whether this torch can run bfloat16 matmuls through oneDNN on this CPU (None: cannot tell)."""
    try:
        import torch

        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (ImportError, AttributeError, RuntimeError):
        return None


def bf16_hardware(cpu: dict[str, Any], onednn: bool | None) -> str | None:
    """``"native"``, ``"emulated"`` or None (undecided) for a CPU (``mtad.core.machine.cpu_info``)
    and torch's oneDNN bfloat16 answer (:func:`onednn_bf16`)."""
    isa = set(cpu.get("isa") or [])
    if cpu.get("native_bf16") and onednn is not False:
        return "native"
    x86 = str(cpu.get("arch") or "").lower() in ("x86_64", "amd64", "i686", "x86") or "avx2" in isa
    if x86 and not cpu.get("native_bf16") and not any(f.startswith("avx512") for f in isa):
        return "emulated"
    return None


def decide(probe: dict[str, Any], cpu: dict[str, Any], onednn: bool | None = None) -> Choice:
    """The pair for the CPU's bfloat16 hardware (:func:`bf16_hardware`) checked by a probe result
    (``ratio``: bfloat16 CPU time / float32 CPU time)."""
    ratio = float(probe["ratio"])
    hardware = bf16_hardware(cpu, onednn)
    measured = f"bfloat16 matmul takes {ratio:.2f}x the float32 CPU time"
    if hardware == "native":
        bf16 = ratio <= NATIVE_OVERRULE
        basis = "hardware" if bf16 else "probe over hardware"
        reason = (f"bfloat16 in hardware; {measured} (the check)" if bf16 else
                  f"bfloat16 in hardware, but {measured} (> {NATIVE_OVERRULE}): this torch does not use it")
    elif hardware == "emulated":
        bf16 = ratio < EMULATED_OVERRULE
        basis = "probe over hardware" if bf16 else "hardware"
        reason = (f"bfloat16 emulated (no AVX-512), but {measured} (< {EMULATED_OVERRULE})" if bf16 else
                  f"bfloat16 emulated (no AVX-512): float32 is faster here; {measured} (the check)")
    else:
        bf16 = ratio <= BF16_MAX_RATIO
        basis = "probe"
        reason = f"{measured} ({'<=' if bf16 else '>'} {BF16_MAX_RATIO})"
    pair, dtype = (BF16_PAIR, "bfloat16") if bf16 else (FP32_PAIR, "float32")
    probe = {**probe, "hardware": hardware, "onednn_bf16": onednn}
    return Choice(pair=pair, dtype=dtype, reason=reason, probe=probe, cpu=cpu, basis=basis)


def machine_key(cpu: dict[str, Any]) -> str:
    """What the choice depends on: CPU model and flags, torch version and capability, the rule."""
    import torch

    blob = json.dumps({"model": cpu.get("model"), "vendor": cpu.get("vendor"), "isa": cpu.get("isa"),
                       "capability": cpu.get("torch_capability"), "torch": torch.__version__,
                       "probe": PROBE_VERSION, "max_ratio": BF16_MAX_RATIO}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_path() -> Path:
    from mtad.core.io import cache_dir

    return cache_dir() / CACHE_FILE


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def choose(reprobe: bool = False, cpu: dict[str, Any] | None = None, probe=probe_bf16,
           path: Path | None = None, onednn: bool | None | str = "detect") -> Choice:
    """The pair for this machine: from the per-machine cache, else decided and cached.

    ``onednn``: torch's oneDNN bfloat16 answer (default: asked of this torch, :func:`onednn_bf16`).
    """
    from mtad.core.io import write_json_atomic

    cpu = cpu if cpu is not None else cpu_info()
    path = path or cache_path()
    key = machine_key(cpu)
    entries = _read_cache(path)
    if not reprobe and isinstance(entries.get(key), dict):
        try:
            return Choice(**{**entries[key], "cached": True})
        except TypeError:  # an entry of another layout: measure again
            pass
    choice = decide(probe(), cpu, onednn_bf16() if onednn == "detect" else onednn)
    choice.decided_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    entries[key] = {k: v for k, v in asdict(choice).items() if k != "cached"}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, entries)
    except OSError as err:  # a read-only cache: decide again next time
        print(f"warning: cannot keep the CPU choice in {path} ({err}); set MTAD_CACHE to a writable folder",
              file=sys.stderr)
    return choice


@lru_cache(maxsize=1)
def current() -> Choice:
    """This process's choice (made or read once), announced in one line on stderr."""
    choice = choose()
    print(choice.line(), file=sys.stderr, flush=True)
    return choice


def pair_config(name: str) -> dict[str, Any]:
    """``conf/model/<name>.yaml`` as plain data (a file without a defaults list)."""
    from omegaconf import OmegaConf

    path = CONF_MODEL_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"model={name!r}: no {path}; choose one of "
                         f"{sorted(p.stem for p in CONF_MODEL_DIR.glob('*.yaml'))}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def chosen_value(key: str, pair: str | None = None) -> Any:
    """``key`` (dotted, e.g. ``target.dtype``) of the chosen pair's config (``pair``: of that one)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(pair_config(pair or current().pair))
    value = OmegaConf.select(cfg, key, throw_on_missing=True, default=KeyError)
    if value is KeyError:
        raise KeyError(f"${{{RESOLVER}:{key}}}: conf/model/{pair or current().pair}.yaml has no key {key!r}")
    return value


def register_resolver() -> None:
    """Register ``${mtad_cpu_pair:KEY}`` (idempotent); the first use measures or reads the choice."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, lambda key: chosen_value(str(key)))


def weights_needed(name: str) -> list[tuple[str, str]]:
    """``(model id, dtype)`` of the target and draft the pair ``conf/model/<name>.yaml`` loads
    (the auto pair: the chosen pair's, which it resolves to)."""
    cfg = pair_config(current().pair if name == AUTO_PAIR else name)
    if not str(cfg.get("_target_", "")).endswith("offline_pair"):
        raise ValueError(f"model={name!r} is not an offline pair (its _target_ is {cfg.get('_target_')!r}); "
                         "only offline pairs are prepared from the PyPI model packages")
    return [(cfg[role]["id"], cfg[role].get("dtype", "float32")) for role in ("target", "draft")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mtad.models.cpu_choice",
                                description="Show (or measure again) the offline pair chosen for this CPU.")
    p.add_argument("--reprobe", action="store_true", help="measure again and replace the cached choice")
    args = p.parse_args(argv)
    choice = choose(reprobe=args.reprobe)
    print(choice.line())
    print(json.dumps(asdict(choice), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

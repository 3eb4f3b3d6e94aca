"""The C allocator's large-block thresholds for a run's process (glibc's malloc, on Linux).

A CPU run's tensors come from the C library's ``malloc``. glibc serves a block above its *mmap
threshold* with fresh pages of its own mapping, and gives the top of its heap back to the
system once more than its *trim threshold* is free there. Both move by themselves (glibc's
"dynamic threshold": freeing a mapped block raises the mmap threshold to its size, up to
32 MiB), so whether a step's vocabulary-sized tensors (MB each at 151,936 tokens: a tree's
logits, warped rows, a beam's scores) reuse pages already mapped or take fresh ones, each
faulted in and zeroed by the kernel, depends on the order earlier blocks happened to be
freed in. On the tiny pair at 151,936 tokens the same tree-MTAD runs took 46 to 4,887 page
faults a step from one fresh process to the next, and 26-40 with the thresholds fixed
(``results/bench/page_faults_cpu.txt``, ``docs/speed.md``).

``tune()`` fixes both thresholds once per process (``mallopt``; fixing them also turns the
dynamic adjustment off): blocks up to 32 MiB (glibc's largest dynamic value) come from the
heap, and up to 256 MiB of free heap top is kept for the next step instead of being handed
back. A run's peak memory is unchanged; what it keeps after a peak is at most 256 MiB more.
No value a run computes changes. Where it would not apply it does nothing and says why: another
allocator preloaded (jemalloc, tcmalloc, mimalloc), the thresholds set by the environment
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``), ``MTAD_MALLOC=system``, or not glibc.
Every run calls it (``mtad.run.evaluate.run``: ``mtad-run``, a multirun's or a sweep's jobs,
local or on Slurm), and so do ``mtad-bench``, ``mtad-audit`` and the overhead and speed
benchmarks; the engine, a library, leaves its host process's allocator alone. What was done is
in every run's provenance (``allocator``).
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping
from typing import Any

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest dynamic mmap threshold on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 256 << 20
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
ENV_THRESHOLDS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_state: dict[str, Any] | None = None


def state() -> dict[str, Any]:
    """What ``tune`` did in this process (``{"tuned": False, ...}`` before it ran)."""
    return dict(_state) if _state is not None else {"tuned": False, "why": "not set by mtad in this process"}


def tune(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Fix glibc's mmap and trim thresholds once per process; what was done (``state``)."""
    global _state
    if _state is None:
        _state = _tune(os.environ if env is None else env)
    return state()


def _tune(env: Mapping[str, str]) -> dict[str, Any]:
    if env.get("MTAD_MALLOC", "").strip().lower() == "system":
        return {"tuned": False, "why": "MTAD_MALLOC=system"}
    preload = env.get("LD_PRELOAD", "")
    other = [a for a in OTHER_ALLOCATORS if a in preload]
    if other:
        return {"tuned": False, "why": f"{other[0]} preloaded (LD_PRELOAD)"}
    given = [k for k in ENV_THRESHOLDS if k in env]
    if given:
        return {"tuned": False, "why": f"set by the environment: {', '.join(f'{k}={env[k]}' for k in given)}"}
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return {"tuned": False, "why": f"not glibc ({platform.system()} {' '.join(platform.libc_ver()).strip()})"}
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError) as e:
        return {"tuned": False, "why": f"glibc's mallopt not found: {e}"}
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = {"mmap_threshold": mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1,
            "trim_threshold": mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1}
    if not all(done.values()):
        return {"tuned": False, "why": f"mallopt refused: {[k for k, ok in done.items() if not ok]}"}
    return {"tuned": True, "allocator": f"glibc {platform.libc_ver()[1]}",
            "mmap_threshold": MMAP_THRESHOLD, "trim_threshold": TRIM_THRESHOLD}

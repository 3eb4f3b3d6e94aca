"""What a run ran on: the CPU's model and instruction sets, and the GPUs.

``cpu_info`` reads ``/proc/cpuinfo`` (Linux; elsewhere only what ``platform`` and ``os``
know) and asks torch which vector instruction set its CPU kernels dispatch to
(``torch.backends.cpu.get_cpu_capability()``: ``AVX2``, ``AVX512``, ...). ``gpu_info``
describes the CUDA devices torch sees, with the driver version from NVML when
``nvidia-ml-py`` is installed. This module knows nothing about models or runs.
"""

from __future__ import annotations

import os
import platform
from typing import Any

CPUINFO = "/proc/cpuinfo"
#: CPU flags that decide how fast the matmuls of a run are (what ``cpu_info`` records).
ISA_FLAGS = ("sse4_2", "fma", "f16c", "avx", "avx2", "avx_vnni", "avx512f", "avx512bw", "avx512vl",
             "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
             "asimd", "sve", "bf16", "i8mm")
#: Flags that mean bfloat16 matmuls run in hardware (x86: AVX-512 BF16, AMX; Arm: BF16).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def read_cpuinfo(path: str = CPUINFO) -> list[dict[str, str]]:
    """One ``{field: value}`` per processor block of ``path``; [] when it cannot be read."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return []
    blocks = []
    for block in text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if fields:
            blocks.append(fields)
    return blocks


def cpu_flags(path: str = CPUINFO) -> set[str]:
    """The CPU feature flags (x86 ``flags``, Arm ``Features``) of this machine; empty if unknown."""
    for block in read_cpuinfo(path):
        value = block.get("flags", block.get("Features"))
        if value is not None:
            return set(value.split())
    return set()


def _torch_capability() -> str | None:
    try:
        import torch

        return torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        return None


def _usable_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def cpu_info(path: str = CPUINFO) -> dict[str, Any]:
    """The CPU: model name, vendor, torch's kernel capability, ISA flags, cores and threads.

    ``logical_cpus`` counts the processor entries (hardware threads), ``physical_cores``
    the distinct (socket, core) pairs (None when ``/proc/cpuinfo`` does not say),
    ``usable_cpus`` the ones this process may run on (its affinity mask).
    """
    blocks = read_cpuinfo(path)
    first = blocks[0] if blocks else {}
    flags = cpu_flags(path)
    cores = {(b.get("physical id"), b.get("core id")) for b in blocks if "core id" in b}
    return {
        "model": first.get("model name") or first.get("Model") or platform.processor() or None,
        "vendor": first.get("vendor_id") or first.get("CPU implementer") or None,
        "arch": platform.machine(),
        "torch_capability": _torch_capability(),
        "isa": [f for f in ISA_FLAGS if f in flags],
        "native_bf16": bool(flags & set(NATIVE_BF16_FLAGS)),
        "logical_cpus": len(blocks) or os.cpu_count(),
        "physical_cores": len(cores) or None,
        "usable_cpus": _usable_cpus(),
    }


def _driver_version() -> str | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def gpu_info() -> dict[str, Any] | None:
    """The CUDA devices torch sees (name, compute capability, memory), driver and CUDA versions.

    None when torch sees no CUDA device.
    """
    import torch

    if not torch.cuda.is_available():
        return None
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append({"name": p.name, "compute_capability": f"{p.major}.{p.minor}",
                        "memory_gib": round(p.total_memory / 1024**3, 1)})
    return {"count": len(devices), "devices": devices, "driver": _driver_version(),
            "cuda": torch.version.cuda}

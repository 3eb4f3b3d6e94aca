"""Atomic JSON and JSON-lines files: a crash never leaves a half-written JSON file, and a torn
JSON-lines tail is found (``scan_jsonl``) and cut off (``rewrite_jsonl``) instead of being
glued to the next record. And where the project keeps what it downloads or builds outside the
checkout (``cache_dir``: converted models, the CPU kernel choice, task data fetched on demand).

Results folders travel (shared sweeps, downloaded records), so their files are opened the way
tar and rsync extract untrusted input:

- **Reading**: a file is opened without following a link in its last component and without
  blocking (``O_NOFOLLOW | O_NONBLOCK``), then ``fstat`` of the opened descriptor must say
  *regular file*; a link, FIFO, device, socket or folder where a file belongs is refused at
  once (``UnsafeResultsFile``, one line naming the path and what it is). JSON files are read
  only up to their cap (``JSON_CAPS`` by file name, else ``MAX_JSON_BYTES``), checked on the
  size before any byte is read; JSON-lines files are streamed line by line with
  ``MAX_LINE_BYTES`` per line, so a huge or sparse file is never held whole.
- **Writing**: whole files are written into a new temp file beside the target (``mkstemp``:
  ``O_CREAT | O_EXCL``, never an existing name) and renamed over it: a link in the target's
  place is replaced, never written through. Appends (``append_jsonl``, ``open_append``) open
  with ``O_NOFOLLOW`` and refuse anything but a regular file.
- **Folders**: the folder a user names (a run folder, a sweep, ``--out``) may be reached
  through links: that is the user's own choice. Below it nothing is followed: a folder found
  by walking a results tree (a sweep's point folders, ``.hydra/``) is used only when it is a
  real folder (``refuse_link``, ``real_folder``), so no link inside a results folder leads a
  reader or a writer out of it.

This module knows nothing about what the records mean (``mtad.core.records`` does).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

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


#: a repository's own config can name a program for git to start even in a read-only command:
#: a file-system monitor on any index read, a signature checker when ``git log`` shows signatures,
#: a pager; an external diff and a text conversion are turned off per command (``--no-ext-diff``,
#: ``--no-textconv``) by the callers that diff
GIT_NO_PROGRAMS = ("-c", "core.fsmonitor=false", "-c", "log.showSignature=false", "-c", "core.pager=cat")


def git(root: Path, *args: str, text: bool = True, **kwargs: Any):
    """``git -C root ARGS`` with ``GIT_NO_PROGRAMS``, its output captured, never raising on a
    non-zero exit: every git this project runs on a repository goes through here (the checkout
    itself, or one a caller names). OSError where git is missing."""
    import subprocess

    return subprocess.run(["git", *GIT_NO_PROGRAMS, "-C", str(root), *args], capture_output=True, text=text,
                          check=False, **kwargs)


def is_commit_name(name: str) -> bool:
    """A stored commit hash (4 to 40 hex digits): the only form of a stored value that is passed
    to git (never as an option: a value starting with "-" would be one)."""
    return isinstance(name, str) and 4 <= len(name) <= 40 and all(c in "0123456789abcdef" for c in name.lower())


def not_git_ignored(paths: list[Path], checkout: Path | None = None) -> list[Path]:
    """``paths`` less those git ignores: what a checkout keeps, without the run outputs it ignores
    (``results/runs/``, ``outputs/``: ``.gitignore``), so that "every record under results/" means
    the same before and after ``make run``. Tracked files are never dropped (git ignores only
    untracked ones); outside a git work tree, or without git, every path stays.

    Git runs in ``checkout`` only (by default the one this code is in; tests name another) and is
    asked only of paths inside it (``git``: no program its config names): a results folder from
    anyone may hold a ``.git`` of its own, whose config could name a program for git to run, and
    git must never be started inside it."""
    if not paths:
        return paths
    root = (checkout or REPO_ROOT).resolve()
    full = [Path(p).resolve() for p in paths]
    inside = [str(f) for f in full if f.is_relative_to(root)]
    if not inside:
        return paths
    try:
        got = git(root, "check-ignore", "-z", "--stdin", input="\0".join(inside).encode(), text=False)
    except OSError:
        return paths
    if got.returncode not in (0, 1):  # 128: not a work tree (an installed package)
        return paths
    ignored = {x for x in got.stdout.decode().split("\0") if x}
    return [p for p, f in zip(paths, full) if str(f) not in ignored]


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write JSON to a temp file in the same folder, then rename: never a half-written file."""
    def dump(f):
        json.dump(obj, f, indent=2, default=str)

    _replace_atomically(Path(path), dump, mkdir=True)


def write_text_atomic(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to a temp file beside ``path``, then rename: a link at ``path`` is replaced,
    never written through (every output file the project writes goes through one of these)."""
    _replace_atomically(Path(path), lambda f: f.write(text), encoding=encoding)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """``write_text_atomic`` for bytes."""
    _replace_atomically(Path(path), lambda f: f.write(data), binary=True)


def save_figure(fig: Any, path: str | Path, **kwargs: Any) -> None:
    """``fig.savefig(path, **kwargs)`` through a temp file renamed over ``path`` (format from the
    suffix): a link at ``path`` is replaced, never written through."""
    path = Path(path)
    _replace_atomically(path, lambda f: fig.savefig(f, format=path.suffix[1:] or "png", **kwargs),
                        binary=True)


#: The longest line ``scan_jsonl`` parses; a longer one is unreadable (``append_jsonl`` refuses to
#: write one). A record is one generation (its text, token ids and per-step counts): far below.
MAX_LINE_BYTES = 16 * 1024 * 1024
_CHUNK = 1024 * 1024


class BadResultsFile(ValueError):
    """A results file parses but holds the wrong types; the message names the file and field."""


class UnsafeResultsFile(BadResultsFile):
    """A results path is a link, FIFO, device, socket or folder where a file belongs (or a link
    where a folder belongs), or a file larger than its cap; the message names it and what it is."""


#: The most bytes of a results-folder JSON file that are read, by file name; any other JSON file
#: read here: ``MAX_JSON_BYTES``. A point file or a resolved config is a few KB, a summary some
#: 10 KB, a sweep's index some 1 KB per point: the caps are hundreds of times what is written.
MAX_JSON_BYTES = 4 * 1024 * 1024
JSON_CAPS = {
    "point.json": 1024 * 1024,
    "config.json": 1024 * 1024,
    "summary.json": 4 * 1024 * 1024,
    "skipped.json": 1024 * 1024,
    "error.json": 4 * 1024 * 1024,  # holds a traceback
    "sweep.json": 64 * 1024 * 1024,
}

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_SAFE = _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
#: errors of ``open`` that mean "not a regular file here" (a link under O_NOFOLLOW, a FIFO without
#: a reader, a socket, a folder opened for writing)
_NOT_A_FILE = {errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EOPNOTSUPP, errno.ENODEV,
               errno.EMLINK}  # EMLINK: O_NOFOLLOW on a link, on the BSDs


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return what
    return "not a regular file"


def _refused(path: str | Path, what: str, want: str = "a regular file") -> UnsafeResultsFile:
    return UnsafeResultsFile(
        f"{path} is {what}, not {want}: results folders are read and written without following "
        "links and only as regular files and folders; replace it with the real one or move it away")


def _what(path: str | Path) -> str:
    try:
        return _kind(os.lstat(path).st_mode)
    except OSError:
        return "not a regular file"


def _open_regular(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """A descriptor of ``path`` opened with ``flags`` plus O_NOFOLLOW / O_NONBLOCK / O_NOCTTY,
    when it is a regular file; UnsafeResultsFile otherwise (at once: nothing blocks).
    FileNotFoundError when it is missing and ``flags`` do not create it."""
    try:
        fd = os.open(path, flags | _SAFE, mode)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno in _NOT_A_FILE:
            raise _refused(path, _what(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refused(path, _kind(st.st_mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(path: str | Path) -> IO[bytes]:
    """``path`` opened for binary reading when it is a regular file (not a link to one);
    UnsafeResultsFile otherwise, FileNotFoundError when missing."""
    return os.fdopen(_open_regular(path, os.O_RDONLY), "rb", buffering=_CHUNK)


def open_append(path: str | Path, encoding: str = "utf-8") -> IO[str]:
    """``path`` opened for appending text (made when missing), when it is a regular file and not
    a link; UnsafeResultsFile otherwise. For log files kept in a results folder."""
    return os.fdopen(_open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", encoding=encoding)


def read_capped(path: str | Path, cap: int) -> bytes:
    """The bytes of regular file ``path`` (``open_file``); UnsafeResultsFile, before anything
    is read, when it holds more than ``cap`` bytes."""
    with open_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(cap + 1) if size <= cap else b""
        if size > cap or len(data) > cap:
            raise UnsafeResultsFile(
                f"{path} holds {max(size, len(data))} bytes, more than a {Path(path).name} may "
                f"({cap}, mtad.core.io.JSON_CAPS); move it away")
    return data


def json_cap(path: str | Path) -> int:
    """The most bytes read of JSON file ``path`` (``JSON_CAPS`` by its name)."""
    return JSON_CAPS.get(Path(path).name, MAX_JSON_BYTES)


def refuse_link(path: str | Path) -> None:
    """UnsafeResultsFile when ``path`` is a link (a folder found inside a results folder is used
    only as itself, never as the way to another place)."""
    if os.path.islink(path):
        raise _refused(path, "a symbolic link", "a real folder or file")


def real_folder(path: str | Path) -> Path:
    """``path`` made when missing; UnsafeResultsFile when it is a link or anything but a folder.
    For folders inside a results folder (``.hydra/``)."""
    path = Path(path)
    try:
        path.mkdir(exist_ok=False)
    except FileExistsError:
        pass
    mode = os.lstat(path).st_mode
    if not stat.S_ISDIR(mode):
        raise _refused(path, _kind(mode), "a real folder")
    return path


def check_entry(path: str | Path, folder: bool = False) -> None:
    """Nothing when ``path`` is missing or is a regular file (with ``folder``: a real folder);
    UnsafeResultsFile naming what it is otherwise (a link is never accepted)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)):
        raise _refused(path, _kind(mode), "a real folder" if folder else "a regular file")


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


def read_json(path: str | Path, cap: int | None = None) -> dict | None:
    """The JSON object in ``path``; None when the file is missing, unreadable (however it fails
    to parse: ``loads``) or not an object. UnsafeResultsFile, before anything is read, when it is
    not a regular file (a link, a FIFO, a device, ...) or holds more than ``cap`` bytes
    (default ``json_cap``)."""
    try:
        raw = read_capped(path, cap if cap is not None else json_cap(path))
    except UnsafeResultsFile:
        raise
    except OSError:
        return None
    try:
        data = loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one record as a single line, flushed and fsynced (a crash loses at most that line).

    A file that does not end with a newline (a torn last line) is refused: appending would
    glue the record to the torn one and lose both. ``rewrite_jsonl`` repairs such a file.
    A link, FIFO, device or folder at ``path`` is refused (UnsafeResultsFile), never written through.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, default=str) + "\n").encode()
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"a record of {len(line)} bytes is longer than a {path.name} line may be "
                         f"({MAX_LINE_BYTES}, mtad.core.io.MAX_LINE_BYTES)")
    fd = _open_regular(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        size = os.fstat(fd).st_size
        if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
            raise ValueError(f"{path} ends with a torn line; repair it before appending")
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


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
    about twice the longest line, not with the file. A link, FIFO, device or folder at ``path``
    is refused at once (UnsafeResultsFile); a missing file has no lines.
    """
    path = Path(path)
    scan = Scan()
    try:
        f = open_file(path)
    except FileNotFoundError:
        return scan
    with f:
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


def _replace_atomically(path: Path, write: Callable[[Any], Any], mkdir: bool = False,
                        binary: bool = False, encoding: str | None = None) -> None:
    """Write through ``write(file)`` into a temp file beside ``path``, fsync, rename over it
    (``replacing``)."""
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, binary=binary, encoding=encoding) as f:
        write(f)


@contextmanager
def replacing(path: str | Path, binary: bool = False, encoding: str | None = "utf-8",
              newline: str | None = None) -> Iterator[IO]:
    """A new temp file beside ``path`` to write into (``open``'s ``encoding`` and ``newline``);
    fsynced and renamed over ``path`` when the block ends without an error, removed otherwise.

    The temp file is new (``mkstemp``: O_CREAT | O_EXCL, never an existing name or link), and a
    rename replaces whatever entry ``path`` is (a link is replaced, its target untouched); a
    folder at ``path`` is refused."""
    path = Path(path)
    if os.path.isdir(path) and not os.path.islink(path):
        raise _refused(path, "a folder")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        f = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding=encoding, newline=newline)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    try:
        with f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp makes 0600; results are meant to be shared
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise

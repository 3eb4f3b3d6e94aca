"""Run untrusted Python (model-written code) in a separate, isolated, limited process.

Isolation, probed once per process (:func:`isolation`):

* ``"bubblewrap"``: the child runs under ``bwrap`` (its absolute path, found once) and
  sees, read-only, only the system's program and library folders (``SYSTEM_PATHS``:
  /usr, /lib*, the loader's cache, the local time zone) and the interpreter's prefix
  (its standard library); the rest of the host (/home, /root, /run, /var, /srv, the
  repository, site-packages, every UNIX socket file outside those folders) is not in
  its view. It gets private tmpfs mounts on /tmp, /var/tmp and /dev/shm of
  ``TMPFS_BYTES`` each (its work folder lives in the private /tmp), a fresh /proc and a
  minimal /dev, new mount, PID, network (no abstract UNIX sockets either), IPC and UTS
  namespaces, a new session (no terminal injection), killed with its parent. A tmpfs
  bounds the bytes written, not the number of empty files (the kernel's inode limit of a
  tmpfs ignores its size); that number is bounded by the time limit only (20,000 to
  45,000 files, 20 to 30 MB of kernel memory, per second on a 2-core machine, freed when
  the child ends). Started as root, the child starts as root with only CAP_SETUID and
  CAP_SETGID and drops to ``nobody`` (uid and gid 65534 on the host) once its imports are
  done, before any untrusted code (the interpreter may live where ``nobody`` cannot read).
  A non-root user gets the same in a new user namespace (uid 65534 inside, further user
  namespaces disabled) where the kernel allows unprivileged user namespaces; the child
  then keeps that user's read access to what it sees (read-only: it can change nothing).
* ``"rlimits"`` (bwrap missing, or it cannot make namespaces here): the earlier
  sandbox only. When started as root the child drops to ``nobody`` after its imports;
  it can read every file and reach every UNIX socket its user can, a child running as a
  normal user can write wherever that user can, and files it writes to world-writable
  folders (/tmp, /dev/shm) outlive the run. A warning is logged once; the HumanEval
  scorer refuses this mode unless it is asked for by name.

In both cases:

* a fresh interpreter (``python -I -S -B``) started without a shell, stdin closed, a
  minimal environment; the program and settings arrive through an inherited file, not
  the command line;
* resource limits set in the child before any untrusted code runs: address space
  (RLIMIT_AS), CPU seconds (RLIMIT_CPU), size of any file it writes (RLIMIT_FSIZE,
  which also caps stdout/stderr: they go to files), process count (RLIMIT_NPROC = 1,
  so it cannot fork), open files, no core dumps;
* process-spawning, signalling and file-removing functions of ``os``/``posix`` are
  replaced and ``subprocess``/``multiprocessing``/``ctypes``/``socket`` cannot be
  imported: defence in depth only (re-importing ``posix`` undoes it), the boundary is
  bubblewrap plus the limits;
* a wall-clock timeout, after which the whole process tree is killed.

Two ways to use it:

* :func:`run_python` runs a program to its end. ``passed`` means the program returned
  normally (the child writes a per-run nonce to a private descriptor after it returns,
  so ``sys.exit(0)`` half way is a failure). The program can read that nonce from its
  own process, so this is no verdict on code that wants to pass; it says the program
  ran to its end.
* :class:`Session` loads a program and then serves calls to one of its functions:
  arguments go in and return values come back as plain data (:mod:`eval.wire`), so the
  caller decides what a result means in its own process (see ``eval.humaneval_pass``).
  A reply is refused past ``MAX_REPLY`` bytes, ``MAX_REPLY_VALUES`` values or
  ``MAX_REPLY_KEYS`` set elements and dict keys (counted before anything is built), and
  reading it stops at the session's deadline.

It knows nothing of benchmarks or tests; what the verdict is belongs to the caller.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from eval import wire

log = logging.getLogger(__name__)

# Modules imported before the program runs (and, under rlimits as root, before privileges
# are dropped), so that test code can use them whatever the unprivileged user may read.
PRELOAD = (
    "abc array ast base64 binascii bisect builtins calendar cmath collections "
    "collections.abc contextlib copy dataclasses datetime decimal difflib enum "
    "fractions functools hashlib heapq io itertools json keyword math numbers "
    "operator pprint queue random re statistics string struct textwrap time "
    "traceback types typing unicodedata warnings zlib"
).split()

UNPRIVILEGED_UID = 65534  # nobody
UNPRIVILEGED_GID = 65534  # nogroup
ISOLATIONS = ("bubblewrap", "rlimits")
# What the child sees of the host under bubblewrap, read-only, besides the interpreter's prefix.
SYSTEM_PATHS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/localtime")
# Writable folders of the child: private tmpfs mounts, each holding at most TMPFS_BYTES.
PRIVATE_TMPFS = ("/tmp", "/var/tmp", "/dev/shm")
TMPFS_BYTES = 32 * 1024 * 1024
# Bytes of one call's arguments (written by the caller's own code).
MAX_ARGUMENTS = 16 * 1024 * 1024
# Bounds on one reply of a Session's child, which the caller's process parses. The largest
# reply of the 164 canonical HumanEval solutions over all their tests (1,537 calls) is 247
# bytes with 93 values (HumanEval/87); a raised exception's reply is at most ~1 KB (its
# message is cut at 1,000 characters). Sets, frozensets and dict keys are counted apart:
# values that hash alike (integers k * (2**61 - 1)) make building them quadratic.
MAX_REPLY = 64 * 1024  # bytes
MAX_REPLY_VALUES = 10_000
MAX_REPLY_KEYS = 1_000

# Runs in the child before the untrusted program. argv[1]: descriptor of the settings file.
_PRELUDE = r"""
import sys, os, json, resource
with os.fdopen(int(sys.argv[1]), "rb") as _f:
    cfg = json.loads(_f.read())
for _m in cfg["preload"]:
    try:
        __import__(_m)
    except Exception:
        pass
import traceback
_src, _nonce = cfg.pop("source"), cfg.pop("nonce").encode()
def _lim(r, v):
    try:
        resource.setrlimit(r, (v, v))
    except (ValueError, OSError):
        pass
_lim(resource.RLIMIT_CORE, 0)
_lim(resource.RLIMIT_AS, cfg["memory_bytes"])
_lim(resource.RLIMIT_CPU, cfg["cpu_seconds"])
_lim(resource.RLIMIT_FSIZE, cfg["fsize_bytes"])
_lim(resource.RLIMIT_NOFILE, 64)
_wire = {"__name__": "wire"}
exec(cfg.pop("wire"), _wire)
if cfg["drop"] and os.geteuid() == 0:
    try:
        os.setgroups([])
        os.setgid(cfg["gid"])
        os.setuid(cfg["uid"])
    except OSError as _e:
        print(f"sandbox: could not drop privileges: {_e}", file=sys.stderr)
        os._exit(1)
_lim(resource.RLIMIT_NPROC, 1)
def _blocked(*a, **k):
    raise PermissionError("blocked in sandbox")
import posix
for _mod in (os, posix):
    for _n in ("fork", "forkpty", "vfork", "system", "popen", "execv", "execve", "execl",
               "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnv", "spawnve",
               "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnvp", "spawnvpe",
               "posix_spawn", "posix_spawnp", "kill", "killpg", "putenv", "unsetenv",
               "remove", "removedirs", "rmdir", "unlink", "rename", "renames", "replace",
               "truncate", "ftruncate", "chmod", "fchmod", "lchmod", "chown", "fchown",
               "lchown", "chroot", "chdir", "fchdir", "setuid", "setgid", "seteuid",
               "setegid", "setreuid", "setregid", "setresuid", "setresgid", "setsid",
               "setpgid", "link", "symlink", "mkfifo", "mknod", "register_at_fork"):
        if hasattr(_mod, _n):
            setattr(_mod, _n, _blocked)
for _n in ("subprocess", "multiprocessing", "ctypes", "_ctypes", "_posixsubprocess", "pty",
           "socket", "_socket", "signal", "_signal", "shutil", "resource"):
    sys.modules[_n] = None
sys.argv = ["program.py"]
_g = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    exec(compile(_src, "program.py", "exec"), _g)
    sys.stdout.flush()
    sys.stderr.flush()
except BaseException:
    try:
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(1)
_write = os.write
if cfg["serve"] is None:
    _write(cfg["result_fd"], _nonce)
    os._exit(0)
_fn, _rfd, _wfd = _g.get(cfg["serve"]), cfg["request_fd"], cfg["result_fd"]
if not callable(_fn):
    print(f"program.py defines no function {cfg['serve']!r}", file=sys.stderr)
    os._exit(1)
def _send(text):
    data = text.encode("utf-8")
    data = len(data).to_bytes(8, "big") + data
    while data:
        data = data[_write(_wfd, data):]
def _recv():
    buf = b""
    while len(buf) < 8 or len(buf) < 8 + int.from_bytes(buf[:8], "big"):
        chunk = os.read(_rfd, 1 << 16)
        if not chunk:
            os._exit(0)
        buf += chunk
    return buf[8:].decode("utf-8")
_send(_wire["dumps"](("ready",)))
while True:
    _msg = _recv()
    try:
        _args, _kwargs = _wire["loads"](_msg)
        _out = _wire["dumps"](("ok", _fn(*_args, **_kwargs)))
    except BaseException as _e:
        try:
            _out = _wire["dumps"](("raise", str(type(_e).__name__), str(_e)[:1000]))
        except BaseException:
            _out = _wire["dumps"](("raise", "Exception", "unprintable exception"))
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        os._exit(1)
    _send(_out)
"""


@dataclass
class SandboxResult:
    status: str  # "passed" | "failed" | "timeout"
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    isolation: str = "rlimits"
    detail: str = ""  # the caller's reason for a failure, if any

    @property
    def passed(self) -> bool:
        return self.status == "passed"


# ------------------------------------------------------------------ isolation
@dataclass(frozen=True)
class _Probe:
    isolation: str
    bwrap: str | None  # absolute path, used for every launch
    reason: str | None  # why bubblewrap cannot run, when it cannot


_PROBED: dict[bool, _Probe] = {}
_WARNED: set[str] = set()


def _as_root(drop_privileges: bool) -> bool:
    return bool(drop_privileges) and os.geteuid() == 0


def _interpreter(python: str | None) -> str:
    """The interpreter's real path: a virtual environment's ``bin/python`` is a link to it, and
    the environment may live under /tmp, which the child does not see (``-I -S`` needs no
    site-packages)."""
    return os.path.realpath(python or sys.executable)


def _host_view() -> list[str]:
    """bwrap arguments binding, read-only, what the interpreter needs and nothing else: the
    system's program and library folders (``/usr``, ``/lib*``), the dynamic loader's cache, the
    local time zone and the interpreter's own prefix (which holds its standard library)."""
    argv: list[str] = []
    for path in SYSTEM_PATHS:
        if os.path.islink(path):  # /lib -> usr/lib on a merged-/usr system
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            argv += ["--ro-bind", path, path]
    return argv


def _prefix(python: str | None) -> str:
    """The folder the interpreter is installed in (``<prefix>/bin/python3``)."""
    exe = _interpreter(python)
    if python is None or exe == os.path.realpath(sys.executable):
        return os.path.realpath(sys.base_prefix)
    return os.path.dirname(os.path.dirname(exe))


def _under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _bwrap_argv(bwrap: str, workdir: str, as_root: bool, hide: tuple[str, ...] = (),
                python: str | None = None) -> list[str]:
    argv = [bwrap, *_host_view(), "--dev", "/dev", "--proc", "/proc"]
    for folder in PRIVATE_TMPFS:
        argv += ["--perms", "1777", "--size", str(TMPFS_BYTES), "--tmpfs", folder]
    prefix = _prefix(python)
    visible = [p for p in SYSTEM_PATHS if os.path.isdir(p) and not os.path.islink(p)]
    if not _under(prefix, visible) or _under(prefix, PRIVATE_TMPFS):
        argv += ["--ro-bind", prefix, prefix]  # after the tmpfs mounts, which would hide it
        visible.append(prefix)
    for path in map(os.path.realpath, hide):  # e.g. a benchmark's answer key
        if not _under(path, visible):
            continue  # not in the child's view at all
        if os.path.isdir(path):
            argv += ["--tmpfs", path]
        elif os.path.exists(path):
            argv += ["--ro-bind", "/dev/null", path]
    argv += ["--perms", "0777", "--dir", workdir,
             "--chdir", workdir, "--unshare-pid", "--unshare-net", "--unshare-ipc",
             "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox",
             "--die-with-parent", "--new-session"]
    if as_root:
        # the child starts as root with only these two capabilities and drops to nobody
        # itself once its imports are done (the interpreter may live where nobody cannot read)
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--uid", str(UNPRIVILEGED_UID), "--gid", str(UNPRIVILEGED_GID),
                 "--disable-userns"]
    return argv + ["--"]


def _probe(drop_privileges: bool, python: str | None, warn: bool = True) -> _Probe:
    """Whether bwrap can make its namespaces here, found once per process: bwrap's absolute
    path is looked up on this process's PATH and that path launches every child (whose own
    PATH is minimal)."""
    key = _as_root(drop_privileges)
    if key not in _PROBED:
        found = shutil.which("bwrap")
        bwrap = os.path.abspath(found) if found else None
        reason = None
        if bwrap is None:
            reason = "bwrap is not installed"
        else:
            cmd = _bwrap_argv(bwrap, "/tmp/mtad-sandbox-probe", key, python=python) + [
                _interpreter(python), "-I", "-S", "-c", "pass"]
            try:
                p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
                if p.returncode != 0:
                    err = p.stderr.decode(errors="replace").strip().splitlines()
                    reason = err[-1] if err else f"exit status {p.returncode}"
            except (OSError, subprocess.SubprocessError) as e:
                reason = f"{type(e).__name__}: {e}"
        _PROBED[key] = _Probe("bubblewrap" if reason is None else "rlimits", bwrap, reason)
    reason = _PROBED[key].reason
    if warn and reason is not None and "probe" not in _WARNED:
        _WARNED.add("probe")
        log.warning("sandbox: bubblewrap unavailable (%s); untrusted code runs with resource "
                    "limits only and may write to world-writable folders", reason)
    return _PROBED[key]


def isolation(drop_privileges: bool = True, python: str | None = None) -> str:
    """``"bubblewrap"`` when bwrap can make its namespaces here, else ``"rlimits"``.

    Probed once per process (running the interpreter under the same bwrap command the
    sandbox uses); the fallback is logged once, with bwrap's own reason.
    """
    return _probe(drop_privileges, python).isolation


def unavailable_reason(drop_privileges: bool = True, python: str | None = None) -> str | None:
    """Why bubblewrap cannot run here (one line), or None when it can. Says nothing else: a
    caller that refuses to run without bubblewrap gives the reason itself."""
    return _probe(drop_privileges, python, warn=False).reason


def _choose(requested: str, drop_privileges: bool, python: str | None) -> str:
    if requested == "auto":
        return isolation(drop_privileges, python)
    if requested not in ISOLATIONS:
        raise ValueError(f"isolation must be 'auto' or one of {ISOLATIONS}, got {requested!r}")
    if requested == "bubblewrap" and isolation(drop_privileges, python) != "bubblewrap":
        raise RuntimeError(f"isolation='bubblewrap' was asked for but bwrap cannot run here "
                           f"({unavailable_reason(drop_privileges, python)}): "
                           f"install it with `sudo apt-get install -y bubblewrap`")
    return requested


# ------------------------------------------------------------------ child process
def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_capped(f, limit: int) -> str:
    f.seek(0)
    return f.read(limit).decode("utf-8", errors="replace")


_WORKDIR_PREFIX = "mtad-sandbox-"  # rlimits work folders: <temp dir>/mtad-sandbox-<owner pid>-...
_STALE_CLEANED: set[str] = set()


def clean_stale_workdirs(tmp: str | None = None) -> list[str]:
    """Remove rlimits work folders whose owning process is gone (a scorer killed before its
    ``close``); once per process and temp folder, before its first rlimits child. Returns them."""
    tmp = tmp or tempfile.gettempdir()
    if tmp in _STALE_CLEANED:
        return []
    _STALE_CLEANED.add(tmp)
    removed = []
    for path in Path(tmp).glob(_WORKDIR_PREFIX + "*-*"):
        pid = path.name[len(_WORKDIR_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or not path.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its owner is alive
        except PermissionError:
            continue  # alive, another user's
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


class _Child:
    """One sandboxed interpreter running ``source``; the caller waits, talks and closes."""

    def __init__(self, source: str, *, timeout: float, memory_mb: int, output_limit: int,
                 drop_privileges: bool, python: str | None, isolation: str, serve: str | None,
                 hide: tuple[str, ...] = ()):
        self.isolation = _choose(isolation, drop_privileges, python)
        self.output_limit = int(output_limit)
        self.nonce = secrets.token_hex(16)
        name = f"{_WORKDIR_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        self._host_dir = None
        if self.isolation == "bubblewrap":
            workdir = f"/tmp/{name}"  # inside the child's private /tmp
            bwrap = _probe(drop_privileges, python).bwrap
            prefix = _bwrap_argv(bwrap, workdir, _as_root(drop_privileges), tuple(hide), python)
            cwd = "/"
        else:
            clean_stale_workdirs()
            workdir = self._host_dir = tempfile.mkdtemp(prefix=name + "-")
            if drop_privileges and os.geteuid() == 0:
                os.chown(workdir, UNPRIVILEGED_UID, UNPRIVILEGED_GID)
            prefix, cwd = [], workdir
        self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self.res = tempfile.TemporaryFile()
        cfg_file = tempfile.TemporaryFile()
        fds = [cfg_file.fileno(), self.res.fileno()]
        self.req_w = self.res_r = req_r = res_w = None
        if serve is not None:
            req_r, self.req_w = os.pipe()
            self.res_r, res_w = os.pipe()
            fds += [req_r, res_w]
        cfg = {
            "source": source,
            "nonce": self.nonce,
            "wire": Path(wire.__file__).read_text(encoding="utf-8"),
            "preload": PRELOAD,
            "memory_bytes": int(memory_mb) * 1024 * 1024,
            "cpu_seconds": int(timeout) + 1 + (1 if timeout % 1 else 0),
            "fsize_bytes": self.output_limit,
            "drop": bool(drop_privileges),
            "uid": UNPRIVILEGED_UID,
            "gid": UNPRIVILEGED_GID,
            "serve": serve,
            "request_fd": req_r,
            "result_fd": res_w if serve is not None else self.res.fileno(),
        }
        cfg_file.write(json.dumps(cfg).encode("utf-8"))
        cfg_file.seek(0)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        cmd = prefix + [_interpreter(python), "-I", "-S", "-B", "-c", _PRELUDE, str(cfg_file.fileno())]
        self.t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=self.out, stderr=self.err, cwd=cwd, env=env,
                pass_fds=fds, start_new_session=True, close_fds=True,
            )
        finally:
            cfg_file.close()
            for fd in (req_r, res_w):  # the child's ends
                if fd is not None:
                    os.close(fd)
        if self.req_w is not None:
            os.set_blocking(self.req_w, False)
            os.set_blocking(self.res_r, False)

    def wait(self, timeout: float) -> tuple[int, bool]:
        """``(returncode, timed_out)``; the process tree is gone afterwards."""
        timed_out = False
        try:
            rc = self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(self.proc.pid)
            rc = self.proc.wait()
        finally:
            _kill_group(self.proc.pid)  # strays left in the group, if any
        return rc, timed_out

    def close(self) -> None:
        if self.proc.poll() is None:
            _kill_group(self.proc.pid)
            self.proc.wait()
        for fd in (self.req_w, self.res_r):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.req_w = self.res_r = None
        for f in (self.out, self.err, self.res):
            f.close()
        if self._host_dir:
            shutil.rmtree(self._host_dir, ignore_errors=True)

    def result(self, status: str, rc: int | None, detail: str = "") -> SandboxResult:
        return SandboxResult(status, rc, _read_capped(self.out, self.output_limit),
                             _read_capped(self.err, self.output_limit),
                             time.monotonic() - self.t0, self.isolation, detail)


def run_python(
    source: str,
    timeout: float = 5.0,
    memory_mb: int = 1024,
    output_limit: int = 64 * 1024,
    drop_privileges: bool = True,
    python: str | None = None,
    isolation: str = "auto",
) -> SandboxResult:
    """Run ``source`` to its end in a sandboxed child interpreter; see the module docstring.

    ``timeout`` is the wall-clock limit in seconds (CPU time is limited to the same,
    rounded up, plus one); ``output_limit`` caps each of stdout/stderr in bytes (a
    program that writes more is killed by SIGXFSZ and fails). ``isolation``: "auto"
    (bubblewrap when it works here), "bubblewrap" (error when it does not) or "rlimits".
    """
    child = _Child(source, timeout=timeout, memory_mb=memory_mb, output_limit=output_limit,
                   drop_privileges=drop_privileges, python=python, isolation=isolation, serve=None)
    try:
        rc, timed_out = child.wait(timeout)
        child.res.seek(0)
        ok = child.res.read(64).decode("ascii", errors="replace") == child.nonce
        if timed_out or rc == -signal.SIGXCPU:
            status = "timeout"
        elif rc == 0 and ok:
            status = "passed"
        else:
            status = "failed"
        return child.result(status, rc)
    finally:
        child.close()


class SandboxGone(BaseException):
    """The sandboxed child died, timed out or broke the protocol. A ``BaseException`` so
    that code catching ``Exception`` around a call cannot swallow it."""


class CandidateError(Exception):
    """An exception raised in the child whose type is not a built-in exception."""


def _exception(name: str, message: str) -> Exception:
    import builtins

    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:  # an exception type with a different constructor
            pass
    return CandidateError(f"{name}: {message}")


class Session:
    """A program loaded in the sandbox, serving calls to its function ``entry_point``.

    ``call`` sends the arguments as plain data and returns the child's return value as
    plain data, or raises the child's exception (a built-in type when it was one, else
    :class:`CandidateError`). Death, timeout (``timeout`` covers the start and every call
    together) or a malformed reply raise :class:`SandboxGone` and mark ``broken``.
    ``hide``: host paths the child must not read (under bubblewrap they are masked by an
    empty folder or file; under rlimits they stay readable).
    Use as a context manager; ``result()`` gives the child's output afterwards.
    """

    def __init__(self, source: str, entry_point: str, timeout: float = 5.0, memory_mb: int = 1024,
                 output_limit: int = 64 * 1024, drop_privileges: bool = True,
                 python: str | None = None, isolation: str = "auto", hide: tuple[str, ...] = ()):
        self.deadline = time.monotonic() + float(timeout)
        self.broken: str | None = None
        self.calls = 0
        self._child = _Child(source, timeout=timeout, memory_mb=memory_mb,
                             output_limit=output_limit, drop_privileges=drop_privileges,
                             python=python, isolation=isolation, serve=entry_point, hide=hide)
        self.isolation = self._child.isolation
        self._buf = bytearray()
        try:
            if self._receive() != ("ready",):
                self._fail("the child did not start serving")
        except SandboxGone:
            pass  # reported by the first call and by broken

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _fail(self, why: str):
        self.broken = self.broken or why
        raise SandboxGone(self.broken)

    def _wait_fd(self, fd: int, write: bool) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self._fail("timed out")
        r, w, _ = select.select([] if write else [fd], [fd] if write else [], [], left)
        if not (r or w):
            self._fail("timed out")

    def _send(self, text: str) -> None:
        data = text.encode("utf-8")
        if len(data) > MAX_ARGUMENTS:
            raise ValueError(f"arguments larger than {MAX_ARGUMENTS} bytes")
        data = len(data).to_bytes(8, "big") + data
        while data:
            self._wait_fd(self._child.req_w, write=True)
            try:
                data = data[os.write(self._child.req_w, data):]
            except BlockingIOError:
                continue
            except OSError:
                self._fail("the child exited")

    def _receive(self):
        while True:
            if len(self._buf) >= 8:
                size = int.from_bytes(self._buf[:8], "big")
                if size > MAX_REPLY:
                    self._fail(f"reply larger than {MAX_REPLY} bytes")
                if len(self._buf) >= 8 + size:
                    msg = bytes(self._buf[8 : 8 + size])
                    del self._buf[: 8 + size]
                    try:
                        return wire.loads(msg.decode("utf-8"), MAX_REPLY_VALUES, MAX_REPLY_KEYS,
                                          self.deadline)
                    except (wire.WireError, UnicodeDecodeError) as e:
                        if time.monotonic() > self.deadline:
                            self._fail("timed out")
                        self._fail(f"malformed reply: {e}")
            self._wait_fd(self._child.res_r, write=False)
            try:
                chunk = os.read(self._child.res_r, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                self._fail("the child exited")
            self._buf += chunk

    def call(self, *args, **kwargs):
        if self.broken:
            raise SandboxGone(self.broken)
        self.calls += 1
        self._send(wire.dumps((args, kwargs)))
        reply = self._receive()
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "ok":
            return reply[1]
        if (type(reply) is tuple and len(reply) == 3 and reply[0] == "raise"
                and type(reply[1]) is str and type(reply[2]) is str):
            raise _exception(reply[1], reply[2])
        self._fail("malformed reply")

    def close(self) -> None:
        self._child.close()

    def result(self, status: str, detail: str = "") -> SandboxResult:
        """The child's output so far (call before ``close``)."""
        return self._child.result(status, self._child.proc.poll(), detail)

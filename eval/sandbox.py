"""Run untrusted Python (model-written code plus its tests) in a separate, limited process.

Layers, each independent of the others:

* a fresh interpreter (``python -I -S -B``) in a new session, started without a
  shell, stdin closed, a minimal environment, and a private temporary working folder;
* resource limits set in the child before any untrusted code runs: address space
  (RLIMIT_AS), CPU seconds (RLIMIT_CPU), size of any file it writes (RLIMIT_FSIZE,
  which also caps stdout/stderr: they go to files), process count (RLIMIT_NPROC),
  open files, no core dumps;
* when started as root, the child drops to an unprivileged user (``nobody``) after
  its own imports and before the untrusted code, so RLIMIT_NPROC applies and the
  file system is read-only to it;
* process-spawning, signalling and file-removing functions of ``os``/``posix`` are
  replaced and ``subprocess``/``multiprocessing``/``ctypes``/``socket`` cannot be
  imported (defence in depth, not a boundary by itself);
* a wall-clock timeout, after which the whole process group is killed.

A run passes only if the program reaches its end: the child writes a per-run
nonce to a private file descriptor after the program returns, so ``sys.exit(0)``
or ``os._exit(0)`` half way through counts as a failure.

This is a best-effort sandbox for benchmark code, not a security boundary against
a determined attacker (use a container or VM for that).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

# Modules imported before privileges are dropped, so that test code can use them
# even when the interpreter's files are not readable by the unprivileged user.
PRELOAD = (
    "abc array ast base64 binascii bisect builtins calendar cmath collections "
    "collections.abc contextlib copy dataclasses datetime decimal difflib enum "
    "fractions functools hashlib heapq io itertools json keyword math numbers "
    "operator pprint queue random re statistics string struct textwrap time "
    "traceback types typing unicodedata warnings zlib"
).split()

UNPRIVILEGED_UID = 65534  # nobody
UNPRIVILEGED_GID = 65534  # nogroup

# Runs in the child before the untrusted program. argv: program path, result fd, config json.
_PRELUDE = r"""
import sys, os, json, resource
cfg = json.loads(sys.argv[3])
for _m in cfg["preload"]:
    try:
        __import__(_m)
    except Exception:
        pass
import traceback
_path, _fd, _nonce = sys.argv[1], int(sys.argv[2]), cfg["nonce"].encode()
with open(_path, encoding="utf-8") as _f:
    _src = _f.read()
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
if cfg["drop"] and os.geteuid() == 0:
    try:
        os.setgroups([])
        os.setgid(cfg["gid"])
        os.setuid(cfg["uid"])
    except OSError:
        pass
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
except BaseException:
    try:
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(1)
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BaseException:
    os._exit(1)
os.write(_fd, _nonce)
os._exit(0)
"""


@dataclass
class SandboxResult:
    status: str  # "passed" | "failed" | "timeout"
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _read_capped(f, limit: int) -> str:
    f.seek(0)
    return f.read(limit).decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_python(
    source: str,
    timeout: float = 5.0,
    memory_mb: int = 1024,
    output_limit: int = 64 * 1024,
    drop_privileges: bool = True,
    python: str | None = None,
) -> SandboxResult:
    """Run ``source`` in a sandboxed child interpreter; see the module docstring.

    ``timeout`` is the wall-clock limit in seconds (CPU time is limited to the same,
    rounded up, plus one); ``output_limit`` caps each of stdout/stderr in bytes (a
    program that writes more is killed by SIGXFSZ and fails).
    """
    nonce = secrets.token_hex(16)
    cfg = {
        "nonce": nonce,
        "preload": PRELOAD,
        "memory_bytes": int(memory_mb) * 1024 * 1024,
        "cpu_seconds": int(timeout) + 1 + (1 if timeout % 1 else 0),
        "fsize_bytes": int(output_limit),
        "drop": bool(drop_privileges),
        "uid": UNPRIVILEGED_UID,
        "gid": UNPRIVILEGED_GID,
    }
    workdir = tempfile.mkdtemp(prefix="mtad-sandbox-")
    try:
        prog = os.path.join(workdir, "program.py")
        with open(prog, "w", encoding="utf-8") as f:
            f.write(source)
        os.chmod(prog, 0o644)
        if drop_privileges and os.geteuid() == 0:
            os.chown(workdir, UNPRIVILEGED_UID, UNPRIVILEGED_GID)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        with (
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            tempfile.TemporaryFile() as res,
        ):
            cmd = [python or sys.executable, "-I", "-S", "-B", "-c", _PRELUDE, prog,
                   str(res.fileno()), json.dumps(cfg)]
            t0 = time.monotonic()
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=workdir, env=env,
                pass_fds=(res.fileno(),), start_new_session=True, close_fds=True,
            )
            timed_out = False
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                rc = proc.wait()
            finally:
                _kill_group(proc.pid)  # strays left in the group, if any
            wall = time.monotonic() - t0
            res.seek(0)
            ok = res.read(64).decode("ascii", errors="replace") == nonce
            stdout, stderr = _read_capped(out, output_limit), _read_capped(err, output_limit)
        if timed_out or rc == -signal.SIGXCPU:
            status = "timeout"
        elif rc == 0 and ok:
            status = "passed"
        else:
            status = "failed"
        return SandboxResult(status, rc, stdout, stderr, wall)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

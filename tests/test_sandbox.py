"""The code sandbox: normal programs run; hostile ones fail fast and leave nothing behind."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from eval.sandbox import isolation, run_python


def test_passing_and_failing_programs():
    ok = run_python("import math, hashlib\nassert math.gcd(12, 18) == 6\nprint('fine')")
    assert ok.passed and ok.stdout == "fine\n"
    bad = run_python("assert 1 == 2")
    assert bad.status == "failed" and "AssertionError" in bad.stderr
    syntax = run_python("def f(:\n  pass")
    assert syntax.status == "failed"


@pytest.mark.parametrize("src", ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit"])
def test_early_exit_is_not_a_pass(src):
    assert run_python(src).status == "failed"


def test_infinite_loop_times_out():
    t0 = time.monotonic()
    r = run_python("while True:\n    pass", timeout=1.0)
    assert r.status == "timeout"
    assert time.monotonic() - t0 < 4.0


def test_sleep_times_out():
    t0 = time.monotonic()
    r = run_python("import time\ntime.sleep(60)", timeout=0.5)
    assert r.status == "timeout" and time.monotonic() - t0 < 3.0


def test_os_system_is_blocked(tmp_path):
    marker = tmp_path / "marker"
    r = run_python(f"import os\nos.system('touch {marker}')")
    assert r.status == "failed"
    assert not marker.exists()


def test_subprocess_is_blocked(tmp_path):
    marker = tmp_path / "marker"
    r = run_python(f"import subprocess\nsubprocess.run(['touch', '{marker}'])")
    assert r.status == "failed" and not marker.exists()


def test_fork_bomb_fails_fast():
    t0 = time.monotonic()
    r = run_python("import os\nwhile True:\n    os.fork()", timeout=2.0)
    assert r.status in ("failed", "timeout")
    assert time.monotonic() - t0 < 5.0
    r2 = run_python("import posix\nwhile True:\n    posix.fork()", timeout=2.0)
    assert r2.status in ("failed", "timeout")


def test_huge_output_is_capped():
    t0 = time.monotonic()
    r = run_python("while True:\n    print('y' * 1000)", timeout=2.0, output_limit=10_000)
    assert r.status in ("failed", "timeout")
    assert len(r.stdout) <= 10_000
    assert time.monotonic() - t0 < 5.0


def test_memory_bomb_fails():
    r = run_python("x = bytearray(8 * 1024 ** 3)", memory_mb=512)
    assert r.status == "failed"


def test_runs_in_a_private_temp_dir_that_is_removed():
    r = run_python("import os\nopen('f.txt', 'w').write('x')\nprint(os.getcwd())")
    assert r.passed, r.stderr
    cwd = r.stdout.strip()
    assert os.path.basename(cwd).startswith("mtad-sandbox-")
    assert not os.path.exists(cwd)


# The sandbox drops to `nobody` only when started as root (CI here is root); elsewhere there is nothing to drop.
@pytest.mark.skipif(os.geteuid() != 0, reason="privilege drop applies when started as root")
def test_root_drops_privileges(tmp_path):
    target = tmp_path / "owned"
    r = run_python(f"import os\nprint(os.getuid())\nopen('{target}', 'w').write('x')")
    assert r.status == "failed"
    assert not target.exists()


# ---------------------------------------------------------------- isolation
BWRAP = isolation() == "bubblewrap"
# Justified skip: isolation tests need bwrap; .ci/run installs it, so they run in CI. Where it
# is missing the rlimits mode is still tested (MODES) and the fallback is recorded, not hidden.
NEEDS_BWRAP = pytest.mark.skipif(not BWRAP, reason="bubblewrap is missing or cannot make namespaces here")
MODES = ["rlimits", pytest.param("bubblewrap", marks=NEEDS_BWRAP)]


@pytest.mark.parametrize("mode", MODES)
def test_limits_hold_in_every_isolation(mode):
    t0 = time.monotonic()
    fork = run_python("import posix\nwhile True:\n    posix.fork()", timeout=2.0, isolation=mode)
    assert fork.status in ("failed", "timeout") and fork.isolation == mode
    assert run_python("x = bytearray(8 * 1024 ** 3)", memory_mb=512, isolation=mode).status == "failed"
    assert run_python("while True:\n    pass", timeout=1.0, isolation=mode).status == "timeout"
    out = run_python("while True:\n    print('y' * 1000)", timeout=2.0, output_limit=10_000, isolation=mode)
    assert out.status in ("failed", "timeout") and len(out.stdout) <= 10_000
    assert time.monotonic() - t0 < 15.0


@NEEDS_BWRAP
def test_writes_outside_the_work_dir_leave_nothing_behind():
    name = f"mtad-sandbox-leak-{secrets.token_hex(4)}"
    paths = [f"/tmp/{name}", f"/var/tmp/{name}", f"/dev/shm/{name}"]
    src = "import os\n" + "".join(f"open({p!r}, 'w').write('x')\n" for p in paths if os.path.isdir(os.path.dirname(p)))
    src += "open('local.txt', 'w').write('x')\nprint(os.getuid(), sorted(os.listdir('.')))\n"
    r = run_python(src)
    assert r.passed, r.stderr  # the writes happened, inside the sandbox
    assert r.isolation == "bubblewrap" and r.stdout == "65534 ['local.txt']\n"
    leaked = [p for p in paths if os.path.exists(p)]
    for p in leaked:
        os.remove(p)
    assert leaked == []


REPO = Path(__file__).resolve().parent.parent


_MASKED = ("/tmp", "/var/tmp", "/dev/shm")


def _masked(path: Path) -> bool:
    p = str(path.resolve())
    return any(p == m or p.startswith(m + "/") for m in _MASKED)


def _traversable(path: Path) -> bool:
    """Every ancestor searchable by others, so the unprivileged child can reach the folder."""
    return all(a.stat().st_mode & 0o001 for a in [path, *path.parents] if a.exists())


def _unmasked_parent() -> Path:
    cache = REPO / ".pytest_cache"
    for parent in (cache, Path("/srv"), Path("/mnt"), Path("/opt")):
        if _masked(parent):
            continue
        if parent == cache:
            parent.mkdir(exist_ok=True)
        if parent.is_dir() and os.access(parent, os.W_OK) and _traversable(parent):
            return parent
    # justified: without such a folder the host-write check has no place to observe
    pytest.skip("no writable folder outside /tmp, /var/tmp and /dev/shm that others can reach")


@pytest.fixture
def host_dir():
    """A folder anyone may write to, outside /tmp, /var/tmp and /dev/shm (which the sandbox
    replaces with its own): the repository's .pytest_cache, or /srv, /mnt, /opt when the
    checkout itself lies under one of those (a CI clone in /tmp)."""
    parent = _unmasked_parent()
    path = Path(tempfile.mkdtemp(prefix="sandbox-host-", dir=parent))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@NEEDS_BWRAP
def test_host_is_read_only_and_private_to_the_child(host_dir):
    target = host_dir / "keep.txt"
    target.write_text("x")
    target.chmod(0o666)
    r = run_python(f"open({str(target)!r}, 'a').write('y')\n")
    assert r.status == "failed" and "Read-only file system" in r.stderr
    assert target.read_text() == "x"
    # the same write works with resource limits only: the check above is not vacuous
    assert run_python(f"open({str(target)!r}, 'a').write('y')\n", isolation="rlimits").passed
    assert target.read_text() == "xy"
    procs = run_python("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert procs.passed and len(json.loads(procs.stdout)) <= 2  # bwrap's init and the child
    net = run_python("print(open('/proc/net/dev').read().count(':'))")
    assert net.passed and net.stdout.strip() == "1"  # only the loopback interface


# `del sys.modules['posix']; import posix` restores the real functions: the blocklist is no
# boundary. A non-root user's sandbox must still not change the host.
POSIX_REIMPORT = """
import sys
del sys.modules["posix"]
import posix
assert posix.unlink.__name__ == "unlink"  # the real one is back
posix.unlink({target!r})
"""

_RUN_AS_USER = """
import json, sys
from eval.sandbox import isolation, run_python
r = run_python(sys.argv[1], isolation=sys.argv[2])
print(json.dumps({"isolation": isolation(), "status": r.status, "stderr": r.stderr[-500:]}))
"""


_CAN_SPAWN = "import eval.sandbox, os, sys; assert os.access(sys.executable, os.X_OK)"


def _non_root_command() -> list[str]:
    """A command prefix running Python as a non-root user (``nobody`` when we are root)."""
    if os.geteuid() != 0:
        return [sys.executable]
    if shutil.which("setpriv") is None:
        # justified: the test must run the sandbox as a non-root user; setpriv (util-linux) does that
        pytest.skip("running as root and setpriv is missing: cannot become a non-root user")
    drop = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    for python in dict.fromkeys([sys.executable, shutil.which("python3"), "/usr/bin/python3"]):
        ok = python and subprocess.run(drop + [python, "-c", _CAN_SPAWN], cwd="/",
                                       env={**os.environ, "PYTHONPATH": str(REPO)},
                                       capture_output=True, timeout=60).returncode == 0
        if ok:
            return drop + [python]
    # justified: the venv may live where nobody cannot read (/root); no interpreter, no test
    pytest.skip("no Python interpreter that nobody may run and that imports eval.sandbox")


def _run_as_non_root(src: str, mode: str) -> dict:
    cmd = _non_root_command() + ["-c", _RUN_AS_USER, src, mode]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/",
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_posix_reimport_does_not_help_a_non_root_user(host_dir):
    target = host_dir / "victim.txt"
    target.write_text("x")
    if os.geteuid() == 0:
        os.chown(host_dir, 65534, 65534)
        os.chown(target, 65534, 65534)
    src = POSIX_REIMPORT.format(target=str(target))
    result = _run_as_non_root(src, "auto")
    if result["isolation"] != "bubblewrap":
        # justified: unprivileged user namespaces are a kernel setting; where they are off a
        # non-root user gets the rlimits fallback, whose weakness the rlimits assertion below shows
        pytest.skip("no user namespaces for a non-root user here: bubblewrap cannot run")
    assert result["status"] == "failed" and "Read-only file system" in result["stderr"]
    assert target.exists()
    # with resource limits only, the same program deletes the file: the attack is real
    assert _run_as_non_root(src, "rlimits")["status"] == "passed"
    assert not target.exists()

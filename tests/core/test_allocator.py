"""The entry points fix glibc's malloc thresholds (``mtad.core.allocator``) where that applies,
say why not where it does not, and record it in every run's provenance."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from mtad.core import allocator


@pytest.mark.parametrize("env, why", [
    ({"MTAD_MALLOC": "system"}, "MTAD_MALLOC=system"),
    ({"MTAD_MALLOC": " System "}, "MTAD_MALLOC=system"),
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "jemalloc preloaded"),
    ({"LD_PRELOAD": "libtcmalloc_minimal.so.4"}, "tcmalloc preloaded"),
    ({"MALLOC_TRIM_THRESHOLD_": "0"}, "set by the environment: MALLOC_TRIM_THRESHOLD_=0"),
])
def test_left_alone_where_something_else_decides(env, why):
    got = allocator._tune(env)
    assert got["tuned"] is False and why in got["why"]


def test_not_glibc_is_said(monkeypatch):
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda *a, **k: ("musl", "1.2"))
    got = allocator._tune({})
    assert got["tuned"] is False and got["why"].startswith("not glibc")


_PROBE = """
import json
from mtad.core import allocator
from mtad.run.provenance import provenance
before = allocator.state()
first, again = allocator.tune(), allocator.tune()
print(json.dumps([before, first, again, provenance()["allocator"]]))
"""


# mallopt is glibc's own: elsewhere tune() does nothing and says so (test_not_glibc_is_said)
@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_tune_sets_both_thresholds_once_and_the_provenance_says_so():
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("MTAD_MALLOC", "LD_PRELOAD", *allocator.ENV_THRESHOLDS)}
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, check=True)
    before, first, again, recorded = json.loads(out.stdout.strip().splitlines()[-1])
    assert before["tuned"] is False
    assert first == again == recorded
    assert first["tuned"] is True and first["allocator"].startswith("glibc")
    assert first["mmap_threshold"] == 32 << 20 and first["trim_threshold"] == 256 << 20


def test_the_entry_points_tune_and_the_library_does_not():
    """Every run (``mtad.run.evaluate.run``, whatever launched it), ``mtad-bench``, ``mtad-audit``, ``mtad-rerun``
    and the overhead / speed benchmarks call ``tune``; importing the engine does not."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for rel in ("mtad/run/evaluate.py", "mtad/run/bench.py", "mtad/run/audit.py", "mtad/run/rerun.py",
                "bench/overhead.py", "bench/speed.py"):
        assert "allocator.tune()" in (root / rel).read_text(), rel
    probe = "import mtad.core.engine, mtad.core.allocator as a; print(a.state()['tuned'])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


_RUN = """
import json, sys
from pathlib import Path
from mtad.run.cli import compose_config
from mtad.run.evaluate import run
cfg = compose_config(["+experiment=debug", "output_dir=" + sys.argv[1]])
run(cfg)
print(json.dumps(json.loads((Path(sys.argv[1]) / "summary.json").read_text())["provenance"]["allocator"]))
"""


# glibc only, as above: elsewhere a run records "not glibc" instead (test_not_glibc_is_said)
@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_a_run_however_launched_tunes_and_records_it(tmp_path):
    """``mtad.run.evaluate.run`` itself tunes (a sweep's or a Slurm job's process goes through it,
    not through a console script) and the point's ``summary.json`` records it."""
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("MTAD_MALLOC", "LD_PRELOAD", *allocator.ENV_THRESHOLDS)}
    env["HF_HUB_OFFLINE"] = "1"
    out = subprocess.run([sys.executable, "-c", _RUN, str(tmp_path / "p")], capture_output=True, text=True,
                         env=env, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["tuned"] is True and got["mmap_threshold"] == allocator.MMAP_THRESHOLD

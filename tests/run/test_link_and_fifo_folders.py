"""A results folder holding a link, FIFO or device where a file belongs is refused in one line,
within seconds and without reading it whole, by every command a user runs on a folder (rescore,
audit, render, resume, a sweep adopting it); nothing is written through a link, and no link
leads a command out of the folder.

Each command runs as a subprocess with a time limit (a hang fails the test, never the suite)
and, where a file could be read whole, a 3 GiB address-space limit. The code under test is the
checkout ``mtad`` is imported from (``CODE``), so the same file checks another checkout."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import mtad

CODE = Path(mtad.__file__).resolve().parents[1]
SMOKE_SWEEP = CODE / "results" / "sweeps" / "table2_smoke"
# the smallest real run (tests/run/test_hostile_records.py): tiny random pair, 2 prompts
TINY = ["+experiment=debug", "limit=2", "max_new_tokens=4", "perplexity=false", "~task.scorer", "decoder=spd"]
SWEEP = ["--profile", "smoke", "decoder=multinomial", "limit=2", "max_new_tokens=4", "warmup=0", "perplexity=false"]
MEMORY = 3 * 1024**3


@dataclass
class Result:
    rc: int
    out: str
    err: str
    seconds: float


def _cli(args: list[str], timeout: float = 120, memory: int | None = None) -> Result:
    """``python <args>`` in ``CODE``; a run past ``timeout`` fails the test (it hangs)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    path = os.pathsep.join(p for p in (str(CODE), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, *args], cwd=CODE, env=env, capture_output=True, text=True,
                           timeout=timeout, preexec_fn=limit if memory else None)
    except subprocess.TimeoutExpired:
        pytest.fail(f"python {' '.join(args[:2])} still running after {timeout} s (it hangs)")
    return Result(p.returncode, p.stdout, p.stderr, time.perf_counter() - t0)


def _refused(res: Result, path: Path, what: str, one_line: bool = True) -> None:
    """Exit 2 with one line naming ``path`` and what it is."""
    lines = res.err.strip().splitlines()
    assert res.rc == 2 and lines, (res.rc, res.err[-2000:])
    assert lines[-1].startswith("error: ") and str(path) in lines[-1] and what in lines[-1], res.err[-2000:]
    if one_line:
        assert len(lines) == 1, res.err[-2000:]


def _state(path: Path) -> tuple:
    """What a write would change: the bytes, inode and modification time of each file."""
    files = sorted(p for p in path.rglob("*")) if path.is_dir() else [path]
    return tuple((p.name, p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns) for p in files if p.is_file())


@pytest.fixture
def sweep(tmp_path) -> Path:
    """A sweep folder holding one finished committed point (smoke task, tiny pair)."""
    src = sorted(d for d in SMOKE_SWEEP.iterdir() if (d / "summary.json").is_file())[0]
    dst = tmp_path / "sweep" / src.name
    shutil.copytree(src, dst)
    return dst.parent


def _point(sweep: Path) -> Path:
    return next(sweep.iterdir())


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


@pytest.fixture(scope="module")
def tiny_identity():
    """The identity of the point ``python run.py TINY`` runs (composed here, nothing run)."""
    from mtad.run.cli import compose_config
    from mtad.run.evaluate import check

    return check(compose_config(TINY)).identity


# ------------------------------------------------------------------ rescore


def test_rescore_refuses_a_fifo_summary_at_once(sweep):
    summary = _point(sweep) / "summary.json"
    _fifo(summary)
    res = _cli(["-m", "mtad.analysis.rescore", str(sweep)], timeout=60)
    _refused(res, summary, "FIFO")


def test_rescore_does_not_follow_a_linked_point_folder_out_of_the_sweep(sweep, tmp_path):
    outside = tmp_path / "outside"
    _point(sweep).rename(outside)
    (sweep / "linked").symlink_to(outside, target_is_directory=True)
    before = _state(outside)
    res = _cli(["-m", "mtad.analysis.rescore", str(sweep)], timeout=90)
    _refused(res, sweep / "linked", "symbolic link")
    assert _state(outside) == before


@pytest.mark.parametrize("target", ["/dev/zero", "sparse"])
def test_rescore_refuses_a_summary_linked_to_a_device_or_a_huge_sparse_file(sweep, tmp_path, target):
    if target == "sparse":
        target = tmp_path / "sparse.json"
        with open(target, "wb") as f:
            f.truncate(10 * 1024**3)
    summary = _point(sweep) / "summary.json"
    summary.unlink()
    summary.symlink_to(target)
    res = _cli(["-m", "mtad.analysis.rescore", str(sweep)], timeout=60, memory=MEMORY)
    _refused(res, summary, "symbolic link")


# ------------------------------------------------------------------ audit


@pytest.mark.slow  # about 10 s each: audit's imports (the same reader refuses rescore's FIFO by default)
@pytest.mark.parametrize("name", ["samples.jsonl", "point.json"])
def test_audit_refuses_a_fifo_at_once(sweep, name):
    path = _point(sweep) / name
    _fifo(path)
    res = _cli(["-m", "mtad.run.audit", str(_point(sweep)), "--n", "1"], timeout=60)
    _refused(res, path, "FIFO")


@pytest.mark.slow  # about 10 s each: audit's imports
@pytest.mark.parametrize("how", ["not a point file", "tampered identity"])
def test_audit_refuses_a_point_file_it_cannot_use_in_one_line(sweep, how):
    """A ``point.json`` of no known format, or one whose stored identity is not the one its hash
    names (a decoder ``_target_`` planted there): one line, exit 2, for one point and ``--all``."""
    path = _point(sweep) / "point.json"
    if how == "not a point file":
        path.write_text(json.dumps({"format": 99}))
    else:
        point = json.loads(path.read_text())
        point["identity"]["decoder"]["_target_"] = "os.system"
        path.write_text(json.dumps(point))
    for args in ([str(_point(sweep))], ["--all", str(sweep)]):
        res = _cli(["-m", "mtad.run.audit", *args, "--n", "1"], timeout=60)
        _refused(res, path, "point.json")


# ------------------------------------------------------------------ render


@pytest.mark.slow  # about 10 s each: render's imports
@pytest.mark.parametrize("name", ["summary.json", "point.json", "samples.jsonl"])
def test_render_refuses_a_fifo_at_once(sweep, tmp_path, name):
    path = _point(sweep) / name
    _fifo(path)
    res = _cli(["-m", "mtad.analysis.render", str(sweep), "--all", "--out", str(tmp_path / "out")], timeout=60)
    _refused(res, path, "FIFO")


def test_render_out_does_not_write_through_links_in_the_folder(sweep, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    names = ["table2.md", "table2.tex", "table2.csv", "points.csv", "pareto_smoke.png"]
    for name in names:
        (elsewhere / name).write_text(f"precious {name}\n")
        (out / name).symlink_to(elsewhere / name)
    before = _state(elsewhere)
    res = _cli(["-m", "mtad.analysis.render", str(sweep), "--all", "--out", str(out)], timeout=120)
    assert res.rc == 0, res.err[-2000:]
    assert _state(elsewhere) == before
    for name in names:
        assert (out / name).is_file() and not (out / name).is_symlink(), name
    assert (out / "table2.md").read_text().startswith("# sweep")


# ------------------------------------------------------------------ resume (python run.py)


def _run_folder(tmp_path: Path, identity: dict) -> Path:
    from mtad.run.results import PointFolder

    folder = tmp_path / "run"
    PointFolder(folder).claim(identity)  # a folder of this very point: the run resumes it
    return folder


def _record_line() -> str:
    """A well-formed samples.jsonl line (a committed record)."""
    src = sorted(d for d in SMOKE_SWEEP.iterdir() if (d / "samples.jsonl").is_file())[0]
    return (src / "samples.jsonl").read_text().splitlines()[0] + "\n"


def _resume(folder: Path) -> Result:
    return _cli(["run.py", *TINY, f"hydra.run.dir={folder}"], timeout=240)


@pytest.mark.parametrize("name", [".hydra/config.yaml"] + [
    pytest.param(n, marks=pytest.mark.slow) for n in ("run.log", "samples.jsonl", "segments.jsonl")])
def test_resume_refuses_a_folder_whose_files_are_links(tmp_path, tiny_identity, name):
    folder = _run_folder(tmp_path, tiny_identity)
    target = tmp_path / "elsewhere" / "precious"
    target.parent.mkdir()
    target.write_text(_record_line())  # well-formed records: a resume would append to them
    link = folder / name
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(target)
    before = _state(target)
    res = _resume(folder)
    _refused(res, link, "symbolic link")
    assert _state(target) == before
    assert sorted(p.name for p in folder.iterdir()) == sorted({"point.json", name.split("/")[0]})


@pytest.mark.slow  # about 15 s each: run.py's imports and checks
@pytest.mark.parametrize("name", ["point.json", "samples.jsonl"])
def test_resume_refuses_a_fifo_at_once(tmp_path, tiny_identity, name):
    folder = _run_folder(tmp_path, tiny_identity)
    _fifo(folder / name)
    res = _resume(folder)
    _refused(res, folder / name, "FIFO")


@pytest.mark.parametrize("held", ["a folder of this point", "an empty folder"])
def test_resume_refuses_a_run_folder_that_is_a_link(tmp_path, tiny_identity, held):
    """``hydra.run.dir`` naming a link (a point folder from elsewhere, linked in): refused in one
    line before anything is written, whatever the link leads to; nothing is written there."""
    target = _run_folder(tmp_path, tiny_identity) if held == "a folder of this point" else tmp_path / "empty"
    target.mkdir(exist_ok=True)
    link = tmp_path / "linked"
    link.symlink_to(target, target_is_directory=True)
    before = _state(target)
    res = _resume(link)
    _refused(res, link, "symbolic link")
    assert _state(target) == before and sorted(p.name for p in target.iterdir()) == sorted(
        ["point.json"] if held == "a folder of this point" else [])


@pytest.mark.slow  # about 5-10 s each: the commands' imports
@pytest.mark.parametrize("command", ["audit", "audit --all", "rerun", "rerun --status", "rescore"])
def test_every_reader_refuses_a_point_folder_that_is_a_link(sweep, tmp_path, command):
    """A point folder linked into the sweep (its files real, elsewhere), named on the command line
    or found under the sweep: refused in one line by name, the folder it leads to untouched; never
    read through, nor (``audit --all``) passed over without a word."""
    outside = tmp_path / "outside"
    point = _point(sweep)
    point.rename(outside)
    point.symlink_to(outside, target_is_directory=True)
    before = _state(outside)
    args = {"audit": ["-m", "mtad.run.audit", str(point), "--n", "1"],
            "audit --all": ["-m", "mtad.run.audit", "--all", str(sweep), "--n", "1"],
            "rerun": ["-m", "mtad.run.rerun", str(point), "--staging", str(tmp_path / "stage")],
            "rerun --status": ["-m", "mtad.run.rerun", str(point), "--status", "--staging", str(tmp_path / "stage")],
            "rescore": ["-m", "mtad.analysis.rescore", str(point)]}[command]
    res = _cli(args, timeout=90)
    if command.startswith("rerun"):  # (its refusals say "mtad-rerun: ...")
        lines = res.err.strip().splitlines()
        assert res.rc == 2 and len(lines) == 1 and lines[0].startswith("mtad-rerun: "), res.err[-2000:]
        assert str(point) in lines[0] and "symbolic link" in lines[0]
    else:
        _refused(res, point, "symbolic link")
    assert _state(outside) == before and not (tmp_path / "stage").exists()


# ------------------------------------------------------------------ mtad-sweep --search


@pytest.mark.slow  # about 20 s: the sweep's composition
def test_sweep_search_refuses_to_adopt_a_folder_holding_a_link(tmp_path):
    from mtad.run import sweep as sw
    from mtad.run.results import PointFolder, identity

    table2 = CODE / "experiments" / "table2.yaml"
    (p,) = sw.load(table2, SWEEP[2:], profile="smoke", root=tmp_path / "root").points
    found = tmp_path / "search" / "other" / p.hash
    PointFolder(found).claim(identity(p.cfg))
    target = tmp_path / "elsewhere"
    target.write_text('{"segment": "x"}\n')
    (found / "segments.jsonl").symlink_to(target)
    before = _state(target)
    res = _cli(["-m", "mtad.run.sweep", str(table2), *SWEEP, "--root", str(tmp_path / "root"),
                "--search", str(tmp_path / "search")], timeout=240)
    _refused(res, found / "segments.jsonl", "symbolic link", one_line=False)
    assert _state(target) == before
    assert not (found / "samples.jsonl").exists()


def test_adopt_refuses_a_linked_point_folder_under_the_sweep(tmp_path, sweep):
    """``mtad-sweep-adopt`` would rewrite an adopted folder's files: a linked one is refused."""
    from mtad.run import sweep as sw
    from mtad.run.results import BadResultsFile
    from mtad.run.sweep.adopt import adopt

    s = sw.load(CODE / "experiments" / "table2.yaml", SWEEP[2:], profile="smoke", root=tmp_path / "root")
    s.dir.mkdir(parents=True)
    (s.dir / "linked").symlink_to(_point(sweep), target_is_directory=True)
    before = _state(_point(sweep))
    with pytest.raises(BadResultsFile, match="linked is a symbolic link"):
        adopt(s)
    assert _state(_point(sweep)) == before

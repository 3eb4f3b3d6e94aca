"""Results-folder files are opened without following links and only as regular files: a FIFO,
device, socket, folder or link where a file belongs is refused at once in one line naming it;
JSON files are capped before they are read; no writer writes through a link it did not make."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path

import pytest

from mtad.core import io

SPARSE_BYTES = 10 * 1024**3


@contextlib.contextmanager
def deadline(seconds: int):
    """TimeoutError when the block runs longer than ``seconds`` (a blocking ``open`` of a FIFO
    is interrupted): a hang fails the test instead of hanging the suite."""
    def expire(*_):
        raise TimeoutError(f"still blocked after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def specials(tmp_path):
    """name -> a path that is not a regular file, with the words its refusal must hold."""
    target = tmp_path / "target.json"
    target.write_text('{"a": 1}\n')
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.truncate(SPARSE_BYTES)
    out = {"fifo": (tmp_path / "fifo", "FIFO"), "folder": (tmp_path / "folder", "a folder"),
           "link": (tmp_path / "link", "symbolic link"), "zero": (tmp_path / "zero", "symbolic link"),
           "sparse_link": (tmp_path / "sparse_link", "symbolic link"),
           "dangling": (tmp_path / "dangling", "symbolic link"),
           "device": (Path("/dev/null"), "character device")}
    os.mkfifo(out["fifo"][0])
    out["folder"][0].mkdir()
    out["link"][0].symlink_to(target)
    out["zero"][0].symlink_to("/dev/zero")
    out["sparse_link"][0].symlink_to(sparse)
    out["dangling"][0].symlink_to(tmp_path / "nowhere")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    out["socket"] = (tmp_path / "sock", "socket")
    yield out
    sock.close()


@pytest.mark.parametrize("reader", ["read_json", "scan_jsonl"])
@pytest.mark.parametrize("name", ["fifo", "folder", "link", "zero", "sparse_link", "dangling", "device", "socket"])
def test_a_reader_refuses_anything_but_a_regular_file_at_once(specials, reader, name):
    path, what = specials[name]
    if name == "dangling" and reader == "read_json":
        what = "symbolic link"
    with deadline(5), pytest.raises(io.UnsafeResultsFile) as e:  # a hang fails, no timing asserted
        getattr(io, reader)(path)
    message = str(e.value)
    assert "\n" not in message and str(path) in message and what in message


def test_a_json_file_over_its_cap_is_refused_before_it_is_read(tmp_path):
    """A 10 GB sparse summary.json: refused on its size, nothing read (no memory growth)."""
    import tracemalloc

    path = tmp_path / "summary.json"
    with open(path, "wb") as f:
        f.truncate(SPARSE_BYTES)
    tracemalloc.start()
    try:
        with deadline(5), pytest.raises(io.UnsafeResultsFile, match="summary.json holds 10737418240 bytes"):
            io.read_json(path)
        assert tracemalloc.get_traced_memory()[1] < 8 * 1024 * 1024  # the read buffer, not the file
    finally:
        tracemalloc.stop()
    assert io.json_cap(path) == io.JSON_CAPS["summary.json"]
    small = tmp_path / "point.json"
    small.write_text('{"x": "' + "a" * io.JSON_CAPS["point.json"] + '"}')
    with pytest.raises(io.UnsafeResultsFile, match="more than a point.json may"):
        io.read_json(small)
    small.write_text('{"x": 1}')
    assert io.read_json(small) == {"x": 1} and io.read_json(tmp_path / "missing.json") is None


@pytest.mark.parametrize("name", ["fifo", "link", "dangling", "zero", "folder"])
def test_an_append_never_writes_through_a_link_or_into_a_special_file(specials, tmp_path, name):
    path, what = specials[name]
    before = (tmp_path / "target.json").read_bytes()
    with deadline(5), pytest.raises(io.UnsafeResultsFile) as e:
        io.append_jsonl(path, {"x": 1})
    assert what in str(e.value) or "FIFO" in str(e.value)
    with deadline(5), pytest.raises(io.UnsafeResultsFile):
        io.open_append(path)
    assert (tmp_path / "target.json").read_bytes() == before
    assert not (tmp_path / "nowhere").exists()
    io.append_jsonl(tmp_path / "new.jsonl", {"x": 1})
    io.append_jsonl(tmp_path / "new.jsonl", {"x": 2})
    assert io.read_jsonl(tmp_path / "new.jsonl") == [{"x": 1}, {"x": 2}]


@pytest.mark.parametrize("writer", ["write_json_atomic", "write_text_atomic", "write_bytes_atomic",
                                    "save_figure", "rewrite_jsonl", "replacing"])
def test_a_whole_file_write_replaces_a_link_and_leaves_its_target_untouched(tmp_path, writer):
    target = tmp_path / "elsewhere" / "precious.txt"
    target.parent.mkdir()
    target.write_text("precious\n")
    stat = target.stat()
    path = tmp_path / "out.png"
    path.symlink_to(target)

    class Figure:
        def savefig(self, f, format, dpi):
            assert format == "png"
            f.write(b"PNG")

    write = {
        "write_json_atomic": lambda: io.write_json_atomic(path, {"a": 1}),
        "write_text_atomic": lambda: io.write_text_atomic(path, "text"),
        "write_bytes_atomic": lambda: io.write_bytes_atomic(path, b"bytes"),
        "save_figure": lambda: io.save_figure(Figure(), path, dpi=120),
        "rewrite_jsonl": lambda: io.rewrite_jsonl(path, [{"a": 1}]),
        "replacing": lambda: _write_replacing(path),
    }[writer]
    write()
    assert not path.is_symlink() and path.is_file() and path.stat().st_mode & 0o777 == 0o644
    assert target.read_text() == "precious\n" and target.stat().st_mtime_ns == stat.st_mtime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out.png"]  # no temp file left
    (tmp_path / "folder").mkdir()
    with pytest.raises(io.UnsafeResultsFile, match="is a folder"):
        io.write_text_atomic(tmp_path / "folder", "x")


def _write_replacing(path):
    with io.replacing(path, newline="") as f:
        f.write("a,b\r\n")


def test_real_folder_and_check_entry_refuse_links(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".hydra").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(io.UnsafeResultsFile, match=r"\.hydra is a symbolic link, not a real folder"):
        io.real_folder(tmp_path / ".hydra")
    with pytest.raises(io.UnsafeResultsFile, match="symbolic link"):
        io.check_entry(tmp_path / ".hydra", folder=True)
    assert io.real_folder(tmp_path / "made").is_dir() and io.real_folder(tmp_path / "made").is_dir()
    io.check_entry(tmp_path / "missing")
    with pytest.raises(io.UnsafeResultsFile, match="a folder, not a regular file"):
        io.check_entry(tmp_path / "made")
    with pytest.raises(io.UnsafeResultsFile, match="symbolic link"):
        io.refuse_link(tmp_path / ".hydra")
    io.refuse_link(tmp_path / "made")


def test_what_git_ignores_is_no_committed_record(tmp_path, monkeypatch):
    """``not_git_ignored``: a run's output in an ignored folder (``results/runs/`` after ``make
    run``) drops out of "every record under results/"; tracked and untracked-but-not-ignored files
    stay; outside a work tree nothing drops."""
    import shutil
    import subprocess

    from mtad.core.io import not_git_ignored
    from mtad.run.audit import committed_points
    from mtad.run.results.derive_segments import samples_files

    if shutil.which("git") is None:
        pytest.skip("git not installed")  # (what is tested is git's answer and what git runs; without git every path stays)
    outside = [tmp_path / "loose" / "samples.jsonl"]
    outside[0].parent.mkdir()
    outside[0].write_text("{}\n")
    assert not_git_ignored(outside) == outside
    repo = tmp_path / "repo"
    for d in ("results/runs/x", "results/claims/a", "results/new/b"):
        (repo / d).mkdir(parents=True)
        (repo / d / "samples.jsonl").write_text("{}\n")
    (repo / ".gitignore").write_text("results/runs/\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", ".gitignore", "results/claims"], check=True)
    assert samples_files([repo / "results"]) == sorted(repo.rglob("samples.jsonl"))  # not this checkout: all stay
    from mtad.core import io

    monkeypatch.setattr(io, "REPO_ROOT", repo)  # the checkout the readers run from
    assert committed_points(repo / "results") == [repo / "results/claims/a", repo / "results/new/b"]
    assert samples_files([repo / "results"]) == [repo / "results/claims/a/samples.jsonl",
                                                 repo / "results/new/b/samples.jsonl"]


def test_git_is_never_started_in_a_results_folders_own_repository(tmp_path):
    """A results folder may hold a ``.git`` whose config names a program (``core.fsmonitor``):
    ``not_git_ignored`` asks only the checkout's git, with that hook off, and runs nothing of the
    folder's, whether the folder lies outside the checkout or inside it."""
    import shutil
    import subprocess

    from mtad.core.io import not_git_ignored

    if shutil.which("git") is None:
        pytest.skip("git not installed")  # (what is tested is git's answer and what git runs; without git every path stays)
    marker = tmp_path / "ran"
    checkout = tmp_path / "checkout"
    (checkout / "results").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run(["git", "-C", str(checkout), "config", "core.fsmonitor", f"touch {marker}; false"], check=True)
    for folder in (tmp_path / "foreign", checkout / "results" / "foreign"):
        folder.mkdir()
        subprocess.run(["git", "init", "-q", str(folder)], check=True)
        subprocess.run(["git", "-C", str(folder), "config", "core.fsmonitor", f"touch {marker}; false"], check=True)
        (folder / "samples.jsonl").write_text("{}\n")
        got = not_git_ignored([folder / "samples.jsonl"], checkout=checkout)
        assert got == [folder / "samples.jsonl"] and not marker.exists(), folder


def test_segment_history_runs_no_program_a_repository_names(tmp_path):
    """``derive_segments.read_history`` reads ``git log -p`` of a repository: its config's text
    conversion, external diff and fsmonitor (named by a ``.gitattributes`` in the tree) never run."""
    import shutil
    import subprocess

    from mtad.run.results.derive_segments import read_history

    if shutil.which("git") is None:
        pytest.skip("git not installed")  # (what is tested is git's answer and what git runs; without git every path stays)
    marker = tmp_path / "ran"
    repo = tmp_path / "repo"
    (repo / "results/x").mkdir(parents=True)
    (repo / "results/x/samples.jsonl").write_text('{"example_id": 0}\n')
    (repo / ".gitattributes").write_text("*.jsonl diff=evil\n")

    def git(*a):
        subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)

    git("init", "-q")
    for key, value in (("diff.evil.textconv", f"sh -c 'touch {marker}; cat \"$0\"'"),
                       ("diff.external", f"sh -c 'touch {marker}'"), ("core.fsmonitor", f"touch {marker}; false"),
                       ("user.email", "t@t"), ("user.name", "t")):
        git("config", key, value)
    git("add", ".")
    git("commit", "-q", "-m", "records")
    subprocess.run(["git", "-C", str(repo), "log", "-p", "--format=%H"], capture_output=True)  # (the plant works:
    assert marker.exists()  # an ordinary log -p runs the text conversion)
    marker.unlink()
    read_history(repo)
    assert not marker.exists()


def _signed_commit_repo(repo: Path, marker: Path) -> None:
    """A repository whose config shows signatures in ``git log`` with a checker that leaves
    ``marker``, holding a signed-looking commit that changes a ``samples.jsonl`` under results/."""
    import subprocess

    def git(*a, **k):
        return subprocess.run(["git", "-c", "core.fsmonitor=false", "-C", str(repo), *a], check=True,
                              capture_output=True, text=True, **k).stdout.strip()

    (repo / "results/x").mkdir(parents=True)
    (repo / "results/x/samples.jsonl").write_text('{"example_id": 0}\n')
    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    git("add", ".")
    git("commit", "-q", "-m", "records")
    (repo / "results/x/samples.jsonl").write_text('{"example_id": 1}\n')
    git("add", ".")
    body = (f"tree {git('write-tree')}\nparent {git('rev-parse', 'HEAD')}\nauthor t <t@t> 1700000000 +0000\n"
            "committer t <t@t> 1700000000 +0000\ngpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n"
            " -----END PGP SIGNATURE-----\n\nsigned\n")
    git("update-ref", "HEAD", git("hash-object", "-t", "commit", "-w", "--stdin", input=body))
    checker = repo.parent / "checker"
    checker.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    checker.chmod(0o755)
    git("config", "gpg.program", str(checker))
    git("config", "log.showSignature", "true")


def test_no_git_here_starts_a_signature_checker_a_repository_names(tmp_path, monkeypatch):
    """``log.showSignature`` in a repository's config makes an ordinary ``git log`` start its
    ``gpg.program``: ``read_history`` (``mtad.core.io.git``) does not, and ``derive_segments``
    started from inside such a repository runs git in the checkout it is given, not there."""
    import shutil
    import subprocess

    from mtad.run.results import derive_segments

    if shutil.which("git") is None:
        pytest.skip("git not installed")  # (what is tested is what git runs; without git nothing runs)
    marker = tmp_path / "ran"
    repo = tmp_path / "repo"
    _signed_commit_repo(repo, marker)
    subprocess.run(["git", "-C", str(repo), "log", "-p", "--format=%H"], capture_output=True)  # (the plant works:
    assert marker.exists()  # an ordinary log starts the checker)
    marker.unlink()
    derive_segments.read_history(repo)
    assert not marker.exists()
    clean, asked = tmp_path / "clean", []
    clean.mkdir()
    monkeypatch.setattr(derive_segments, "REPO_ROOT", clean)
    monkeypatch.setattr(derive_segments, "read_history", lambda root: asked.append(root) or derive_segments.History())
    monkeypatch.chdir(repo)
    derive_segments.main(["--check", str(repo / "results")])
    assert asked == [clean] and not marker.exists()  # the checkout, not the working directory's repository


def test_a_stored_commit_reaches_git_only_as_a_hash():
    """``audit._is_ancestor`` takes commit names from stored segments: anything but a hex hash
    (an option, a revision expression) is not passed to git."""
    from mtad.core.io import is_commit_name
    from mtad.run.audit import _is_ancestor

    assert is_commit_name("d397e67b0b") and is_commit_name("A" * 40)
    for bad in ("--output=/tmp/x", "HEAD~1", "abc", "g" * 10, "a" * 41, None, 7):
        assert not is_commit_name(bad)
    assert _is_ancestor("--help", "a" * 40) is None

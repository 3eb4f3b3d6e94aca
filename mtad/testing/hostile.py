"""Hostile results folders, one per class of attack, and each reader run over them.

    python -m mtad.testing.hostile --before OLD_CHECKOUT --after NEW_CHECKOUT \\
        --out results/security/hostile_round4.md [--only 1,3] [--limit 60]

A results folder is data (docs/trust.md). Each ``Case`` builds, under a scratch folder, a
folder (or a command line) that attacks one reader the way a shared folder could: by the
settings it stores (the scorer's sandbox, a problem file, a class to build, a judge endpoint,
an interpolation), by links, FIFOs and sizes where files belong, by names that other
programs interpret, by a query that outlives its timeout, or by values that the command line
takes. ``run_case`` runs the reader as a user does, in a fresh interpreter whose working
folder is a checkout (``PYTHONPATH`` = that checkout), and reads from outside what happened:
exit status, wall seconds, peak resident memory (``os.wait4``), whether the canary file
outside the folder was created or changed (written outside), whether the local HTTP server
got a request (sent), whether the secret environment variable's value appears in any output
or file (leaked), whether a run folder was made. ``Outcome.safe`` is the bar: nothing
written outside, sent or leaked, no hang, and either a refusal in one line (exit 2, no
traceback) or a run that ended well.

Each case names the protection that holds it (``fixed_by``): the safe file access of
``mtad.core.io`` (5-6), the escaping of ``mtad.core.escape`` (7), the SQL child process of
``eval.sql_exec`` (8); the others, the loader of stored configs (``mtad.run.results.described``).
``tests/run/test_hostile_folders.py`` runs every case; the command above measures each one
against two checkouts and writes the before/after table.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SECRET_VAR = "MTAD_HOSTILE_SECRET"
#: The committed point every folder starts from: tiny pair, SpD, the smoke task, 2 examples.
BASE_SWEEP = "results/sweeps/table2_smoke"
BASE_DECODER = "spd"
TINY_RUN = ["model=tiny_random", "decoder=spd", "task=smoke", "limit=1", "max_new_tokens=4",
            "perplexity=false", "warmup=0"]


# ----------------------------------------------------------------------------- what a case may use
class Server:
    """A local HTTP server that counts requests (and whether one carried the secret); answers
    a judge's question with the best rating."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.secret = secrets.token_hex(16)  # the value a request must not carry
        self.secret_sent = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.requests.append(f"{self.command} {self.path}")
                if outer.secret in str(self.headers) or outer.secret.encode() in body:
                    outer.secret_sent = True
                data = json.dumps({"choices": [{"message": {"content": "Rating: [[10]]"}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class Env:
    """The scratch folder of one case and the traps it is judged by."""

    checkout: Path  # the checkout whose code runs (its committed base point is copied)
    scratch: Path
    server: Server
    secret: str
    canary: Path = field(init=False)  # outside every results folder: must stay as it is

    def __post_init__(self) -> None:
        self.canary = self.scratch / "outside" / "canary.txt"
        self.canary.parent.mkdir(parents=True, exist_ok=True)
        self.canary.write_text("original\n")


@dataclass
class Case:
    """One attack: ``build`` makes its folder(s) under ``env.scratch`` and returns the reader's
    argv (after ``python``), run with the checkout as working folder."""

    key: str
    item: int  # the class of attack (1-9)
    route: str  # the reader, as a user runs it
    attack: str
    build: Callable[[Env], list[str]]
    expect: str = "refusal"  # after the fix: "refusal" (one line), "run" (exit 0) or "either"
    fixed_by: str | None = None  # "file-access", "rendering", "SQL": the protection (None: the loader)
    limit_s: float = 60.0  # a run still going after this is killed (a hang)
    bound_s: float | None = None  # the time the reader must end within when safe
    no_folder: Path | None = None  # relative to scratch: must not exist afterwards
    slow: bool = False


@dataclass
class Outcome:
    rc: int
    seconds: float
    peak_mb: float
    timed_out: bool
    stdout: str
    stderr: str
    canary: str  # "untouched", "created" / "changed" (written outside), "removed"
    requests: int
    secret_sent: bool
    leaked: bool  # the secret's value in stdout, stderr or a file under scratch
    folder_made: bool

    @property
    def refusal(self) -> bool:
        lines = [x for x in self.stderr.splitlines() if x.strip()]
        return (self.rc not in (0, None) and not self.timed_out and "Traceback" not in self.stderr
                and bool(lines) and lines[-1].split(":", 1)[0] in ("error", "mtad-audit", "mtad-sweep"))

    def safe(self, case: Case) -> bool:
        clean = (self.canary == "untouched" and not self.requests and not self.secret_sent
                 and not self.leaked and not self.timed_out and not self.folder_made)
        in_time = case.bound_s is None or self.seconds <= case.bound_s
        ran = self.rc == 0 and "Traceback" not in self.stderr
        ended = {"refusal": self.refusal, "run": ran, "either": self.refusal or ran}[case.expect]
        return clean and in_time and ended

    def verdict(self) -> str:
        found = []
        if self.canary != "untouched":
            found.append(f"**file outside {self.canary}**")
        if self.requests:
            found.append(f"**{self.requests} request(s) sent**" + (" **with the secret**" if self.secret_sent else ""))
        if self.leaked:
            found.append("**secret leaked**")
        if self.folder_made:
            found.append("run folder made")
        if self.timed_out:
            found.append(f"**still running, killed at {self.seconds:.0f} s**")
        lines = [x for x in self.stderr.splitlines() if x.strip()]
        last = lines[-1][:110].replace("|", "\\|") if lines else ""
        head = f"exit {self.rc}, {len(lines)} stderr lines" + (f": `{last}`" if last else "")
        if "Traceback" in self.stderr:
            head += " (traceback)"
        return "; ".join([*found, head])


# ----------------------------------------------------------------------------- building folders
def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def base_point(env: Env, name: str = "sweep") -> Path:
    """A copy of the committed SpD smoke point under ``scratch/<name>/<hash>/`` (a sweep)."""
    src = next(p.parent for p in sorted((env.checkout / BASE_SWEEP).glob("*/point.json"))
               if _read(p).get("choices", {}).get("decoder") == BASE_DECODER)
    dst = env.scratch / name / src.name
    shutil.copytree(src, dst)
    for lock in dst.glob(".lock"):
        lock.unlink()
    return dst


def set_stored(folder: Path, edit: Callable[[dict], None]) -> None:
    """Apply ``edit`` to the stored config, in ``config.json`` and in the summary's copy."""
    config = _read(folder / "config.json")
    edit(config)
    _write(folder / "config.json", config)
    summary = _read(folder / "summary.json")
    edit(summary["config"])
    _write(folder / "summary.json", summary)


def _records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines() if x.strip()]


def _set_records(folder: Path, records: list[dict]) -> None:
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _writes_canary(env: Env, what: str = "written by the folder") -> str:
    return f"open({str(env.canary)!r}, 'w').write({what!r})"


# ----------------------------------------------------------------------------- the cases
def c1_sandbox_settings(env: Env) -> list[str]:
    folder = base_point(env)

    def edit(c):
        c["task"]["scorer"].update(isolation="rlimits", drop_privileges=False)
    set_stored(folder, edit)
    records = _records(folder)
    records[0]["text"] = f"    {_writes_canary(env)}\n    return False\n"
    _set_records(folder, records)
    return ["-m", "mtad.analysis.rescore", str(folder)]


def c2_problem_file(env: Env) -> list[str]:
    folder = base_point(env)
    problems = folder / "problems.jsonl"
    rows = []
    for r in _records(folder):
        rows.append({"task_id": r["example_id"],
                     "prompt": "def has_close_elements(numbers, threshold):\n    \"\"\"Close?\"\"\"\n",
                     "entry_point": "has_close_elements", "canonical_solution": "    return False\n",
                     "test": f"def check(candidate):\n    import os\n    {_writes_canary(env)}\n"})
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    set_stored(folder, lambda c: c["task"].update(problem_file=str(problems)))
    return ["-m", "mtad.analysis.rescore", str(folder)]


def _audit(env: Env, edit: Callable[[dict], None]) -> list[str]:
    folder = base_point(env)
    set_stored(folder, edit)
    out = env.scratch / "audit"
    return ["-m", "mtad.run.audit", str(folder), "--n", "1", "--out", str(out / "audit.jsonl"),
            "--table", str(out / "audit.md")]


def c3_copyfile(env: Env) -> list[str]:
    (env.scratch / "outside" / "src.txt").write_text("copied by the folder\n")
    return _audit(env, lambda c: c.update(model={"_target_": "shutil.copyfile",
                                                 "_args_": [str(env.scratch / "outside" / "src.txt"), str(env.canary)]}))


def c3_urlopen(env: Env) -> list[str]:
    return _audit(env, lambda c: c.update(model={"_target_": "urllib.request.urlopen",
                                                 "url": env.server.url + "/model"}))


def c3_secret_name(env: Env) -> list[str]:
    return _audit(env, lambda c: c["task"].update(name="${oc.env:" + SECRET_VAR + "}"))


def c4_judge(env: Env) -> list[str]:
    folder = base_point(env)
    judge = {"url": env.server.url + "/v1", "model": "judge", "api_key_env": SECRET_VAR, "timeout_s": 5.0}

    def edit(c):
        c["task"] = {"_target_": "mtad.tasks.mt_bench.MTBenchTask", "name": "mt_bench", "limit": 1,
                     "max_prompt_tokens": 2048, "chat": True, "stop": [], "data_dir": None,
                     "judge": judge, "scorer": None}
    set_stored(folder, edit)
    point = _read(folder / "point.json")
    point["choices"]["task"] = "mt_bench"
    _write(folder / "point.json", point)
    records = _records(folder)[:1]
    records[0].update(example_id="mt_bench-81", turn=0, index=0)
    second = dict(records[0], turn=1)
    _set_records(folder, [records[0], second])
    return ["-m", "mtad.analysis.rescore", str(folder)]


def c9_stored_interpolation(env: Env) -> list[str]:
    folder = base_point(env)
    set_stored(folder, lambda c: c["task"]["scorer"].update(timeout="${oc.env:" + SECRET_VAR + "}"))
    return ["-m", "mtad.analysis.rescore", str(folder)]


def _run(*overrides: str) -> Callable[[Env], list[str]]:
    def build(env: Env) -> list[str]:
        return ["run.py", *TINY_RUN, *overrides, f"hydra.run.dir={env.scratch / 'run'}"]
    return build


def c9_data_dir(missing: bool) -> Callable[[Env], list[str]]:
    def build(env: Env) -> list[str]:
        where = env.scratch / ("missing" if missing else "empty")
        if not missing:
            where.mkdir()
        return ["run.py", *TINY_RUN, "task=spider", f"task.data_dir={where}", f"hydra.run.dir={env.scratch / 'run'}"]
    return build


# classes 5-8: the file-access, rendering and SQL work
def c5_resume_link(env: Env) -> list[str]:
    folder = base_point(env)
    (folder / ".hydra").mkdir(exist_ok=True)
    target = folder / ".hydra" / "config.yaml"
    target.unlink(missing_ok=True)
    target.symlink_to(env.canary)
    ident = _read(folder / "point.json")["identity"]  # resume the very point the folder holds
    same = [f"seed={ident['seed']}", f"max_new_tokens={ident['max_new_tokens']}",
            *(f"{k}={v}" for k, v in ident["sampling"].items()), f"gamma={ident['decoder']['gamma']}"]
    return ["run.py", *[o for o in TINY_RUN if not o.startswith(("limit", "max_new_tokens"))], "limit=2", *same,
            f"hydra.run.dir={folder}"]


def c5_render_out_link(env: Env) -> list[str]:
    folder = base_point(env)
    out = env.scratch / "rendered"
    out.mkdir()
    (out / "points.csv").symlink_to(env.canary)
    return ["-m", "mtad.analysis.render", str(folder.parent), "--all", "--out", str(out)]


def c6_fifo_summary(env: Env) -> list[str]:
    folder = base_point(env)
    (folder / "summary.json").unlink()
    os.mkfifo(folder / "summary.json")
    return ["-m", "mtad.analysis.rescore", str(folder)]


def c7_names(env: Env) -> list[str]:
    folder = base_point(env)
    point = _read(folder / "point.json")
    point["choices"].update(decoder="=HYPERLINK(\"http://x\")", task="a|b\n| forged | row |")
    _write(folder / "point.json", point)
    summary = _read(folder / "summary.json")
    summary.update(decoder="=1+1", task="$\\frac{x$/y")
    _write(folder / "summary.json", summary)
    set_stored(folder, lambda c: c["task"].update(name="$\\frac{x$/y|z"))
    out = env.scratch / "rendered"
    check = ("import csv,sys,subprocess;"
             f"r=subprocess.run([sys.executable,'-m','mtad.analysis.render',{str(folder.parent)!r},'--all','--out',{str(out)!r}]);"
             "import pathlib;bad=[c for p in pathlib.Path(" + repr(str(out)) + ").glob('*.csv') for row in csv.reader(open(p)) "
             "for c in row if c[:1] in ('=','+','@')];"
             "print('formula cells:', bad[:3]) if bad else None;"
             "sys.exit(r.returncode or (3 if bad else 0))")
    return ["-c", check]


def c8_spider_printf(env: Env) -> list[str]:
    code = (
        "import time,sys\n"
        "from types import SimpleNamespace\n"
        "from eval.spider_exec import SpiderExecutionScorer\n"
        "db='data/spider/database/concert_singer/concert_singer.sqlite'\n"
        "ref={'query':'SELECT count(*) FROM singer','db_path':db,'db_id':'concert_singer'}\n"
        "s=SpiderExecutionScorer(timeout_s=1.0)\n"
        "ex=SimpleNamespace(reference=ref,id='x',turns=['q'],meta={})\n"
        "sql='SELECT ' + ', '.join([\"printf('%.*c', 2147483647, 'x')\"]*3)\n"
        "t=time.monotonic(); v=s.score(ex, sql); dt=time.monotonic()-t\n"
        "print(f'score {v} in {dt:.1f} s')\n"
        "sys.exit(0 if dt <= 2.0 else 4)\n")
    return ["-c", code]


CASES: list[Case] = [
    Case("1-rescore-sandbox", 1, "rescore", "stored `task.scorer` isolation=rlimits, drop_privileges=false; "
         "a completion that writes a host file", c1_sandbox_settings, expect="run"),
    Case("2-rescore-problem-file", 2, "rescore", "stored `task.problem_file` in the folder, whose test writes a "
         "host file", c2_problem_file, expect="run"),
    Case("3-audit-copyfile", 3, "audit", "stored model `_target_: shutil.copyfile`", c3_copyfile),
    Case("3-audit-urlopen", 3, "audit", "stored model `_target_: urllib.request.urlopen` (a local server)",
         c3_urlopen),
    Case("3-audit-secret-name", 3, "audit", "stored `task.name: ${oc.env:SECRET}`", c3_secret_name),
    Case("4-rescore-judge", 4, "rescore", "stored MT-Bench judge url (a local server), api_key_env naming a "
         "secret", c4_judge),
    Case("5-resume-link", 5, "resume", "`.hydra/config.yaml` a link to a file outside", c5_resume_link,
         fixed_by="file-access", slow=True),
    Case("5-render-out-link", 5, "render", "`--out` folder holding a link to a file outside",
         c5_render_out_link, expect="either", fixed_by="file-access", slow=True),
    Case("6-rescore-fifo", 6, "rescore", "a FIFO in place of `summary.json`", c6_fifo_summary,
         fixed_by="file-access", limit_s=8.0, bound_s=5.0),
    Case("7-render-names", 7, "render", "decoder and task names with `=`, `|`, newlines, `$` and `/`", c7_names,
         expect="run", fixed_by="rendering", slow=True),
    Case("8-spider-printf", 8, "Spider scorer", "three `printf('%.*c', 2147483647, 'x')` columns, 1 s timeout",
         c8_spider_printf, expect="run", fixed_by="SQL", slow=True, limit_s=90.0),
    Case("9-max-new-tokens-huge", 9, "run.py", "`max_new_tokens=99999999999999999999`",
         _run("max_new_tokens=99999999999999999999"), no_folder=Path("run")),
    Case("9-max-new-tokens-2-63", 9, "run.py", "`max_new_tokens=9223372036854775808` (2**63)",
         _run("max_new_tokens=9223372036854775808"), no_folder=Path("run"), slow=True),
    Case("9-temperature-inf", 9, "run.py", "`temperature=inf`", _run("temperature=inf"), no_folder=Path("run")),
    Case("9-data-dir-missing", 9, "run.py", "`task.data_dir` naming a missing folder", c9_data_dir(True),
         no_folder=Path("run"), slow=True),
    Case("9-data-dir-wrong", 9, "run.py", "`task.data_dir` naming an empty folder", c9_data_dir(False),
         no_folder=Path("run")),
    Case("9-rescore-interpolation", 9, "rescore", "stored `task.scorer.timeout: ${oc.env:SECRET}`",
         c9_stored_interpolation),
]
BY_KEY = {c.key: c for c in CASES}


# ----------------------------------------------------------------------------- running one case
def run_case(case: Case, checkout: Path, scratch: Path, server: Server | None = None,
             python: str | None = None) -> Outcome:
    """Build ``case`` under ``scratch`` and run its reader with ``checkout``'s code."""
    own_server = server is None
    server = server or Server()
    secret = secrets.token_hex(16)
    server.requests.clear()
    server.secret, server.secret_sent = secret, False
    env = Env(Path(checkout).resolve(), Path(scratch).resolve(), server, secret)
    argv = case.build(env)
    before = env.canary.read_bytes()
    full_env = {**os.environ, "PYTHONPATH": str(env.checkout), "HF_HUB_OFFLINE": "1", SECRET_VAR: secret,
                "TOKENIZERS_PARALLELISM": "false"}
    full_env.pop("PYTHONSTARTUP", None)
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    # the peak of the reader itself: a high-water mark survives exec, so a child forked from this
    # (larger) process would start at this one's; /usr/bin/time forks it from a small process
    timer = shutil.which("time", path="/usr/bin:/bin")
    peak_file = env.scratch / ".peak_kb"
    cmd = [python or sys.executable, *argv]
    if timer:
        cmd = [timer, "-f", "%M", "-o", str(peak_file), *cmd]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=env.checkout, env=full_env, stdout=out,
                            stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
    timed_out = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - t0 > case.limit_s:
            os.killpg(proc.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(proc.pid, 0)
            timed_out = True
            break
        time.sleep(0.05)
    seconds = time.monotonic() - t0
    try:  # whatever the reader left running in its session
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    out.seek(0)
    err.seek(0)
    stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if not env.canary.exists():
        canary = "removed"
    else:
        canary = "untouched" if env.canary.read_bytes() == before else "changed"
    leaked = secret in stdout or secret in stderr or _secret_in_files(env.scratch, secret)
    peak_kb = usage.ru_maxrss
    try:
        peak_kb = int(peak_file.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        pass  # killed before time wrote it, or no /usr/bin/time: the upper bound from wait4
    rc = os.waitstatus_to_exitcode(status)
    if timer and rc == 128 + signal.SIGKILL:  # time reports its child's kill as its own status
        rc = -signal.SIGKILL
    result = Outcome(
        rc=rc, seconds=seconds, peak_mb=peak_kb / 1024,
        timed_out=timed_out, stdout=stdout, stderr=stderr, canary=canary, requests=len(server.requests),
        secret_sent=server.secret_sent or any(secret in r for r in server.requests), leaked=leaked,
        folder_made=case.no_folder is not None and (env.scratch / case.no_folder).exists())
    if own_server:
        server.close()
    return result


def _secret_in_files(root: Path, secret: str) -> bool:
    needle = secret.encode()
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            try:
                if path.is_symlink() or not path.is_file() or path.stat().st_size > 50 << 20:
                    continue
                if needle in path.read_bytes():
                    return True
            except OSError:
                continue
    return False


# ----------------------------------------------------------------------------- before / after table
def _row(case: Case, before: Outcome | None, after: Outcome) -> str:
    def cells(o: Outcome | None) -> list[str]:
        if o is None:
            return ["", "", ""]
        return [f"{o.seconds:.2f}", f"{o.peak_mb:.0f}", o.verdict()]
    owner = f" ({case.fixed_by})" if case.fixed_by else ""
    return "| " + " | ".join([str(case.item), case.route, case.attack + owner, *cells(before), *cells(after),
                              "yes" if after.safe(case) else "**no**"]) + " |"


def _checkout_text(checkout: Path) -> str:
    """A checkout's commit and the files it changes beyond it (what ran is that commit plus them)."""
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(checkout), *a], capture_output=True, text=True,
                              timeout=30).stdout.rstrip("\n")  # porcelain lines start with a space

    changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]
    return f"commit `{git('rev-parse', '--short', 'HEAD')}`" + (
        f" with uncommitted changes to {', '.join(f'`{c}`' for c in changed)}" if changed else "")


def _machine_text() -> str:
    """This machine's CPU model and core count, as /proc/cpuinfo says."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mtad.testing.hostile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, help="the checkout before the change")
    ap.add_argument("--after", type=Path, required=True, help="the checkout after the change")
    ap.add_argument("--out", type=Path, help="the Markdown table to write (default: print it)")
    ap.add_argument("--only", help="classes (1-9) or case keys, comma-separated")
    ap.add_argument("--limit", type=float, help="kill a reader after this many seconds (default: per case)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter to run the readers with")
    args = ap.parse_args(argv)
    wanted = [w.strip() for w in (args.only or "").split(",") if w.strip()]
    cases = [c for c in CASES if not wanted or str(c.item) in wanted or c.key in wanted]
    if not cases:
        ap.error(f"--only {args.only!r} names no case; cases: {', '.join(BY_KEY)}")
    rows = []
    server = Server()
    try:
        with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
            for i, case in enumerate(cases):
                if args.limit:
                    case = Case(**{**case.__dict__, "limit_s": args.limit})
                outcomes = {}
                for side, checkout in (("before", args.before), ("after", args.after)):
                    if checkout is None:
                        continue
                    scratch = Path(tmp) / f"{i}-{side}"
                    scratch.mkdir()
                    outcomes[side] = run_case(case, checkout, scratch, server, args.python)
                    print(f"{case.key} {side}: {outcomes[side].verdict()}", file=sys.stderr)
                rows.append(_row(case, outcomes.get("before"), outcomes["after"]))
    finally:
        server.close()
    head = [
        "# Hostile results folders, round four: before and after",
        "",
        "Made by `python -m mtad.testing.hostile --before <old> --after <new>` (`mtad.testing.hostile`). "
        "Each reader runs as a user runs it, in a fresh interpreter working in the checkout; seconds and MB "
        "are the whole process's wall time and peak resident memory (`/usr/bin/time`; for a reader killed at "
        "its limit, an upper bound). *written outside*: the canary file "
        "outside every results folder was created or changed; *sent*: the local server got a request; "
        "*leaked*: the value of a secret environment variable appeared in an output or a file. *safe*: none "
        "of these, no hang, and a one-line refusal or a run that ended well. In parentheses after an attack: "
        "the protection that holds it (file-access: `mtad.core.io`; rendering: `mtad.core.escape`; SQL: "
        "`eval.sql_exec`; none: the loader of stored configs, `mtad.run.results.described`).",
        "",
        *[f"- {side}: {_checkout_text(c)}" for side, c in (("before", args.before), ("after", args.after)) if c],
        f"- machine: {_machine_text()}",
        "",
        "| class | reader | attack | before s | before MB | before | after s | after MB | after | safe |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    text = "\n".join(head + rows) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

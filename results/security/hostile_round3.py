"""Hostile inputs, round three: each attack run against two checkouts, side by side.

    .venv/bin/python results/security/hostile_round3.py --before /path/to/old/checkout \
        --after . --out results/security/hostile_round3.md

Every attack runs in a fresh interpreter (``PYTHONPATH`` = the checkout, working folder a new
temporary folder) and is measured from outside: wall time, the peak resident memory of the
process (``os.wait4``'s ``ru_maxrss``), its exit status and how many lines it wrote to stderr;
its verdict is read from what it left behind (a copied file, a summary) or printed. Spider
queries are measured inside the scoring process as ``tests/eval/test_scorer_bounds.py`` does:
seconds of the hostile query and growth of the peak resident memory over a legitimate query
scored first. An attack still running at ``--limit`` seconds is killed and shown as such.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPIDER_DB = "data/spider/database/concert_singer/concert_singer.sqlite"
TINY = ["+experiment=debug", "limit=2", "max_new_tokens=4", "perplexity=false", "~task.scorer", "decoder=spd"]
HUMANEVAL = ["+experiment=debug", "task=humaneval", "limit=1", "max_new_tokens=4", "perplexity=false"]


def measure(cmd: list[str], root: Path, cwd: Path, limit: float, env: dict | None = None) -> dict:
    """Run ``cmd`` with ``root`` on PYTHONPATH; wall seconds, peak RSS (MB), exit status, output."""
    full_env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", **(env or {})}
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=out, stderr=err, start_new_session=True)
    killed = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - t0 > limit:
            os.killpg(proc.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(proc.pid, 0)
            killed = True
            break
        time.sleep(0.05)
    wall = time.monotonic() - t0
    out.seek(0)
    err.seek(0)
    stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    return {"wall_s": wall, "peak_mb": usage.ru_maxrss / 1024, "rc": os.waitstatus_to_exitcode(status),
            "killed": killed, "stdout": stdout, "stderr": stderr,
            "stderr_lines": len([x for x in stderr.splitlines() if x.strip()])}


def py(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def run_py(root: Path, *overrides: str) -> list[str]:
    """``run.py`` of ``root`` (a script's own folder comes first on ``sys.path``)."""
    return [sys.executable, str(root / "run.py"), *overrides]


def outcome(m: dict) -> str:
    if m["killed"]:
        return f"still running, killed at {m['wall_s']:.0f} s"
    last = (m["stderr"].strip().splitlines() or [""])[-1][:110]
    return f"exit {m['rc']}, {m['stderr_lines']} stderr lines" + (f": `{last}`" if last else "")


# ------------------------------------------------------------------ attacks
def write_point(folder: Path, task: dict, decoder: str = "mtad.decoders.spd.SpD") -> None:
    config = {"task": task, "decoder": {"_target_": decoder}, "model": {"name": "tiny_random"}, "limit": 1,
              "seed": 0}
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "summary.json").write_text(json.dumps({
        "decoder": "spd", "task": "spider", "metrics": {"examples": 1}, "config": config,
        "score": {"metric": "spider_exec_acc", "version": "2", "value": 1.0, "n": 1}}))
    (folder / "samples.jsonl").write_text(json.dumps(
        {"example_id": "spider-dev-0", "turn": 0, "index": 0, "text": "SELECT 1", "score": 1.0}) + "\n")


def attack_rescore(root: Path, work: Path, limit: float) -> tuple[dict, str]:
    dest = work / "COPIED"
    write_point(work / "point", {"_target_": "shutil.copyfile", "_args_": ["/etc/hostname", str(dest)],
                                 "scorer": None})
    m = measure([sys.executable, "-m", "mtad.analysis.rescore", str(work / "point")], root, work, limit)
    return m, ("**file copied**" if dest.exists() else "not copied") + "; " + outcome(m)


def attack_names(root: Path, work: Path, limit: float) -> tuple[dict, str]:
    spider = {"_target_": "mtad.tasks.spider.SpiderTask", "name": "spider",
              "scorer": {"_target_": "eval.spider_exec.SpiderExecutionScorer"}}
    write_point(work / "sweep" / "aaa", spider, decoder="this.X")  # importing `this` prints a poem
    m = measure([sys.executable, "-m", "mtad.analysis.render", str(work / "sweep"), "--all", "--out",
                 str(work / "out")], root, work, limit)
    ran = "Beautiful is better than ugly" in m["stdout"]
    return m, ("**module `this` imported (its poem printed)**" if ran else "nothing imported") + "; " + outcome(m)


SPIDER = """
import json, resource, sys, time, types
from eval.spider_exec import SpiderExecutionScorer
scorer = SpiderExecutionScorer(timeout_s=5.0)
ex = types.SimpleNamespace(reference={"query": "SELECT name FROM singer WHERE age > 30", "db_path": sys.argv[2]})
legit = scorer.score(ex, "SELECT name FROM singer WHERE age > 30")
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.monotonic()
hostile = scorer.score(ex, sys.argv[1])
print(json.dumps({"legit": legit, "hostile": hostile, "seconds": time.monotonic() - t0,
                  "growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024,
                  "detail": scorer.last_error}))
"""


def spider(sql: str):
    def attack(root: Path, work: Path, limit: float) -> tuple[dict, str]:
        m = measure(py(SPIDER, sql, str(root / SPIDER_DB)), root, work, limit)
        if m["killed"] or m["rc"] != 0:
            return m, outcome(m) + " (MB: the whole process's peak)"
        r = json.loads(m["stdout"].strip().splitlines()[-1])
        m["wall_s"], m["peak_mb"] = r["seconds"], r["growth_mb"]  # the query itself
        return m, f"score {r['hostile']} (legit {r['legit']}); error: {r['detail'] or 'none (empty result)'}"
    return attack


def tiny_folder(root: Path, work: Path) -> Path:
    """A finished tiny-model point (two records) made with ``root``'s code, cached per root."""
    cache = work.parents[1] / f"tiny-{abs(hash(str(root)))}"
    if not cache.exists():
        m = measure(run_py(root, *TINY, f"hydra.run.dir={cache}"), root, work, 600)
        assert m["rc"] == 0, m["stderr"][-2000:]
    return cache


def record_line(make):
    def attack(root: Path, work: Path, limit: float) -> tuple[dict, str]:
        folder = work / "run"
        shutil.copytree(tiny_folder(root, work), folder)
        lines = (folder / "samples.jsonl").read_text().splitlines()
        (folder / "samples.jsonl").write_text(lines[0] + "\n" + make(json.loads(lines[1])) + "\n")
        (folder / "summary.json").unlink()
        m = measure(run_py(root, *TINY, f"hydra.run.dir={folder}"), root, work, limit)
        warned = (m["stdout"] + m["stderr"]).count("repaired ")
        done = (folder / "summary.json").exists()
        kept = (folder / "samples.jsonl").read_text().splitlines()
        verdict = (f"resumed, line recomputed ({warned} warning)" if done and warned and len(kept) == 2 else
                   "summary written, line kept as it was" if done else "**resume fails**")
        return m, f"{verdict}; {outcome(m)}"
    return attack


def _swap(record: dict, key: str, raw: str) -> str:
    return json.dumps(record).replace(f'"{key}": {json.dumps(record[key])}', f'"{key}": {raw}')


FOLDER_READ = """
import json, sys
from mtad.run.results import PointFolder, load_point
folder = PointFolder(sys.argv[1])
try:
    {call}
    print("read without complaint")
except Exception as e:
    print(f"{{type(e).__name__}}: {{str(e)[:120]}}")
"""


def folder_file(name: str, text: str, call: str):
    def attack(root: Path, work: Path, limit: float) -> tuple[dict, str]:
        folder = work / "run"
        shutil.copytree(tiny_folder(root, work), folder)
        if name == "summary.json" and text.startswith("+"):
            summary = json.loads((folder / name).read_text())
            summary.update(json.loads(text[1:]))
            text_ = json.dumps(summary)
        else:
            text_ = text
        (folder / name).write_text(text_)
        m = measure(py(FOLDER_READ.format(call=call), str(folder)), root, work, limit)
        said = (m["stdout"].strip().splitlines() or ["(nothing)"])[-1]
        if m["rc"] != 0:
            said = f"traceback ({m['stderr_lines']} lines): {m['stderr'].strip().splitlines()[-1][:100]}"
        return m, f"`{said}`"
    return attack


LONG_LINE = """
import sys
from mtad.run.results import PointFolder
check = PointFolder(sys.argv[1]).check(repair=True)
print(f"{len(check.records)} records kept; dropped {check.describe()}")
"""


def long_line(size_mb: int):
    def attack(root: Path, work: Path, limit: float) -> tuple[dict, str]:
        folder = work / "run"
        shutil.copytree(tiny_folder(root, work), folder)
        lines = (folder / "samples.jsonl").read_text().splitlines()
        with open(folder / "samples.jsonl", "w") as f:  # in pieces: this process stays small, so
            f.write(lines[0] + '\n{"text": "')      # its children's peak is their own (ru_maxrss)
            for _ in range(size_mb):
                f.write("x" * (1 << 20))
            f.write('"}\n' + lines[1] + "\n")
        m = measure(py(LONG_LINE, str(folder)), root, work, limit)
        base = measure(py("import mtad.run.results"), root, work, limit)["peak_mb"]
        m["peak_mb"] -= base  # above the interpreter with the results package imported
        return m, (m["stdout"].strip() or outcome(m))[:120]
    return attack


def run_attack(overrides: list[str], env: dict | None = None, needs_folder: bool = True):
    def attack(root: Path, work: Path, limit: float) -> tuple[dict, str]:
        out = work / "run"
        m = measure(run_py(root, *overrides, f"hydra.run.dir={out}"), root, work, limit, env)
        left = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
        scores = []
        if (out / "samples.jsonl").exists():
            scores = [json.loads(x).get("score") for x in (out / "samples.jsonl").read_text().splitlines()]
        return m, (f"scores {scores}; " if scores else "") + outcome(m) + \
            (f"; folder holds {', '.join(left)}" if left else "; no folder")
    return attack


def file_run_dir(root: Path, work: Path, limit: float) -> tuple[dict, str]:
    (work / "afile").write_text("")
    m = measure(run_py(root, *TINY, f"hydra.run.dir={work / 'afile'}"), root, work, limit)
    return m, outcome(m)


ATTACKS = [
    ("1", "rescore of a folder whose config names `shutil.copyfile`", attack_rescore),
    ("1", "render of a folder whose decoder names `this.X`", attack_names),
    ("2", "Spider: `instr` of 9M by 4.5M characters", spider(
        "SELECT name FROM singer WHERE instr(printf('%.*c', 9000000, 'a'), printf('%.*c', 4500000, 'a') || 'b') = 0")),
    ("2", "Spider: `replace` of 9M by 4.5M characters", spider(
        "SELECT length(replace(printf('%.*c', 9000000, 'a'), printf('%.*c', 4500000, 'a') || 'b', 'x'))")),
    ("2", "Spider: `instr` of 1M by 0.5M characters", spider(
        "SELECT instr(printf('%.*c', 1000000, 'a'), printf('%.*c', 500000, 'a') || 'b')")),
    ("2", "Spider: 60 largest allowed `instr` calls a row, endless rows", spider(
        "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT " + " + ".join(
            ["instr(printf('%.*c', 9990 - i % 2, 'a'), printf('%.*c', 4990, 'a') || 'b')"] * 60) + " FROM r")),
    ("2", "Spider: one row of 27 `randomblob(9000000)`", spider(
        "SELECT " + ", ".join(["randomblob(9000000)"] * 27))),
    ("3", "record line of 200,000 `[`", record_line(lambda r: "[" * 200_000)),
    ("3", "record with a 5,000-digit integer", record_line(lambda r: _swap(r, "steps", "9" * 5000))),
    ("3", "record with `NaN` wall time", record_line(lambda r: _swap(r, "wall_time", "NaN"))),
    ("3", "record with `Infinity` wall time", record_line(lambda r: _swap(r, "wall_time", "Infinity"))),
    ("3", "record with `10**400` new tokens", record_line(lambda r: _swap(r, "new_tokens", str(10**400)))),
    ("3", "record with `\"accepted_per_step\": [\"a\"]`", record_line(lambda r: _swap(r, "accepted_per_step", '["a"]'))),
    ("3", "`summary.json` with `\"limit\": \"x\"` (status)", folder_file(
        "summary.json", '+{"limit": "x"}', "folder.status(json.load(open(sys.argv[1] + '/summary.json'))['identity_hash'], 2)")),
    ("3", "`summary.json` with `\"config\": [1, 2]` (render's reader)", folder_file(
        "summary.json", '+{"config": [1, 2]}', "load_point(sys.argv[1])")),
    ("3", "`point.json` of 200,000 `[`", folder_file("point.json", "[" * 200_000, "folder.point()")),
    ("3", "repair of one 12 MB line, under the line limit (peak RSS above the import)", long_line(12)),
    ("3", "repair of one 300 MB line (peak RSS above the import)", long_line(300)),
    ("4", "`task.scorer.timeout=1e12`", run_attack([*HUMANEVAL, "task.scorer.timeout=1e12"])),
    ("4", "`task.scorer.memory_mb=2**43`", run_attack([*HUMANEVAL, f"task.scorer.memory_mb={2**43}",
                                                       "task.scorer.isolation=rlimits"])),
    ("4", "`task.scorer.isolation=foo`", run_attack([*HUMANEVAL, "task.scorer.isolation=foo"])),
    ("4", "HumanEval without bubblewrap (`PATH` without `bwrap`)", run_attack(HUMANEVAL, {"PATH": "/nonexistent"})),
    ("4", "`hydra.run.dir` naming a file", file_run_dir),
    ("4", "`seed=1,2` without `-m`", run_attack([*TINY, "seed=1,2"])),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="checkout of the code before the fixes")
    ap.add_argument("--after", default=".", help="checkout with the fixes (default: this one)")
    ap.add_argument("--out", default=str(HERE / "hostile_round3.md"))
    ap.add_argument("--limit", type=float, default=60.0, help="seconds before an attack is killed")
    ap.add_argument("--only", help="run only attacks whose label contains this text")
    args = ap.parse_args(argv)
    roots = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    commits = {k: subprocess.run(["git", "-C", str(r), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip() for k, r in roots.items()}
    rows = []
    with tempfile.TemporaryDirectory(prefix="hostile3-") as tmp:
        for i, (issue, label, attack) in enumerate(ATTACKS):
            if args.only and args.only not in label:
                continue
            row = [issue, label]
            for which, root in roots.items():  # interleaved: before, then after, attack by attack
                work = Path(tmp) / f"{i}-{which}" / "scratch"  # not "work": no path in the record reads like a machine path
                work.mkdir(parents=True)
                m, verdict = attack(root, work, args.limit)
                row += [f"{m['wall_s']:.2f}", f"{m['peak_mb']:.0f}", verdict.replace("|", "\\|")]
                print(f"[{which}] {label}: {m['wall_s']:.2f} s, {m['peak_mb']:.0f} MB, {verdict}", flush=True)
            rows.append(row)
    head = ["item", "attack", "before s", "before MB", "before verdict", "after s", "after MB", "after verdict"]
    text = [
        "# Hostile inputs, round three: before and after",
        "",
        f"Made by `results/security/hostile_round3.py` (before: `{commits['before']}`, after: "
        f"`{commits['after']}`; attacks killed at {args.limit:.0f} s). Seconds and MB: the whole "
        "process from outside (wall time, peak resident memory), except the Spider rows: the hostile "
        "query alone inside the scoring process (seconds, and growth of the peak resident memory over "
        "a legitimate query scored first), and the long-line row: peak above the interpreter with the "
        "results package imported. Measured on a shared, busy 2-core machine: times are indicative. "
        "Items as numbered in the report of round three.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *["| " + " | ".join(r) + " |" for r in rows],
        "",
        "## What changed",
        "",
        "1. Stored configs are data (`mtad/run/results/targets.py`): every `_target_` of a stored "
        "config is checked by its place (`decoder` under `mtad.decoders.`, `task` under `mtad.tasks.`, "
        "`task.scorer` under `eval.`, `model` under `mtad.models.pair.`, `logger` under "
        "`mtad.run.tracking.`) before anything is imported; a reader that builds objects also checks "
        "that the path names a project class where it is defined (not a module's import of `os`). "
        "Used by `rescore`, `mtad.testing.regenerate`, `load_point` (render, claims) and the names "
        "tables show. Tests: `tests/run/test_stored_targets.py`.",
        "2. Spider (`eval/spider_exec.py`): strings and blobs of at most 10,000 bytes, rows of at most "
        "100 columns, a 32 MiB SQLite heap, 1 MiB of result values, the progress handler every 100 "
        "instructions. The 972 gold queries keep their rows and the committed Spider records their "
        "scores (`tests/eval/test_spider_official.py`, slow); hostile cases in "
        "`tests/eval/test_scorer_bounds.py` must end within the timeout plus a second and grow the "
        "scorer by less than 64 MB.",
        "3. Records (`mtad/core/io.py`, `mtad/run/results/folder.py`): every line that fails to parse, "
        "however it fails, or whose fields fail the table of types and contents (numbers finite, "
        "integers within int64, list elements typed) is repaired like a torn line; files are read line "
        "by line, a line over 16 MiB is read past unparsed; `summary.json` and `point.json` fields are "
        "checked by table and refused in one line naming the file. Tests: "
        "`tests/run/test_hostile_records.py` (the long-line memory test is slow).",
        "4. Scorer settings (`mtad/run/config.py`): `timeout`/`timeout_s` in (0, 86400], `memory_mb` in "
        "[1, 2^20], `isolation` one of the sandbox's, `max_rows`, `output_limit`, `drop_privileges`, "
        "`keep_distinct` checked with the rest; each scorer's `preflight` (HumanEval: bubblewrap) runs "
        "in the command-line check and for each sweep point, before any folder exists; a sweep without "
        "`-m` and an output folder naming a file are refused in one line. Tests: `tests/run/test_cli.py`, "
        "`tests/tasks/test_humaneval_proxy.py`.",
        "5. `test_answer_key_is_masked_in_the_sandbox` first checks that the sandbox's user can read "
        "the key with resource limits only, and skips saying so where it cannot.",
        "",
    ]
    # the scratch folder's absolute path says nothing about the attack: written as <tmp>
    Path(args.out).write_text(re.sub(r"/\S*?/hostile3-[^/\s]+/", "<tmp>/", "\n".join(text)))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

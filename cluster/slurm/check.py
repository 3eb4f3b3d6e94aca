"""Table 2's smoke profile through a real Slurm (``make slurm-check``; the cluster: ``make slurm-up``).

Phases, each timed:
1. refusals, nothing submitted: a job no partition can grant (``mem_gb`` above every node's
   memory) and a PATH without ``sacct``, each refused in one line, exit 2;
2. the smoke sweep here, without a launcher (the reference);
3. the same sweep through ``--launcher mtad_slurm --jobs-per-pair 2`` (an array of 2 jobs): every
   point equal to the reference apart from timing fields;
4. the same again into a fresh folder, one array task killed (``kill -9``) in the middle of a
   point and the other cancelled (``scancel``) in the middle of a point: each reported in one
   line, no traceback, exit 1, the unfinished points listed with the resuming command (a
   cancelled job gets SIGTERM, which submitit ignores, and SIGKILL after Slurm's KillWait: the
   point it was writing may end in between; its later points are left unfinished);
5. that command again: it submits exactly the unfinished points, leaves the finished ones'
   files untouched, exits 0, and every point equals the reference (the resumed ones included);
6. once more: nothing submitted.

Left out of the comparison: keys that hold wall-clock measurements, in records and summaries
(``TIMING``: ``*_time``, ``*_seconds``, ``tokens_per_s``, ``ms_per_token``, ``overhead_share``,
``joules``, ``j_per_token``, ``energy_j``), and the parts of a summary that describe the run,
not the point (``RUN_ONLY``: ``provenance``, the segments of runs that wrote it and each
record's segment id, the folders in ``config``). Everything else must be
equal: every token, score, count and the rest of the configuration.

Exit 0 when every phase passes, 1 when one fails (its line says what), 2 when no cluster answers.
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

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ["experiments/table2.yaml", "--profile", "smoke"]
NAME = "table2_smoke"
#: keys holding wall-clock measurements (records and summaries)
TIMING = re.compile(r"(^|_)(time|seconds|tokens_per_s|ms_per_token|overhead_share|joules|j_per_token|energy_j)(_|$)")
#: summary parts that describe the run, not the point: when and where (provenance), its folders
RUN_ONLY = {("summary", "provenance"), ("summary", "segments"), ("records", "segment"),
            ("summary", "config", "output_dir"),
            ("summary", "config", "sweep", "root"), ("summary", "config", "sweep", "search")}
TIMINGS: list[tuple[str, float]] = []


def say(msg: str) -> None:
    print(f"slurm-check: {msg}", flush=True)


class CheckFailed(Exception):
    pass


def expect(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.setdefault("HF_HUB_OFFLINE", "1")
    return e


def sweep_cmd(root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mtad.run.sweep", *SWEEP, "--root", str(root), *extra]


def run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    t = time.time()
    out = subprocess.run(cmd, cwd=ROOT, env=kw.pop("env", env()), capture_output=True, text=True, **kw)
    TIMINGS.append((what, time.time() - t))
    say(f"{what}: exit {out.returncode} in {time.time() - t:.1f} s")
    return out


def strip(obj, path=()):
    """``obj`` without timing keys and run-only parts."""
    if isinstance(obj, dict):
        return {k: strip(v, (*path, k)) for k, v in obj.items()
                if not TIMING.search(k) and (*path, k) not in RUN_ONLY}
    if isinstance(obj, list):
        return [strip(v, path) for v in obj]
    return obj


def points(sweep_dir: Path) -> dict[str, dict]:
    """{identity hash: {"summary": ..., "records": [...]}} of a sweep folder's current points."""
    index = json.loads((sweep_dir / "sweep.json").read_text())
    out = {}
    for row in index["points"]:
        folder = sweep_dir / row["dir"]
        summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").exists() else None
        records = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()] \
            if (folder / "samples.jsonl").exists() else []
        out[row["hash"]] = {"summary": summary, "records": sorted(records, key=lambda r: (r["index"], r["turn"]))}
    return out


def compare(got_dir: Path, ref_dir: Path, what: str) -> int:
    got, ref = points(got_dir), points(ref_dir)
    expect(set(got) == set(ref), f"{what}: points {sorted(set(got) ^ set(ref))} are in one run only")
    for h in ref:
        expect(got[h]["summary"] is not None, f"{what}: point {h} has no summary.json")
        a, b = strip(got[h]), strip(ref[h])
        if a != b:
            diff = [k for k in set(a["summary"]) | set(b["summary"]) if a["summary"].get(k) != b["summary"].get(k)]
            raise CheckFailed(f"{what}: point {h} differs from the local run (summary keys {sorted(diff)}; "
                              f"records equal: {a['records'] == b['records']})")
    return len(ref)


def one_line_refusal(out: subprocess.CompletedProcess, needle: str, what: str) -> str:
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("mtad-sweep:")]
    expect(out.returncode == 2, f"{what}: exit {out.returncode}, expected 2\n{out.stderr[-2000:]}")
    expect(len(lines) == 1 and needle in lines[0], f"{what}: no one-line refusal naming {needle!r}:\n{out.stderr[-2000:]}")
    expect("Traceback" not in out.stdout + out.stderr, f"{what}: a traceback")
    return lines[0]


def jobs_named(name: str) -> set[str]:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-S", "now-1days", "--name", name, "-o", "JobID"],
                         capture_output=True, text=True)
    return set(out.stdout.split())


def submissions(text: str) -> dict[str, list[str]]:
    """{array task id: [point hashes]} from the launcher's 'pair ...: N points in M jobs (...): id: h,h; ...' lines."""
    out = {}
    for m in re.finditer(r"points in \d+ jobs \(array \d+;[^)]*\): (.*)", text):
        for part in m.group(1).split("; "):
            jid, hashes = part.split(": ")
            out[jid.strip()] = hashes.strip().split(",")
    return out


def task_pid(array_id: str, task: str) -> int | None:
    """The pid of array task ``array_id``_``task``'s Python process (the job step running the points)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if (f"SLURM_ARRAY_JOB_ID={array_id}".encode() in environ and f"SLURM_ARRAY_TASK_ID={task}".encode() in environ
                and b"submitit" in cmdline and (proc / "comm").read_text().startswith("python")):
            return int(proc.name)
    return None


def mid_point(sweep_dir: Path, hashes: list[str]) -> str | None:
    """The first of ``hashes`` (after the first, so that one point is finished) with records and no summary."""
    for h in hashes[1:]:
        folder = sweep_dir / h
        samples = folder / "samples.jsonl"
        if samples.exists() and samples.stat().st_size and not (folder / "summary.json").exists():
            return h
    return None


def interrupt(proc: subprocess.Popen, sweep_dir: Path, log_path: Path, deadline_s: float) -> dict[str, tuple]:
    """Kill task 0 (kill -9) and cancel task 1 (scancel), each while one of its points is half written."""
    end = time.time() + deadline_s
    jobs: dict[str, list[str]] = {}
    while not jobs:
        expect(time.time() < end and proc.poll() is None, "the interrupted sweep submitted no array of 2 jobs")
        jobs = submissions(log_path.read_text())
        time.sleep(0.2)
    expect(len(jobs) >= 2, f"expected an array of 2 jobs, got {sorted(jobs)}")
    (t0, h0), (t1, h1) = sorted(jobs.items())[:2]
    array = t0.split("_")[0]
    hit: dict[str, tuple] = {}  # job -> (the point it was writing, its points)
    for jid, hashes, how in ((t0, h0, "kill -9"), (t1, h1, "scancel")):
        while True:
            expect(time.time() < end, f"{jid}: no point half written within {deadline_s:.0f} s")
            h = mid_point(sweep_dir, hashes)
            pid = task_pid(array, jid.split("_")[1]) if h else None
            if h and pid:
                os.kill(pid, signal.SIGSTOP)  # freeze it, then make sure the point is still half written
                lines = (sweep_dir / h / "samples.jsonl").read_text().count("\n")
                if not (sweep_dir / h / "summary.json").exists():
                    if how == "kill -9":
                        os.kill(pid, signal.SIGKILL)
                    else:  # frozen: Slurm's SIGTERM (which submitit ignores), then SIGKILL after KillWait
                        subprocess.run(["scancel", jid], check=True)
                        hold(pid)
                    hit[jid] = (h, hashes)
                    say(f"{how} {jid} (pid {pid}) in point {h} after {lines} of its records")
                    break
                os.kill(pid, signal.SIGCONT)
            time.sleep(0.01)
    return hit


def hold(pid: int, limit_s: float = 120.0) -> None:
    """Keep a cancelled task stopped until Slurm's SIGKILL ends it. Slurm resumes a stopped
    task (SIGCONT) before its SIGTERM, which submitit ignores; on a quiet machine the tiny
    points would then all finish within KillWait and the job would end "finished", not
    cancelled. A real job outlives KillWait: this stands in for one (in a thread)."""
    import threading

    def run():
        end = time.time() + limit_s
        while time.time() < end:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                return
            time.sleep(0.02)

    threading.Thread(target=run, daemon=True).start()


def snapshot(sweep_dir: Path, hashes) -> dict[str, tuple]:
    out = {}
    for h in hashes:
        for f in sorted((sweep_dir / h).glob("*.json*")):
            out[str(f)] = (f.stat().st_mtime_ns, f.read_bytes())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", help="folder for the check's sweeps (default: a new temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--deadline-s", type=float, default=600, help="give up on a phase after this long")
    args = ap.parse_args()
    for tool in ("sinfo", "sacct", "sbatch", "scancel"):
        if shutil.which(tool) is None or subprocess.run([tool, "--version"], capture_output=True).returncode:
            say(f"{tool} does not answer: start the cluster first (make slurm-up)")
            return 2
    if subprocess.run(["sinfo", "-h"], capture_output=True).returncode:
        say("sinfo fails: start the cluster first (make slurm-up)")
        return 2
    work = Path(args.work or tempfile.mkdtemp(prefix="mtad-slurm-check-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    say(f"work folder {work}")
    t_all = time.time()
    try:
        # 1. refusals
        before = jobs_named(f"mtad-{NAME}")
        out = run(sweep_cmd(work / "big", "--launcher", "mtad_slurm", "hydra.launcher.mem_gb=100000"),
                  "refusal: a job no partition can grant")
        say("  " + one_line_refusal(out, "mem_gb", "too-large request"))
        nosacct = work / "bin-without-sacct"
        nosacct.mkdir(exist_ok=True)
        # every other tool the sweep probes stays reachable (bwrap: HumanEval's scorer preflight
        # refuses the sweep before the launcher would look for sacct)
        for tool in ("sinfo", "squeue", "sbatch", "scancel", "scontrol", "bwrap"):
            if shutil.which(tool) and not (nosacct / tool).exists():
                (nosacct / tool).symlink_to(shutil.which(tool))
        e = env()
        e["PATH"] = str(nosacct)
        out = run(sweep_cmd(work / "nosacct", "--launcher", "mtad_slurm"), "refusal: no sacct", env=e)
        say("  " + one_line_refusal(out, "sacct", "missing sacct"))
        expect(jobs_named(f"mtad-{NAME}") == before, "a refused sweep submitted a job")

        # 2. reference, here
        out = run(sweep_cmd(work / "local"), "local run (reference)")
        expect(out.returncode == 0, f"local run failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")

        # 3. through Slurm, an array of 2
        slurm = sweep_cmd(work / "slurm", "--launcher", "mtad_slurm", "--jobs-per-pair", "2")
        out = run(slurm, "Slurm run, array of 2 jobs", timeout=args.deadline_s)
        expect(out.returncode == 0, f"Slurm run failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
        jobs = submissions(out.stderr)
        expect(len(jobs) == 2 and len({j.split('_')[0] for j in jobs}) == 1, f"not one array of 2 jobs: {jobs}")
        n = compare(work / "slurm" / NAME, work / "local" / NAME, "Slurm run")
        say(f"  array {next(iter(jobs)).split('_')[0]} ({', '.join(sorted(jobs))}): {n} points equal to the "
            "local run apart from timing fields")

        # 4. one task killed, one cancelled, each in the middle of a point
        kill = sweep_cmd(work / "kill", "--launcher", "mtad_slurm", "--jobs-per-pair", "2")
        log_path = work / "kill.log"
        t = time.time()
        out_path = work / "kill.out"
        with open(log_path, "w") as log, open(out_path, "w") as outf:
            proc = subprocess.Popen(kill, cwd=ROOT, env=env(), stdout=outf, stderr=log, text=True)
            hit = interrupt(proc, work / "kill" / NAME, log_path, args.deadline_s)
            proc.wait(timeout=args.deadline_s)
        stdout = out_path.read_text()
        TIMINGS.append(("Slurm run with a task killed and one cancelled", time.time() - t))
        say(f"Slurm run with a task killed and one cancelled: exit {proc.returncode} in {time.time() - t:.1f} s")
        text = stdout + log_path.read_text()
        expect(proc.returncode == 1, f"expected exit 1 after a killed and a cancelled task, got {proc.returncode}")
        expect("Traceback" not in text, "a traceback in the interrupted sweep's output")
        k_id, c_id = sorted(hit)
        for jid, state in ((k_id, "FAILED"), (c_id, "CANCELLED")):
            lines = [ln for ln in stdout.splitlines() if ln.startswith(f"job {jid} ")]
            expect(len(lines) == 1 and state in lines[0], f"job {jid}: no one-line report saying {state}:\n{stdout}")
            say(f"  {lines[0]}")
        listing = re.search(r"sweep \S+: (\d+) of (\d+) points not finished", stdout)
        resume = [ln for ln in stdout.splitlines() if ln.startswith("resume them")]
        expect(listing is not None and len(resume) == 1, f"no list of unfinished points with the resuming command:\n{stdout}")
        say(f"  {listing.group(0)}; {resume[0]}")
        left = {ln.split()[0] for ln in stdout.splitlines()
                if re.match(r"^  [0-9a-f]{12}  ", ln)}
        state = points(work / "kill" / NAME)
        expect(left == {h for h, p in state.items() if p["summary"] is None},
               f"the listed points {sorted(left)} are not the unfinished ones")
        (killed, _), (cancelled, c_points) = hit[k_id], hit[c_id]
        expect(killed in left, f"the killed point {killed} is not listed")
        expect(set(c_points) & left, f"no point of the cancelled job {c_id} is listed")
        if cancelled not in left:  # submitit ignores SIGTERM: the point may end before Slurm's SIGKILL
            say(f"  the cancelled job finished point {cancelled} in Slurm's KillWait grace (SIGTERM, then SIGKILL) "
                f"and left {len(set(c_points) & left)} of its points unfinished")
        interrupted = {killed} | ({cancelled} & left)
        finished = sorted(set(state) - left)
        snap = snapshot(work / "kill" / NAME, finished)

        # 5. the same command resumes: only the unfinished points are submitted
        out = run(kill, "rerun of the same command (resume)", timeout=args.deadline_s)
        expect(out.returncode == 0, f"the resuming run failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
        jobs = submissions(out.stderr)
        submitted = sorted(h for hashes in jobs.values() for h in hashes)
        expect(submitted == sorted(left), f"resubmitted {submitted}, expected exactly the unfinished {sorted(left)}")
        expect(snapshot(work / "kill" / NAME, finished) == snap, "a finished point's files changed on resume")
        logs = "".join(p.read_text() for p in (work / "kill" / NAME / ".hydra").rglob("*_log.out"))
        resumed = re.findall(r"resuming: (\d+) finished records in \S+/([0-9a-f]{12})/samples.jsonl", logs)
        expect({h for _, h in resumed} >= interrupted,
               f"the interrupted points {sorted(interrupted)} did not resume from their records: {resumed}")
        n = compare(work / "kill" / NAME, work / "local" / NAME, "resumed run")
        say(f"  submitted {len(submitted)} unfinished points in {len(jobs)} jobs, none of the {len(finished)} "
            f"finished; {', '.join(f'{h} resumed after {r} records' for r, h in resumed if h in interrupted)}; "
            f"all {n} points equal to the local run apart from timing fields")

        # 6. nothing left: nothing submitted
        before = jobs_named(f"mtad-{NAME}")
        out = run(kill, "third run (all finished)")
        expect(out.returncode == 0 and "nothing submitted" in out.stderr and jobs_named(f"mtad-{NAME}") == before,
               f"a finished sweep submitted jobs or failed:\n{out.stderr[-2000:]}")
    except CheckFailed as e:
        say(f"FAILED: {e}")
        say(f"work folder kept: {work}")
        return 1
    except subprocess.TimeoutExpired as e:
        say(f"FAILED: no answer within {e.timeout:.0f} s: {' '.join(map(str, e.cmd))}")
        say(f"work folder kept: {work}")
        return 1
    say("timings (s; a shared, noisy machine: indicative only): "
        + "; ".join(f"{what} {s:.1f}" for what, s in TIMINGS) + f"; total {time.time() - t_all:.1f}")
    say("passed")
    if not args.keep and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

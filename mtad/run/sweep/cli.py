"""``python -m mtad.run.sweep``: run, list (``--dry-run``) or launch the points of a sweep file."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mtad.core.io import read_json, shown_path
from mtad.core.stack import require_supported_stack
from mtad.run.results import (
    BUSY,
    CACHED,
    DONE,
    FAILED,
    HASH_LEN,
    PARTIAL,
    PENDING,
    SKIPPED,
    UNKNOWN,
)
from mtad.run.results.folder import POINT_FILE
from mtad.run.sweep.execute import run, unfinished
from mtad.run.sweep.launcher import hydra_main, launch, pair_job, point_job
from mtad.run.sweep.plan import Sweep, check_task, load, unknown_names
from mtad.run.sweep.slurm import SlurmRefused

log = logging.getLogger(__name__)


def estimate(
    sweep: Sweep, tokens_per_s: float, point_overhead_s: float, example_overhead_s: float = 0.0
) -> dict[str, Any]:
    """Rough wall time of the unfinished points, an upper bound on generation (no early EOS):
    new tokens / rate + a cost per point (model load, warm-up) + a cost per (example, turn)
    (prompt prefill, perplexity pass, scoring)."""
    tokens, points, unavailable, turns = 0, 0, 0, 0
    store = sweep.store()
    for p in sweep.known():
        folder = sweep.folder(p, store)
        if folder.finished(p.hash, p.limit):
            continue
        ok, _, n_ex, n_turns = check_task(p.cfg)
        if not ok:
            unavailable += 1
            continue
        records = folder.check().records
        have = [r for r in records if p.limit is None or int(r.get("index", 0)) < p.limit]
        left = max(0, (n_turns or 0) - len(have))
        tokens += left * int(p.cfg.max_new_tokens)
        turns += left
        points += 1
    seconds = tokens / tokens_per_s + points * point_overhead_s + turns * example_overhead_s
    return {"points": points, "turns": turns, "max_new_tokens_total": tokens, "seconds": seconds,
            "unavailable": unavailable}


def dry_run(sweep: Sweep, tokens_per_s: float, point_overhead_s: float,
            example_overhead_s: float = 0.0, out=None) -> None:
    out = out or sys.stdout
    known = sweep.known()
    print(f"sweep {sweep.name}: {len(sweep.points)} points ({len(known)} runnable) -> {sweep.dir}", file=out)
    store = sweep.store()
    counts: dict[str, int] = {}  # "done (found elsewhere)": n, ...
    for p in sweep.points:
        if p.hash is None:
            status, detail, h = UNKNOWN, p.problem, "-" * HASH_LEN
            counts[UNKNOWN] = counts.get(UNKNOWN, 0) + 1
        else:
            ok, reason, n_ex, n_turns = check_task(p.cfg)
            folder = sweep.folder(p, store)
            status, detail = folder.status(p.hash, p.limit)
            if status in (PENDING, PARTIAL, SKIPPED) and not ok:
                status, detail = "unavailable", reason
            elif status in (PENDING, PARTIAL):
                detail = f"{n_ex} examples, {n_turns} turns" + (f", {detail}" if detail else "")
            if not sweep.is_own(folder):
                detail = f"{detail}; " if detail else ""
                n = folder.summary_limit() if status == DONE else None
                detail += (f"found in {shown_path(folder.path)}/" + (f" (n={n})" if n is not None else "")
                           + (", resumed there" if status in (PENDING, PARTIAL) else ""))
            elif folder.path.name != p.hash:
                detail = f"{detail}; " if detail else ""
                adopted = (read_json(folder.file(POINT_FILE)) or {}).get("adopted") or {}
                detail += f"in {folder.path.name}/ " + (
                    f"(adopted from {adopted.get('from_hash')}: same records under the new stop set)"
                    if adopted.get("because") == "stop set" else "(written before the results format had a version)")
            h = p.hash
            key = status + ("" if sweep.is_own(folder) else " (found elsewhere)")
            counts[key] = counts.get(key, 0) + 1
        print(f"  {h}  {status:<11} {p.label}" + (f"  [{detail}]" if detail else ""), file=out)
    print("points: " + ", ".join(f"{v} {k}" for k, v in counts.items()), file=out)
    for group, names in unknown_names(sweep).items():
        print(f"unknown {group} names (no conf/{group}/<name>.yaml yet): {', '.join(names)}", file=out)
    est = estimate(sweep, tokens_per_s, point_overhead_s, example_overhead_s)
    print(
        f"estimate: {est['points']} points, {est['turns']} generations, <= {est['max_new_tokens_total']} "
        f"new tokens -> at most about {est['seconds'] / 60:.0f} min, assuming {tokens_per_s:g} tokens/s, "
        f"{point_overhead_s:g} s per point (model load, warm-up) and {example_overhead_s:g} s per "
        "generation (prefill, perplexity, scoring)",
        file=out,
    )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mtad.run.sweep",
                                 description="Resumable sweeps over (model pair, task, decoder, knobs) points.")
    ap.add_argument("sweep_file", help="experiments/<sweep>.yaml")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides; a sweep value (a,b) replaces that axis")
    ap.add_argument("--dry-run", action="store_true", help="list the points and their status; run nothing")
    ap.add_argument("--profile", help="a profile from the file's sweep.profiles (e.g. smoke, cpu)")
    ap.add_argument("--name", help="results folder name (default: sweep.name[_profile])")
    ap.add_argument("--root", help="results root (default: sweep.root, results/sweeps)")
    ap.add_argument("--search", action="append",
                    help="where points are looked for, repeatable (default: the file's sweep.search, "
                         "e.g. results; with --root: that root only)")
    ap.add_argument("--wait", action="store_true",
                    help="wait for points another process is writing (default: report them busy, go on)")
    ap.add_argument("--launcher", help="run through Hydra with conf/hydra/launcher/<name>.yaml (mtad_slurm, mtad_joblib)")
    ap.add_argument("--jobs-per-pair", type=int, default=1,
                    help="with --launcher: jobs per model pair, each loads the pair once (default 1)")
    ap.add_argument("--concurrent-pairs", action="store_true",
                    help="with --launcher: kept for old command lines; pairs are always launched together")
    ap.add_argument("--fail-fast", action="store_true", help="stop at the first failing point")
    ap.add_argument("--strict", action="store_true", help="refuse a grid with points that cannot run")
    ap.add_argument("--assume-tokens-per-s", type=float,
                    help="rate for --dry-run's estimate (default: the file's sweep.estimate, else 2)")
    ap.add_argument("--point-overhead-s", type=float,
                    help="cost per point for the estimate (default: sweep.estimate, else 20)")
    ap.add_argument("--example-overhead-s", type=float,
                    help="cost per generation for the estimate (default: sweep.estimate, else 0)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["hydra"], ["pairs"]):
        hydra_main(argv[1:], point_job if argv[0] == "hydra" else pair_job)
        return 0
    ap = _parser()
    args = ap.parse_intermixed_args(argv)
    if args.jobs_per_pair < 1:
        ap.error(f"--jobs-per-pair must be >= 1, got {args.jobs_per_pair}")
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    try:
        sweep = load(args.sweep_file, args.overrides, name=args.name, root=args.root, profile=args.profile,
                     search=args.search)
    except FileNotFoundError as e:  # a mistyped path: one line, with what exists
        files = sorted(p.name for p in Path("experiments").glob("*.yaml")) if Path("experiments").is_dir() else []
        print(f"mtad-sweep: {e}" + (f"; sweep files here: experiments/{{{','.join(files)}}}" if files else ""),
              file=sys.stderr)
        return 2
    except ValueError as e:  # not a sweep file, a bad profile or override: the loader's own line
        print(f"mtad-sweep: {e}", file=sys.stderr)
        return 2
    if sweep.hydra_overrides and not args.launcher:
        log.warning("ignored without --launcher: %s", " ".join(sweep.hydra_overrides))
    problems = [p for p in sweep.points if p.hash is None]
    for p in problems:
        log.warning("sweep %s: point not run (%s): %s", sweep.name, p.label, p.problem)
    if args.strict and problems:
        return 2
    unfit = [p for p in problems if p.machine]
    if unfit and not args.dry_run:  # this machine, not the grid: refuse rather than end "finished"
        for reason in dict.fromkeys(p.problem for p in unfit):
            print(f"mtad-sweep: {sum(p.problem == reason for p in unfit)} of {len(sweep.points)} points "
                  f"of sweep {sweep.name} cannot run on this machine: {reason}", file=sys.stderr)
        return 2
    if args.dry_run:
        est = (sweep.meta.get("estimates") or {}).get(args.profile) or sweep.meta.get("estimate") or {}

        def pick(arg, key, default):
            return arg if arg is not None else float(est.get(key, default))

        dry_run(sweep, pick(args.assume_tokens_per_s, "tokens_per_s", 2.0),
                pick(args.point_overhead_s, "point_overhead_s", 20.0),
                pick(args.example_overhead_s, "example_overhead_s", 0.0))
        return 0
    require_supported_stack()  # before any point loads a model
    if args.launcher:
        try:
            rc = launch(sweep, args.launcher, jobs_per_pair=args.jobs_per_pair)
        except SlurmRefused as e:
            print(f"mtad-sweep: {e}", file=sys.stderr)
            return 2
        if rc == 130:
            return rc
        left = list_unfinished(sweep, argv)
        return 1 if rc or left else 0
    report = run(sweep, fail_fast=args.fail_fast, wait=args.wait)
    summary = ", ".join(f"{s} {report.count(s)}" for s in (DONE, CACHED, SKIPPED, BUSY, FAILED, UNKNOWN)
                        if report.count(s))
    print(f"sweep {sweep.name}: {summary} -> {sweep.dir}")
    if report.count(BUSY):
        print(f"{report.count(BUSY)} points are being written by another process: rerun later or with --wait")
    if not report.ok:
        list_unfinished(sweep, argv)
    return 0 if report.ok else 1


def resume_command(argv: Sequence[str]) -> str:
    """The command line that was run (resuming is running it again)."""
    prog = "mtad-sweep" if os.path.basename(sys.argv[0] or "") == "mtad-sweep" else "python -m mtad.run.sweep"
    return f"{prog} {shlex.join(argv)}"


def list_unfinished(sweep: Sweep, argv: Sequence[str], out=None) -> list:
    """Print the points left unfinished (failed, cancelled, interrupted) and the command that resumes them."""
    out = out or sys.stdout
    left = unfinished(sweep)
    n = len(sweep.known())
    if not left:
        print(f"sweep {sweep.name}: all {n} runnable points finished -> {sweep.dir}", file=out)
        return left
    print(f"sweep {sweep.name}: {len(left)} of {n} points not finished -> {sweep.dir}", file=out)
    for p, status, detail in left:
        print(f"  {p.hash}  {status:<8} {p.label}" + (f"  [{detail}]" if detail else ""), file=out)
    print(f"resume them (finished points are kept, not redone): {resume_command(argv)}", file=out)
    return left


def cli() -> None:
    """The console script (``[project.scripts]`` in pyproject.toml)."""
    from mtad.run.results import exit_on_bad_results

    exit_on_bad_results(main)

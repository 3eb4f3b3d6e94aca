"""Harness overhead of two commits side by side: ``bench/overhead.py`` run from each commit's
worktree in turn (old, new, old, new, ...), then per (setting, system) the paired ratio new / old
of the overhead per emitted token.

    python bench/compare_commits.py --old 095ee82 --new HEAD --rounds 3 \\
        --out results/bench/compare_commits.md -- --vocabs 151936 --systems spd,tree_mtad

Each commit first runs a short unrecorded warm-up (one prompt, 4 tokens: the first process of a
session pays for a cold page cache). Each round then runs both commits once on the same prompts
and seeds (the overhead bench's own interleaving inside a run; the commits alternate between
runs, the first one of each round alternating too), so slow drift of the machine falls on both.
Put an unchanged system beside the changed ones: its new / old ratio shows the drift the run
could not cancel. The ratio of a (setting, system) is
the geometric mean over rounds and prompts of new / old per emitted token, with a 95% bootstrap
interval over those pairs; the same for the ratio to SpD within each commit's runs. Worktrees
are made under a temporary folder and removed; the commits' own ``bench/overhead.py`` runs, with
this checkout's interpreter (the same packages for both).

``--bench speed`` runs the commits' own ``bench/speed.py`` on a real pair instead (the arguments
after ``--`` are speed's: ``--tasks humaneval:0-4 --modes sample --fixed-length temperature=1
top_k=0 top_p=1.0``); its rows are keyed by task/mode, and "overhead" is the time outside the
models' forward passes (speed's ``timed - forward``). Every table also gives each commit's wall
time per emitted token as a multiple of SpD's. ``--keep DIR`` keeps every run's JSON;
``--render-kept DIR`` writes the table again from them.

    python bench/compare_commits.py --summary results/bench/compare_commits_argmax_bild_cpu.md

prints a record's new / old estimates per system and vocabulary as ranges over its other
settings (drafts, modes): the ranges ``docs/speed.md`` quotes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtad.core.machine import cpu_info  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def _geo_ci(values: list[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    logs = [math.log(v) for v in values]
    rng = random.Random(seed)
    boots = sorted(sum(rng.choice(logs) for _ in logs) / len(logs) for _ in range(n_boot))
    mean = sum(logs) / len(logs)
    return math.exp(mean), math.exp(boots[int(0.025 * n_boot)]), math.exp(boots[int(0.975 * n_boot) - 1])


def per_token(path: Path, key: str = "overhead") -> dict[tuple[str, str, int], float]:
    """(setting, system, prompt) -> ``key`` seconds per emitted token (repeats averaged):
    ``overhead`` (outside the models) or ``wall`` (the whole generation call, models included)."""
    rows = json.loads(path.read_text())["rows"]
    acc: dict = defaultdict(list)
    for r in rows:
        if "setting" not in r:  # bench/speed.py's rows: outside = timed span - forward
            value = (r.get("timed", r["wall"]) - r["forward"]) if key == "overhead" else r["wall"]
            acc[(f"{r['task']}/{r['mode']}", r["decoder"], r["prompt"])].append(value / max(r["tokens"], 1))
            continue
        acc[(r["setting"], r["system"], r["prompt"])].append(r[key] / max(r["tokens"], 1))
    return {k: sum(v) / len(v) for k, v in acc.items()}


def summary(path: Path) -> dict[tuple[str, str], tuple[float, float]]:
    """A written record's new / old estimates: (system, vocabulary) -> (lowest, highest) over the
    record's settings, as printed in its table (two decimals)."""
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for line in Path(path).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0].count("/") != 2 or not cells[2][:1].isdigit():
            continue
        vocab = cells[0].split("/")[0]
        out[(cells[1], vocab)].append(float(cells[2].split()[0]))
    return {k: (min(v), max(v)) for k, v in sorted(out.items())}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old")
    ap.add_argument("--summary", help="print a written record's new / old ranges per system and vocabulary; no run")
    ap.add_argument("--new", default="HEAD")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="results/bench/compare_commits.md")
    ap.add_argument("--bench", choices=("overhead", "speed"), default="overhead",
                    help="the commits' own bench/overhead.py (tiny models) or bench/speed.py (a real pair; "
                         "give it --fixed-length and the rows' tasks/modes after --)")
    ap.add_argument("--render-kept", default=None, metavar="DIR",
                    help="no run: write the table from an earlier run's --keep folder (same --old/--new/--rounds)")
    ap.add_argument("--keep", default=None, metavar="DIR",
                    help="also copy every recorded run's JSON here (COMMIT_ROUND.json): each commit's own "
                         "goals table, `python bench/overhead.py --report DIR/COMMIT_ROUND.json`")
    args = ap.parse_args(argv)
    if args.summary:
        for (system, vocab), (lo, hi) in summary(Path(args.summary)).items():
            print(f"{system} {vocab}: {lo:.2f}-{hi:.2f}x")
        return
    if not args.old:
        ap.error("--old is required (or --summary RECORD)")
    if "--out" in extra:
        raise SystemExit("pass the overhead bench's arguments after --, without --out (this script sets it)")
    old, new = _git("rev-parse", "--short=10", args.old), _git("rev-parse", "--short=10", args.new)
    runs: dict[str, list[dict]] = {old: [], new: []}
    walls: dict[str, list[dict]] = {old: [], new: []}
    if args.render_kept:  # the table again from an earlier run's --keep folder
        for rnd in range(args.rounds):
            for c in (old, new):
                runs[c].append(per_token(Path(args.render_kept) / f"{c}_{rnd}.json"))
                walls[c].append(per_token(Path(args.render_kept) / f"{c}_{rnd}.json", "wall"))
    else:
        _measure(args, extra, old, new, runs, walls)
    _write(args, extra, old, new, runs, walls)
    if args.bench == "overhead" and (args.keep or args.render_kept):
        for c in (old, new):  # each commit's own goals table: the verdicts before and after
            _goals(Path(args.keep or args.render_kept), c, args.rounds, Path(args.out))


def goal_counts(report: dict) -> str:
    """Markdown: per mode, the goals against SpD met / missed / unresolved, and of the others how
    many have tokens per step as the larger factor (SpD's tokens per step over the system's above
    its ratio per step: the rule's acceptance with these models, which the goal excuses)."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for setting, v in report.items():
        mode = setting.split("/")[-1]
        for g, goal in v["goals"].items():
            if not g.endswith("x_spd"):
                continue
            d, spd = v["systems"][g.split("_le_")[0]], v["systems"]["spd"]
            step = (d.get("vs_spd_per_step") or {}).get("estimate", 0.0)
            by_tokens = goal["verdict"] != "met" and spd["tokens_per_step"] / d["tokens_per_step"] > step
            counts[mode][goal["verdict"] + (", tokens per step the larger factor" if by_tokens else "")] += 1
    lines = ["### Cells by verdict (goal: <= 1.5x SpD per emitted token)", "", "| mode | verdict | cells |", "| --- | --- | ---: |"]
    for mode in sorted(counts):
        lines += [f"| {mode} | {k} | {n} |" for k, n in sorted(counts[mode].items())]
    return "\n".join(lines) + "\n"


def pooled_rows(saved: list[dict]) -> list[dict]:
    """Every round's rows of a commit as repeats of one run (round r's repeat k: r * 100 + k), as
    its goals table pools them (``_goals``; ``bench/speed_summary.py`` rebuilds its cells so)."""
    return [dict(row, repeat=r * 100 + row["repeat"]) for r, one in enumerate(saved) for row in one["rows"]]


def _goals(kept: Path, commit: str, rounds: int, out: Path) -> None:
    """The goals table of ``commit``'s runs (``bench/overhead.py``'s report, with its per-cell
    verdicts and the misses taken apart), every round's rows pooled as repeats of one run."""
    sys.path.insert(0, str(ROOT / "bench"))
    import overhead

    saved = [json.loads((kept / f"{commit}_{r}.json").read_text()) for r in range(rounds)]
    rows = pooled_rows(saved)
    systems = saved[0]["args"]["systems"].split(",")
    report = overhead.summarize(rows, systems, saved[0]["args"]["tree_limit"])
    header = [*saved[0]["header"], "", f"Goals of commit {commit}: its {rounds} run(s) of `bench/compare_commits.py` "
              f"pooled (each round's rows as repeats), from `{kept.name}/{commit}_*.json`."]
    target = out.with_name(f"{out.stem}_goals_{commit}.md")
    target.write_text(overhead.markdown(report, header) + overhead.misses_table(report, {})
                      + "\n" + goal_counts(report) + "\n")
    print(f"written: {target}")


def _measure(args, extra: list[str], old: str, new: str, runs: dict, walls: dict) -> None:
    with tempfile.TemporaryDirectory(prefix="mtad-compare-") as tmp:
        trees = {}
        for c in (old, new):
            trees[c] = Path(tmp) / c
            _git("worktree", "add", "--detach", "-q", str(trees[c]), c)
        def run(c: str, out: Path, *more: str) -> None:  # the commit's own overhead bench
            cmd = ([sys.executable, "bench/overhead.py", *extra, "--no-ops", *more, "--out", str(out)]
                   if args.bench == "overhead" else
                   [sys.executable, "bench/speed.py", *extra, *more, "--out", str(out)])
            subprocess.run(cmd, cwd=trees[c], check=True, stdout=subprocess.DEVNULL,
                           env={**os.environ, "PYTHONPATH": str(trees[c])})

        try:
            for c in (old, new):  # warm-up, not recorded: a short run of each (page cache, imports)
                run(c, Path(tmp) / f"{c}_warm.json", *(("--prompts", "1", "--max-new-tokens", "4")
                                                         if args.bench == "overhead" else ("--max-new-tokens", "4")))
            for rnd in range(args.rounds):
                for c in (old, new) if rnd % 2 == 0 else (new, old):
                    print(f"[round {rnd}] {c}", file=sys.stderr, flush=True)
                    out = Path(tmp) / f"{c}_{rnd}.json"
                    run(c, out)
                    if args.keep:
                        Path(args.keep).mkdir(parents=True, exist_ok=True)
                        # kept records name no path of this machine: the temporary folder as <tmp>
                        (Path(args.keep) / out.name).write_text(
                            out.read_text().replace(str(Path(tmp)), "<tmp>").replace(str(ROOT) + "/", ""))
                    runs[c].append(per_token(out))
                    walls[c].append(per_token(out, "wall"))
        finally:
            for c in (old, new):
                subprocess.run(["git", "worktree", "remove", "--force", str(trees[c])], cwd=ROOT,
                               capture_output=True)


def _write(args, extra: list[str], old: str, new: str, runs: dict, walls: dict) -> None:
    keys = sorted(set(runs[old][0]) & set(runs[new][0]))
    settings = sorted({k[0] for k in keys})
    systems = list(dict.fromkeys(k[1] for k in keys))
    cpu = cpu_info()
    exe = Path(sys.executable)
    interpreter = exe.relative_to(ROOT) if exe.is_relative_to(ROOT) else exe.name  # no machine paths
    lines = [
        f"# {'Harness overhead' if args.bench == 'overhead' else 'Time outside the models and wall time'} "
        f"per emitted token, {new} against {old} (bench/compare_commits.py, bench/{args.bench}.py)",
        "",
        f"Command: `python bench/compare_commits.py --old {args.old} --new {args.new} --rounds {args.rounds} "
        f"{'--bench speed ' if args.bench == 'speed' else ''}--keep DIR --out {args.out} -- {' '.join(extra)}`"
        + (f"; this table rendered from the kept runs by `... --render-kept {args.render_kept}`" if args.render_kept else ""),
        f"Machine: {cpu.get('model')}, {cpu.get('usable_cpus')} usable CPUs; interpreter {interpreter}. Rounds: {args.rounds}, commits alternating; each cell: geometric mean over "
        "rounds x prompts of new / old overhead per emitted token [95% bootstrap interval]; then each "
        "commit's ratio to SpD (same pairs); last, new / old of the wall time per emitted token (the whole "
        "generation call, models included: a change may move time into or out of the models' passes), "
        "and each commit's wall time per emitted token as a multiple of SpD's (same pairs).",
        "",
        "| setting | system | new / old | old x SpD | new x SpD | wall new / old | old wall x SpD | new wall x SpD |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in settings:
        for name in systems:
            pairs = [(runs[new][r][k], runs[old][r][k]) for r in range(args.rounds)
                     for k in keys if k[0] == s and k[1] == name]
            if not pairs:
                continue
            g, lo, hi = _geo_ci([a / b for a, b in pairs])
            cells = []
            for c in (old, new):
                if name == "spd":
                    cells.append("1.00")
                    continue
                rel = [runs[c][r][(s, name, p)] / runs[c][r][(s, "spd", p)] for r in range(args.rounds)
                       for (ss, nn, p) in keys if ss == s and nn == name]
                rg, rlo, rhi = _geo_ci(rel)
                cells.append(f"{rg:.2f} [{rlo:.2f}, {rhi:.2f}]")
            wg, wlo, whi = _geo_ci([walls[new][r][k] / walls[old][r][k] for r in range(args.rounds)
                                    for k in keys if k[0] == s and k[1] == name])
            for c in (old, new):
                if name == "spd":
                    cells.append("1.00")
                    continue
                wrg, wrlo, wrhi = _geo_ci([walls[c][r][(s, name, p)] / walls[c][r][(s, "spd", p)]
                                          for r in range(args.rounds) for (ss, nn, p) in keys if ss == s and nn == name])
                cells.append(f"{wrg:.2f} [{wrlo:.2f}, {wrhi:.2f}]")
            lines.append(f"| {s} | {name} | {g:.2f} [{lo:.2f}, {hi:.2f}] | {cells[0]} | {cells[1]} | "
                         f"{wg:.2f} [{wlo:.2f}, {whi:.2f}] | {cells[2]} | {cells[3]} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()

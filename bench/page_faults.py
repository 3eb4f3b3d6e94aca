"""Page faults and time per step, process by process, with glibc's default malloc thresholds and
with the ones the entry points fix (``mtad.core.allocator``).

    python bench/page_faults.py --out results/bench/page_faults_cpu.txt

Each process is fresh: it builds the overhead bench's tiny pair (``bench/overhead.py``
``build_pair``, random draft), warms every system up with one short run, then runs each
system on ``--prompts`` prompts of ``--max-new-tokens`` tokens (``overhead.measure``: wall,
forward by hooks, overhead = wall - forward) and counts the process's minor page faults
(``resource``) around them. Arms alternate process by process: ``default`` sets
``MTAD_MALLOC=system`` (glibc keeps its moving thresholds), ``tuned`` calls ``allocator.tune()``
first. One line per process and system: faults, wall and overhead per step; the spread across
processes of one arm is the point (which state glibc lands in differs between processes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def child(args) -> None:
    import torch

    from mtad.core import allocator

    allocator.tune()  # the default arm's MTAD_MALLOC=system leaves glibc alone (and says so)
    torch.set_num_threads(1)
    import overhead as ov
    from speed import ForwardTimer, parse_decoder

    from mtad.core.warping import Warping
    from mtad.run.cli import load_decoder

    pair = ov.build_pair(args.vocab, 64, 2, 64, 1, "random")
    timers = {"target": ForwardTimer(pair.target), "draft": ForwardTimer(pair.draft)}
    warping = {"greedy": Warping(0.0), "sample": Warping(1.0, 10, 0.9)}[args.mode]
    prompts = ov.make_prompts(args.prompts, 32, args.vocab)
    systems = args.systems.split(",")
    decs = {}
    for s in systems:
        name, knobs = parse_decoder(s, 4)
        decs[s] = load_decoder(name, **knobs)
    for s in systems:  # warm-up
        ov.measure(s, pair, timers, decs[s], prompts[0], 4, warping, 4, 0)
    out = {"allocator": allocator.state(), "systems": {}}
    for s in systems:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        wall = over = steps = 0
        for i, ids in enumerate(prompts):
            row = ov.measure(s, pair, timers, decs[s], ids, args.max_new_tokens, warping, 4, i)
            wall, over, steps = wall + row["wall"], over + row["overhead"], steps + row["steps"]
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        out["systems"][s] = {"faults_per_step": faults / steps, "wall_ms_per_step": 1e3 * wall / steps,
                             "overhead_ms_per_step": 1e3 * over / steps}
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--mode", default="greedy", choices=["greedy", "sample"])
    ap.add_argument("--systems", default="spd,tree_mtad,beam_specinfer,mtad")
    ap.add_argument("--processes", type=int, default=4, help="fresh processes per arm")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return
    given = list(sys.argv[1:] if argv is None else argv)
    if args.out:
        from mtad.core.io import shown_path

        given[given.index("--out") + 1] = shown_path(args.out)
    base = [sys.executable, str(Path(__file__).resolve()), "--child", "--vocab", str(args.vocab), "--mode",
            args.mode, "--systems", args.systems, "--prompts", str(args.prompts),
            "--max-new-tokens", str(args.max_new_tokens)]
    env0 = {k: v for k, v in os.environ.items() if k not in ("MTAD_MALLOC", "MALLOC_MMAP_THRESHOLD_",
                                                             "MALLOC_TRIM_THRESHOLD_")}
    runs: dict[str, list[dict]] = {"default": [], "tuned": []}
    for i in range(args.processes):
        for arm in ("default", "tuned") if i % 2 == 0 else ("tuned", "default"):
            env = {**env0, **({"MTAD_MALLOC": "system"} if arm == "default" else {}), "PYTHONPATH": str(ROOT)}
            got = subprocess.run(base, capture_output=True, text=True, env=env, check=True)
            runs[arm].append(json.loads(got.stdout.strip().splitlines()[-1]))
            print(f"[{arm} process {len(runs[arm])}] done", file=sys.stderr, flush=True)
    from mtad.core.machine import cpu_info
    from mtad.run.provenance import git_info

    g = git_info()
    git = (g["commit"] or "?")[:10] + (" (uncommitted changes)" if g["dirty"] else "")
    lines = [f"Command: `python bench/page_faults.py {' '.join(given)}`".replace("  ", " "),
             f"Machine: {cpu_info().get('model')}; one torch thread; git {git}. Tiny pair (hidden 64), random "
             f"draft, V {args.vocab}, {args.mode}, {args.prompts} prompts x {args.max_new_tokens} tokens per "
             "system per process; arms alternate process by process.",
             f"default: {json.dumps(runs['default'][0]['allocator'])}; tuned: "
             f"{json.dumps(runs['tuned'][0]['allocator'])}",
             "",
             f"{'arm':8} {'process':>7} {'system':16} {'faults/step':>11} {'wall ms/step':>12} "
             f"{'overhead ms/step':>16}"]
    for arm in ("default", "tuned"):
        for p, run in enumerate(runs[arm], 1):
            for s, m in run["systems"].items():
                lines.append(f"{arm:8} {p:>7} {s:16} {m['faults_per_step']:>11.0f} {m['wall_ms_per_step']:>12.2f} "
                             f"{m['overhead_ms_per_step']:>16.2f}")
    lines += ["", "median over processes:"]
    for s in args.systems.split(","):
        cells = []
        for arm in ("default", "tuned"):
            ms = [r["systems"][s] for r in runs[arm]]
            cells.append(f"{arm} {statistics.median(m['faults_per_step'] for m in ms):.0f} faults, "
                         f"{statistics.median(m['wall_ms_per_step'] for m in ms):.2f} ms wall, "
                         f"{statistics.median(m['overhead_ms_per_step'] for m in ms):.2f} ms overhead")
        lines.append(f"  {s:16} " + "; ".join(cells))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()

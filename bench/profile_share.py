#!/usr/bin/env python
"""Confirm the harness-overhead figures of ``bench/speed.py`` with a sampling profiler (py-spy).

``bench/speed.py`` measures the share of wall time inside the models' top-level forward with
forward hooks. This script checks that figure independently: for each decoder it runs
``bench/speed.py`` (that decoder only, one mode, one repeat) under ``py-spy record`` and
counts, among the samples taken inside ``Engine.generate``, those inside a ``torch.nn.Module``
call (the models: the harness itself calls no module). It prints both shares side by side and
where the rest of the time goes (the innermost harness frames outside the models).

    python bench/profile_share.py --decoders spd,specinfer,mcss,spectr,mtad,tree_mtad \\
        --tasks humaneval:10-11 --max-new-tokens 64 --out results/bench/profile_share_cpu.json
    python bench/profile_share.py model=tiny_random --decoders spd --max-new-tokens 8   # smoke

Needs py-spy (``pip install py-spy``, in the dev extras); it samples another process, so it
needs permission to ptrace it (root, or ``kernel.yama.ptrace_scope = 0``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mtad.run.provenance import provenance, write_json_atomic  # noqa: E402

GENERATE = "Engine.generate (mtad/core/engine.py)"
MODULE_CALL = "Module._call_impl (torch/nn/modules/module.py)"


def _frame(f: str) -> str:
    """``Cls.func (/abs/.../site-packages/torch/x.py:12)`` -> ``Cls.func (torch/x.py)``."""
    name, _, path = f.partition(" (")
    path = path.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{name} ({path})"


def parse_raw(text: str) -> tuple[int, int, collections.Counter]:
    """(samples inside Engine.generate, of those inside a module call, outside-model leaf frames)."""
    in_gen = in_model = 0
    leaves: collections.Counter = collections.Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";")]
        if GENERATE not in frames:
            continue
        n = int(count)
        in_gen += n
        if MODULE_CALL in frames:
            in_model += n
        else:
            harness = [f for f in frames if "mtad/" in f or "eval/" in f]
            inner = harness[-1] if harness else frames[-1]
            leaves[inner if inner == frames[-1] else f"{inner} > {frames[-1]}"] += n
    return in_gen, in_model, leaves


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the model, e.g. model=tiny_random")
    ap.add_argument("--decoders", default="spd,specinfer,mcss,spectr,mtad,tree_mtad")
    ap.add_argument("--tasks", default="humaneval:10-11")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--mode", default="sample", choices=("sample", "greedy"))
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=6, help="outside-model frames listed per decoder")
    ap.add_argument("--out", default="results/bench/profile_share.json")
    args = ap.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise SystemExit("py-spy not found: pip install py-spy (it is in mtad's dev extras)")

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dec in args.decoders.split(","):
            raw, js = Path(tmp) / f"{dec}.txt", Path(tmp) / f"{dec}.json"
            cmd = [spy, "record", "--function", "--nonblocking", "-r", str(args.rate), "--format", "raw",
                   "-o", str(raw), "--", sys.executable, str(ROOT / "bench" / "speed.py"), *args.overrides,
                   "--tasks", args.tasks, "--decoders", dec, "--modes", args.mode, "--repeats", "1",
                   "--max-new-tokens", str(args.max_new_tokens), "--out", str(js)]
            print(f"[{dec}] {' '.join(cmd[cmd.index('--') + 1:])}", file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            if proc.returncode != 0 or not raw.exists():
                raise SystemExit(f"py-spy run for {dec} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            in_gen, in_model, leaves = parse_raw(raw.read_text())
            report = json.loads(js.read_text())["report"]
            hooks = [per[dec]["forward_share"] for per in report.values() if dec in per]
            results[dec] = dict(
                samples=in_gen,
                profiler_model_share=in_model / in_gen if in_gen else None,
                hooks_forward_share=hooks[0] if hooks else None,
                outside_model_top=[(k, v / in_gen) for k, v in leaves.most_common(args.top)] if in_gen else [],
            )

    print(f"\n{'decoder':<12} {'samples':>7} {'in models (py-spy)':>18} {'in forward (hooks)':>18}")
    for dec, r in results.items():
        prof = f"{r['profiler_model_share']:.1%}" if r["profiler_model_share"] is not None else "-"
        hk = f"{r['hooks_forward_share']:.1%}" if r["hooks_forward_share"] is not None else "-"
        print(f"{dec:<12} {r['samples']:>7} {prof:>18} {hk:>18}")
    for dec, r in results.items():
        print(f"\n{dec}: where the time outside the models goes (share of samples in Engine.generate)")
        for frame, share in r["outside_model_top"]:
            print(f"  {share:6.1%}  {frame}")
    write_json_atomic(args.out, {"results": results, "args": vars(args), "provenance": provenance()})
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()

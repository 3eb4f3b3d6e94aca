#!/usr/bin/env python
"""What a model's forward pass costs the harness work right after it: the same work timed just
after a draft pass and then again at once, in one process.

A run interleaves the models' passes with the harness's own work, and a pass over a vocabulary of
151,936 tokens streams its output projection (tens of MB) through the caches. So the harness meets
its rows, and its own code and data, where the pass left them. Two fixed workloads make that
visible: *small* (30 small torch and Python operations that read no vocabulary row: a few
uniforms, a reduction of 64 numbers, a small tensor, ten times) and *rows* (a softmax of the 8
rows the pass made). Each is timed right after a draft pass over 8 random tokens, then again
immediately (warm); medians over the passes. The difference is what a run pays on top of a
loop's timing for that work after every pass; it is the same for every decoder per pass.

    python bench/after_pass.py --vocabs 32000,151936 --passes 40 --out results/bench/after_pass_cpu.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import build_pair  # noqa: E402
from phases import _machine, command, publish  # noqa: E402

from mtad.core import allocator  # noqa: E402
from mtad.core.sampling import InverseCdf, uniforms  # noqa: E402

ROWS = 8  # tokens in each draft pass (a tree level's rows at k_config 4,2,2)


def measure(vocab: int, passes: int, draft: str = "random") -> dict[str, float]:
    """Median microseconds of each workload right after a pass and again at once."""
    model = build_pair(vocab, 64, 2, 64, 1, draft).draft
    g, gen, small = torch.Generator().manual_seed(0), InverseCdf().manual_seed(0), torch.rand(64)

    def small_work(_rows):
        for _ in range(10):
            uniforms(8, gen).tolist()
            (small * 2).sum().item()
            torch.tensor([1, 2, 3])

    def row_work(rows):
        rows.softmax(-1)

    times: dict[str, list[float]] = {}
    for _ in range(passes + 2):  # (the first two passes warm the model up: not counted)
        for name, work in (("small", small_work), ("rows", row_work)):
            with torch.no_grad():
                rows = model(torch.randint(2, vocab, (1, ROWS), generator=g)).logits[0]
            for when in ("after a pass", "again"):
                t0 = time.perf_counter()
                work(rows)
                times.setdefault(f"{name}, {when}", []).append(time.perf_counter() - t0)
    return {k: 1e6 * statistics.median(v[2:]) for k, v in times.items()}


def render(args, results: dict[int, dict[str, float]]) -> str:
    lines = ["## Harness work right after a model's pass (`bench/after_pass.py`)", "",
             " ".join((__doc__ or "").split("\n\n")[1].split()), "",
             f"Command: `{command('after_pass.py', args.argv)}`; {args.passes} passes per vocabulary, "
             f"{args.draft} draft (hidden 64, 1 layer), torch threads {torch.get_num_threads()}.", _machine(), "",
             "| vocabulary | small, after a pass (µs) | small, again (µs) | small: after / again | rows, after a pass (µs) "
             "| rows, again (µs) | rows: after / again |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for vocab, r in results.items():
        lines.append(f"| {vocab:,} | {r['small, after a pass']:.1f} | {r['small, again']:.1f} | "
                     f"{r['small, after a pass'] / r['small, again']:.2f} | {r['rows, after a pass']:.1f} | "
                     f"{r['rows, again']:.1f} | {r['rows, after a pass'] / r['rows, again']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocabs", default="32000,151936")
    ap.add_argument("--passes", type=int, default=40)
    ap.add_argument("--draft", default="random", choices=("random", "equal"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="write the table here (markdown)")
    args = ap.parse_args(argv)
    if args.passes < 1:
        raise SystemExit(f"--passes must be at least 1, got {args.passes}")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    allocator.tune()  # as the entry points run (mtad.core.allocator)
    torch.set_num_threads(args.threads)
    return publish(render(args, {int(v): measure(int(v), args.passes, args.draft) for v in args.vocabs.split(",")}),
                   args.out)


if __name__ == "__main__":
    main()

"""What one search depth costs outside the models, part by part, on this CPU: MJGD / MTJD's beam
(``beam_width`` float64 log-softmax rows, fresh or into kept buffers, then their top entries) and greedy beam drafting (``W``
plain-softmax rows, then their top ``W + 8``) against SpD's greedy draft depth (one argmax).

    python bench/depth_parts.py --out results/bench/depth_parts_cpu.txt

Each part runs on fresh rows (``--rows`` distinct tensors cycled, as the harness meets rows a
model has just written), the parts alternate within a round, and the median over ``--repeats``
rounds is printed in ms per call, with each part's ratio to SpD's argmax measured in the same
rounds. One torch thread, as the overhead bench runs. glibc's malloc keeps its default (moving)
thresholds here: this script does not call ``mtad.core.allocator.tune`` as the entry points do,
so the fresh log-softmax form shows what fresh 19 MB tensors cost when their pages fault in.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mtad.core.io import shown_path  # noqa: E402
from mtad.core.machine import cpu_info  # noqa: E402
from mtad.core.topk import argmax_rows, topk_rows  # noqa: E402
from mtad.run.provenance import git_info  # noqa: E402


def parts(vocab: int, beam_width: int, width: int) -> dict:
    """(label -> (rows shape, callable on one fresh float32 logits tensor of that shape)).

    MJGD's log-softmax twice: on a fresh float64 copy (as before ``JointDecoder._log_probs``)
    and into two float64 buffers kept across calls (as ``_log_probs`` runs it on the CPU)."""
    src = torch.empty(beam_width, vocab, dtype=torch.float64)
    out = torch.empty_like(src)
    return {
        "spd greedy depth: argmax_rows [1, V]": ((1, vocab), argmax_rows),
        f"greedy beam: softmax [{width}, V]": ((width, vocab), lambda x: x.softmax(-1)),
        f"greedy beam: topk_rows [{width}, V], m {width + 8}": ((width, vocab), lambda x: topk_rows(x, width + 8)),
        f"mjgd: double() [{beam_width}, V]": ((beam_width, vocab), lambda x: x.double()),
        f"mjgd: double().log_softmax [{beam_width}, V]": ((beam_width, vocab), lambda x: x.double().log_softmax(-1)),
        f"mjgd: kept buffers: copy_, log_softmax(out=) [{beam_width}, V]":
            ((beam_width, vocab), lambda x: torch.log_softmax(src.copy_(x), -1, out=out)),
        f"mjgd: topk_rows [{beam_width}, V] float64, m {beam_width + 8}":
            ((beam_width, vocab), lambda x: topk_rows(x, beam_width + 8)),
    }


def run(vocab: int, beam_width: int, width: int, rows: int, repeats: int, seed: int = 0) -> list[tuple[str, float, float]]:
    gen = torch.Generator().manual_seed(seed)
    todo = parts(vocab, beam_width, width)
    pools = {}
    for label, (shape, _) in todo.items():
        dtype = torch.float64 if "float64" in label else torch.float32
        pools[label] = [torch.randn(*shape, generator=gen).to(dtype) for _ in range(rows)]
    times: dict[str, list[float]] = {k: [] for k in todo}
    for r in range(repeats + 1):  # round 0 untimed: its first 19 MB allocations fault in fresh pages
        for label, (_, f) in todo.items():
            xs = pools[label]
            t0 = time.perf_counter()
            for x in xs:
                f(x)
            if r:
                times[label].append((time.perf_counter() - t0) / len(xs))
    base = statistics.median(times[next(iter(todo))])
    return [(k, statistics.median(v) * 1e3, statistics.median(v) / base) for k, v in times.items()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocabs", default="151936,32000")
    ap.add_argument("--beam-width", type=int, default=16, help="MJGD's beam_width (its config default)")
    ap.add_argument("--width", type=int, default=4, help="beam drafting's W")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    g = git_info()
    git = (g["commit"] or "?")[:10] + (" (uncommitted changes)" if g["dirty"] else "")
    given = list(argv if argv is not None else sys.argv[1:])
    if args.out and "--out" in given:  # recorded never absolute
        given[given.index("--out") + 1] = shown_path(args.out)
    cmd = "python bench/depth_parts.py " + " ".join(given)
    lines = [f"Command: `{cmd.strip()}`",
             f"Machine: {cpu_info().get('model', 'unknown CPU')}; torch {torch.__version__}, 1 thread; git {git}. "
             f"Median over {args.repeats} rounds (after one untimed) of ms per call on fresh rows; x: ratio to SpD's argmax.",
             ""]
    for vocab in [int(v) for v in args.vocabs.split(",")]:
        lines.append(f"V = {vocab}")
        for label, ms, ratio in run(vocab, args.beam_width, args.width, args.rows, args.repeats):
            lines.append(f"  {label:<58} {ms:8.3f} ms  {ratio:7.1f}x")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()

"""``mtad.core.topk.topk_rows`` against ``torch.topk`` and ``argmax_rows`` against ``torch.argmax`` on
vocabulary rows, side by side in one run.

    python bench/topk_rows.py --out results/bench/topk_rows_cpu.txt

Shapes are those the harness takes a top-m of on the CPU: a greedy beam depth's ``[W, V]``
plain-softmax rows (m = W + 8), a top-k warping's rows (m = k + 1) and SpD's single rows, at
the offline pair's vocabulary (151,936) and at 32,000. Rows are drawn fresh for every call
(``--rows`` distinct tensors cycled, larger than the caches: the harness meets rows a model
has just written, not rows a loop keeps hot) and the calls alternate between the two forms;
the median over ``--repeats`` rounds is reported with the ratio, and every call's result is
checked equal in values (indices where values are distinct: ``tests/core/test_topk.py``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mtad.core.machine import cpu_info  # noqa: E402
from mtad.core.topk import argmax_rows, topk_rows  # noqa: E402

CASES = [  # (label, rows, vocabulary, m); m = 0: the argmax
    ("greedy beam depth, W 4", 4, 151_936, 12),
    ("top-k 10 warping, 5 rows", 5, 151_936, 11),
    ("one row, top-k 10", 1, 151_936, 11),
    ("greedy beam depth, W 4, V 32k", 4, 32_000, 12),
    ("argmax, one row (greedy SpD draft)", 1, 151_936, 0),
    ("argmax, 5 rows (greedy target rows)", 5, 151_936, 0),
    ("argmax, one row, V 32k", 1, 32_000, 0),
]


def _forms(m: int):
    if m == 0:
        return (lambda x: x.argmax(-1)), argmax_rows
    return (lambda x: torch.topk(x, m, dim=-1)), (lambda x: topk_rows(x, m))


def _git() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7, help="rounds; the median is reported")
    ap.add_argument("--calls", type=int, default=40, help="calls of each form per round")
    ap.add_argument("--rows", type=int, default=24, help="distinct row tensors cycled per case")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    lines = [f"# python bench/topk_rows.py --repeats {args.repeats} --calls {args.calls} --rows {args.rows} "
             f"--threads {args.threads}",
             f"# git {_git()}; {cpu_info().get('model', 'unknown CPU')}; torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads; float32 softmax rows, fresh rows per call, forms alternated",
             "", f"{'case':44} {'torch ms':>14} {'ours ms':>13} {'ratio':>6}"]
    for label, r, vocab, m in CASES:
        rows = [(torch.randn(r, vocab, generator=g) * 3).softmax(-1) for _ in range(args.rows)]
        theirs, ours = _forms(m)
        for x in rows[:4]:  # warm-up, and the check
            a, b = theirs(x), ours(x)
            if not torch.equal(a if m == 0 else a.values, b if m == 0 else b[0]):
                raise SystemExit(f"{label}: the block form differs from torch's")
        per = {"torch": [], "ours": []}
        for _ in range(args.repeats):
            tot = {"torch": 0.0, "ours": 0.0}
            for i in range(args.calls):
                x = rows[i % len(rows)]
                for form in (("torch", "ours") if i % 2 == 0 else ("ours", "torch")):
                    t0 = time.perf_counter()
                    (theirs if form == "torch" else ours)(x)
                    tot[form] += time.perf_counter() - t0
            for k in tot:
                per[k].append(1e3 * tot[k] / args.calls)
        a, b = statistics.median(per["torch"]), statistics.median(per["ours"])
        lines.append(f"{label + f' [{r}, {vocab}]' + (f' m {m}' if m else ''):44} {a:14.3f} {b:13.3f} {b / a:6.2f}")
    lines += ["", "ms per call, median over rounds; torch = torch.topk (m > 0) or torch.argmax, ours = "
              "topk_rows or argmax_rows; ratio = ours / torch (below 1: faster)"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()

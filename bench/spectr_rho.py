"""SpecTr's rho at one node, by sorting the ratios (``spectr_rho``, the race settings' rule) and by
selection (``spectr_rho_select``, the inverse-CDF settings' rule), timed side by side in one
process on the same rows, interleaved, with the roots' largest relative difference.

    python bench/spectr_rho.py --vocabs 32000,151936 --ks 2,4 --rows 5 --repeats 20 \\
        --md results/bench/spectr_rho_cpu.md

Rows: the softmax of standard normal logits (a random model's plain-temperature rows), a target
and a draft per pair, float32, seeded; one thread unless ``--threads``. Each cell: the median
over pairs of the per-pair mean of ``--repeats`` calls, for each rule, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from mtad.core.machine import cpu_info
from mtad.verify.multidraft import spectr_rho, spectr_rho_select


def _time(fn, p, q, k, repeats: int) -> tuple[float, float]:  # (seconds per call, the root)
    root = fn(p, q, k)  # warm
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn(p, q, k)
    return (time.perf_counter() - t0) / repeats, root


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocabs", default="32000,151936")
    ap.add_argument("--ks", default="2,4", help="candidates per node (SpecTr's drafts alive)")
    ap.add_argument("--rows", type=int, default=5, help="(target, draft) pairs per vocabulary")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--md", default=None, help="also write the table here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cpu = cpu_info()
    lines = [
        "## SpecTr's rho: sort against selection (`bench/spectr_rho.py`)", "",
        (__doc__ or "").split("\n\n")[2].replace("\n", " ").strip(), "",
        f"Command: `python bench/spectr_rho.py --vocabs {args.vocabs} --ks {args.ks} --rows {args.rows} "
        f"--repeats {args.repeats} --threads {args.threads} --seed {args.seed}`; "
        f"machine: {cpu['model']} ({cpu['torch_capability']}, {cpu['usable_cpus']} usable CPUs), "
        f"torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}.", "",
        "| vocabulary | k | sort ms | selection ms | selection / sort | largest relative root difference |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    g = torch.Generator().manual_seed(args.seed)
    for vocab in (int(v) for v in args.vocabs.split(",")):
        pairs = [torch.softmax(torch.randn(2, vocab, generator=g), -1) for _ in range(args.rows)]
        for k in (int(x) for x in args.ks.split(",")):
            sort_t, sel_t, diff = [], [], 0.0
            for i, (p, q) in enumerate(pairs):
                order = (spectr_rho, spectr_rho_select) if i % 2 == 0 else (spectr_rho_select, spectr_rho)
                got = {fn: _time(fn, p, q, k, args.repeats) for fn in order}
                sort_t.append(got[spectr_rho][0])
                sel_t.append(got[spectr_rho_select][0])
                a, b = got[spectr_rho][1], got[spectr_rho_select][1]
                diff = max(diff, abs(a - b) / a)
            s, t = statistics.median(sort_t), statistics.median(sel_t)
            lines.append(f"| {vocab} | {k} | {1e3 * s:.2f} | {1e3 * t:.2f} | {t / s:.2f} | {diff:.1e} |")
    text = "\n".join(lines) + "\n"
    if args.md:
        Path(args.md).write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()

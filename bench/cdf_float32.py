"""How often beam sampling's device draw (several draws with replacement at plain temperature)
differs from the CPU's ``torch.multinomial`` on the same float32 masses (``make bench-cdf32``).

``torch.multinomial(masses, k, replacement=True)`` on the CPU searches k uniform doubles in the
masses' cumulative sum, accumulated in the masses' dtype in order. On an accelerator
``mtad.core.sampling.device_multinomial`` takes the same uniforms from the same generator and
searches them in cumulative sums taken in float64 there (a sequential float32 sum cannot be
reproduced by a parallel device), so the generator's stream stays aligned and float64 masses
draw the same entries (``tests/core/test_device_draw.py``). For float32 masses the CPU's running
sum drifts by more than one entry's mass over a long vector; this counts the draws that differ,
on rows like beam sampling's W x V scores (W = 4 softmax rows of 151,936 entries, each scaled
by a weight), with the float64 search computed on the CPU (the device's arithmetic).

    python bench/cdf_float32.py --out results/bench/cdf_float32.txt
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def count(seeds: int, width: int, vocab: int, k: int) -> tuple[int, int]:
    diff = total = 0
    for seed in range(seeds):
        g = torch.Generator().manual_seed(seed)
        for scale in (1.0, 3.0):
            rows = torch.softmax(scale * torch.randn(width, vocab, generator=g), -1)
            x = (rows * torch.rand(width, 1, generator=g)).reshape(-1)  # float32 scores
            host = torch.multinomial(x, k, replacement=True, generator=torch.Generator().manual_seed(seed))
            u = torch.rand(k, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
            cdf = x.double().cumsum(0)
            dev = torch.searchsorted(cdf / cdf[-1], u)
            diff += int((host != dev).sum())
            total += k
    return diff, total


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    diff, total = count(args.seeds, args.width, args.vocab, args.width)
    line = (f"float32 masses, {args.width} x {args.vocab:,} entries, {args.width} draws with replacement, "
            f"{args.seeds} seeds x 2 scales: {diff} of {total} draws differ between the CPU's "
            f"float32 running sum and a float64 cumulative sum\n"
            f"torch {torch.__version__}")
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()

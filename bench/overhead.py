"""Harness overhead: the share of decoding wall time spent outside the models' forward passes.

Builds a tiny random target/draft pair (``mtad.models.tiny``) with a LARGE vocabulary
(default 150,000, like the offline Qwen pair's 151,936) and a tiny hidden size, so that
any work the decoders do on dense vocabulary vectors (sampling, residuals, verification)
shows against the models' own time. For each decoder it runs ``--prompts`` generations
through ``mtad.engine.Engine`` and reports, summed over them,

    overhead = 1 - (target_forward_time + draft_forward_time) / wall_time

with the times of ``GenerationResult.to_record`` (prefill excluded). The forward time
includes the models' logits over the whole vocabulary; everything else (warping,
sampling, drafting bookkeeping, verification, cache pruning) is overhead. The warping
(temperature, top-k / top-p over V logits, ``mtad.warping``) is dense by nature; its share
is reported separately (``warp``), and ``other`` is the overhead without it. With a tiny
hidden size the models' forward is unrealistically cheap next to any O(V) work (a real
model's output layer costs ``hidden`` multiply-adds per vocabulary entry), so the shares
here are upper bounds of what the harness costs on a real pair.

This is a benchmark, not a test: numbers depend on the machine and its load.

Examples::

    python bench/overhead.py
    python bench/overhead.py --vocab 150000 --new-tokens 32 --out /tmp/overhead.json
    python bench/overhead.py --decoders specinfer mcss --temperature 0
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

import torch

if __package__ in (None, ""):  # run as `python bench/overhead.py` from a checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mtad.decoders.mcss import MCSS
from mtad.decoders.mtad import MTAD
from mtad.decoders.spd import SpD
from mtad.decoders.specinfer import SpecInfer
from mtad.decoders.spectr import SpecTr
from mtad.decoders.tree_mtad import TreeMTAD
from mtad.engine import Engine
from mtad.models.tiny import tiny_causal_lm
from mtad.records import provenance
from mtad.warping import Warping

DECODERS = {
    "spd": lambda: SpD(gamma=4),
    "specinfer": lambda: SpecInfer(k_config=[4, 2, 2]),
    "mcss": lambda: MCSS(k_config=[4, 2, 2]),
    "spectr": lambda: SpecTr(gamma=4, num_drafts=4),
    "mtad": lambda: MTAD(gamma=4, width=4, tau=0.5),
    "tree_mtad": lambda: TreeMTAD(gamma=4, width=4, tau=0.5),
}


@dataclass(frozen=True)
class TimedWarping(Warping):
    """``Warping`` that adds the seconds spent warping to a shared counter."""

    clock: list | None = None  # [seconds], shared and mutable

    def __call__(self, logits):
        t0 = time.perf_counter()
        out = super().__call__(logits)
        self.clock[0] += time.perf_counter() - t0
        return out


def measure(engine: Engine, prompts: list[list[int]], new_tokens: int, seed: int) -> dict:
    clock = engine.warping.clock
    clock[0] = 0.0
    recs = [engine.generate(p, new_tokens, seed=seed + i).to_record() for i, p in enumerate(prompts)]
    wall = sum(r["wall_time"] for r in recs)
    fwd = sum(r["target_forward_time"] + r["draft_forward_time"] for r in recs)
    tokens = sum(r["new_tokens"] for r in recs)

    def share(x: float) -> float:
        return x / wall if wall > 0 else float("nan")

    return {
        "wall_time": wall,
        "forward_time": fwd,
        "warp_time": clock[0],
        "overhead_share": share(wall - fwd),
        "warp_share": share(clock[0]),
        "other_share": share(wall - fwd - clock[0]),
        "overhead_ms_per_token": 1000 * (wall - fwd) / max(tokens, 1),
        "other_ms_per_token": 1000 * (wall - fwd - clock[0]) / max(tokens, 1),
        "new_tokens": tokens,
        "steps": sum(r["steps"] for r in recs),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decoders", nargs="+", default=list(DECODERS), choices=list(DECODERS))
    ap.add_argument("--vocab", type=int, default=150_000)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the table and provenance as JSON here")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    kw = dict(vocab_size=args.vocab, hidden_size=args.hidden, num_heads=4, logit_scale=4.0)
    target = tiny_causal_lm("qwen2", num_layers=args.layers, seed=1, **kw)
    draft = tiny_causal_lm("qwen2", num_layers=1, seed=2, **kw)
    warping = TimedWarping(args.temperature, args.top_k, args.top_p, clock=[0.0])
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(2, args.vocab, (16,), generator=gen).tolist() for _ in range(args.prompts)]

    rows = {}
    print(f"{'decoder':<10} {'wall s':>7} {'fwd s':>6} {'warp s':>6} {'overhead':>9} {'warp':>6} "
          f"{'other':>6} {'ovh ms/tok':>10} {'other ms/tok':>12} {'steps':>5}")
    for name in args.decoders:
        engine = Engine(target, draft, DECODERS[name](), warping)
        engine.generate(prompts[0], 4, seed=args.seed)  # warm-up
        r = measure(engine, prompts, args.new_tokens, args.seed)
        rows[name] = r
        print(f"{name:<10} {r['wall_time']:7.2f} {r['forward_time']:6.2f} {r['warp_time']:6.2f} "
              f"{100 * r['overhead_share']:8.1f}% {100 * r['warp_share']:5.1f}% "
              f"{100 * r['other_share']:5.1f}% {r['overhead_ms_per_token']:10.2f} "
              f"{r['other_ms_per_token']:12.2f} {r['steps']:5d}")
    out = {"args": vars(args), "results": rows, "provenance": provenance(seed=args.seed)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()

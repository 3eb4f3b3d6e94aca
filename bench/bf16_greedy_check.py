#!/usr/bin/env python
"""The bfloat16 greedy check of ``tests/test_gpu.py`` on the CPU, over many prompts.

The check (``gpu_check.greedy_mismatch``): a lossless decoder at T=0 may differ from target
greedy decoding only from a position where the target's top-2 logits lie within
``gpu_check.near_tie_margin`` (16 spacings of bfloat16 at |top-1 logit|). Here, in bfloat16 on the CPU, on the test's tiny pair (Qwen2, vocabulary 40,
logit scale 32), for ``--prompts`` random prompts:

* ``decoders``: for each correct lossless decoder, on how many prompts the check fails (must be
  0) and on how many its output differs at all (at a near-tie);
* ``planted``: SpD with an off-by-one in verification (row i of the target's distributions
  scores draft token i+1's position: the target pass's ``p`` shifted by one row before
  ``mtad.verify.chain.verify_chain``): on how many prompts
  the same check fails (it must fail on some: the check has power);
* ``hidden_rounding_spacings``: per position, eps/2 * |w_a - w_b| * |h| / spacing(|top-1|):
  how far one bfloat16 rounding of the last hidden state h can move the top-2 gap (w_a, w_b:
  the output rows of the top two tokens), in spacings; quantiles over all positions.

Writes ``--out`` (JSON: every count, the settings, provenance) and prints a summary. The CPU's
bfloat16 kernels differ little between pass shapes, so this shows the check's power and that it
never fails a correct decoder here; GPU kernels are the margin's reason (docs/devices.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import gpu_check  # noqa: E402

from mtad.core.engine import Engine  # noqa: E402
from mtad.core.warping import Warping  # noqa: E402
from mtad.decoders.autoregressive import Greedy  # noqa: E402
from mtad.models.tiny import tiny_causal_lm  # noqa: E402

DECODERS = ("spd", "specinfer", "mcss", "beam_specinfer")
VOCAB = 40


def pair(dtype=torch.bfloat16, scale=32.0):
    """``tests/test_gpu.py``'s pair: target (hidden 32, 2 layers) and draft (16, 1 layer)."""
    t = tiny_causal_lm("qwen2", vocab_size=VOCAB, dtype=dtype, seed=0, logit_scale=scale)
    d = tiny_causal_lm("qwen2", vocab_size=VOCAB, hidden_size=16, num_heads=2, num_layers=1,
                       dtype=dtype, seed=1, logit_scale=scale)
    return t, d


@contextlib.contextmanager
def off_by_one_verification():
    """SpD's verification reads the target's distributions one row late (a planted bug): the
    target pass's scores themselves are shifted, so every path of the chain rule reads them so
    (the dense ``verify_chain`` and the CPU's reading on candidates alike)."""
    import dataclasses

    import mtad.verify.chain as chain

    real = chain.score

    def shifted(ctx, tree):
        s = real(ctx, tree)
        return dataclasses.replace(s, root=s.body[0], body=torch.cat([s.body[1:], s.body[-1:]]), _cache={})

    chain.score = shifted
    try:
        yield
    finally:
        chain.score = real


def hidden_rounding_spacings(model, prompt, tokens) -> list[float]:
    """Per position: eps/2 * |w_a - w_b| * |h| / spacing(|top-1|) (see the module docstring)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    rows = slice(len(prompt) - 1, len(prompt) - 1 + len(tokens))
    logits, hidden = out.logits[0, rows].float(), out.hidden_states[-1][0, rows].float()
    w = model.get_output_embeddings().weight.detach().float()
    top = logits.topk(2, dim=-1)
    dw = (w[top.indices[:, 0]] - w[top.indices[:, 1]]).norm(dim=-1)
    eps = torch.finfo(torch.bfloat16).eps
    moved = eps / 2 * dw * hidden.norm(dim=-1)
    return (moved / gpu_check.spacing(torch.bfloat16, top.values[:, 0])).tolist()


def check(n_prompts: int, new_tokens: int, seed: int, decoders=DECODERS) -> dict:
    target, draft = pair()
    rng = random.Random(seed)
    prompts = [[rng.randrange(2, VOCAB) for _ in range(rng.randint(3, 8))] for _ in range(n_prompts)]
    fails = {name: [] for name in decoders}
    differ = {name: 0 for name in decoders}
    planted_fails, ratios = [], []
    for k, prompt in enumerate(prompts):
        ref = Engine(target, None, Greedy(), Warping(0)).generate(prompt, new_tokens).output_ids
        ratios += hidden_rounding_spacings(target, prompt, ref)
        for name in decoders:
            out = Engine(target, draft, gpu_check.load_decoder(name), Warping(0)).generate(
                prompt, new_tokens, seed=2).output_ids
            differ[name] += out != ref
            if gpu_check.greedy_mismatch(target, prompt, ref, out):
                fails[name].append(k)
        with off_by_one_verification():
            out = Engine(target, draft, gpu_check.load_decoder("spd"), Warping(0)).generate(
                prompt, new_tokens, seed=2).output_ids
        if gpu_check.greedy_mismatch(target, prompt, ref, out):
            planted_fails.append(k)
    q = statistics.quantiles(ratios, n=100)
    return {
        "prompts": n_prompts, "new_tokens": new_tokens, "seed": seed,
        "margin": f"{gpu_check.NEAR_TIE_ULPS} spacings of bfloat16 at |top-1 logit|",
        "decoders": {name: {"failed": len(f), "failed_prompts": f, "differed_at_a_near_tie": differ[name] - len(f)}
                     for name, f in fails.items()},
        "planted": {"decoder": "spd, verification off by one row", "failed": len(planted_fails),
                    "of": n_prompts},
        "hidden_rounding_spacings": {"positions": len(ratios), "median": q[49], "p99": q[98],
                                     "max": max(ratios)},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "results" / "bench" / "bf16_greedy_check.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    res = check(args.prompts, args.new_tokens, args.seed)
    res["seconds"] = time.perf_counter() - t0
    from mtad.run.provenance import provenance

    res["provenance"] = provenance(seed=args.seed)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    h = res["hidden_rounding_spacings"]
    print(f"{args.prompts} prompts x {args.new_tokens} tokens, bfloat16 on the CPU, margin {res['margin']}: "
          + ", ".join(f"{n} failed {d['failed']}" for n, d in res["decoders"].items())
          + f"; planted off-by-one failed {res['planted']['failed']}/{args.prompts}; one hidden rounding moves the gap by "
          f"median {h['median']:.2f}, p99 {h['p99']:.2f}, max {h['max']:.2f} spacings "
          f"({res['seconds']:.0f} s) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

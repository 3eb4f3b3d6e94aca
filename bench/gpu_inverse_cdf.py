#!/usr/bin/env python
"""Inverse-CDF draws on a real GPU, in one run of under ~3 minutes (``--dry-run``: the same on the CPU).

1. ``draws``: rows of 151,936 entries (20,000 with ``--dry-run``) (float32 and float64, a third of them zero) drawn on CUDA and
   on the host with the same seed (``mtad.core.sampling``: ``sample``, ``device_multinomial`` with and
   without replacement, a tree level ``_draw_level``): how many draws are the host's and whether the
   generator's state is (the float64 ``cumsum`` on the GPU is a parallel scan: a uniform within a
   rounding error of a boundary may pick the neighbour; every other draw is the host's).
2. ``engine``: every sampling decoder on tiny float64 models on CUDA against the CPU, at plain
   temperature and top-p alone (inverse CDF): equal output ids per run.
3. ``timing``: wall time per emitted token of SpD, SpecInfer, MCSS, SpecTr, tree-MTAD, MTAD and beam
   SpecInfer on tiny float32 models at 151,936 tokens on CUDA, the race (``draws=race``, before) and
   the inverse CDF (after) interleaved, plain temperature and top-p alone; and the random numbers
   each step draws (``mtad.testing.streams``).
4. ``tests``: ``pytest -m gpu tests/test_gpu.py -k "seeded or plain"`` (if the time is left).

    python bench/gpu_inverse_cdf.py --out gpu_inverse_cdf   # writes gpu_inverse_cdf/report.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from gpu_check import load_decoder  # noqa: E402  (no Hydra: a stock GPU node has none)

from mtad.core.engine import Engine  # noqa: E402
from mtad.core.sampling import InverseCdf, as_support, cdf_positions, device_multinomial, sample  # noqa: E402
from mtad.core.warping import Warping  # noqa: E402
from mtad.models.tiny import tiny_causal_lm  # noqa: E402
from mtad.propose.tree import _draw_level  # noqa: E402
from mtad.testing.streams import words_between  # noqa: E402

VOCAB = 151_936
SYSTEMS = ("spd", "specinfer", "mcss", "spectr", "tree_mtad", "mtad", "beam_specinfer")
SETTINGS = {"plain": (1.0, 0, 1.0), "top-p": (1.0, 0, 0.9)}


def _row(seed: int, dtype, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(3 * torch.randn(vocab, dtype=dtype, generator=g), -1)
    p[torch.randperm(vocab, generator=g)[: vocab // 3]] = 0
    return p


def draws(dev: str, seeds: int, vocab: int) -> dict:
    out = {}
    for dtype in (torch.float32, torch.float64):
        same = total = states = 0
        for seed in range(seeds):
            p = _row(seed, dtype, vocab)
            s = as_support(p)
            gh, gd = InverseCdf().manual_seed(seed), InverseCdf().manual_seed(seed)
            want = [sample(s, gh), *cdf_positions(p, 4, True, gh), *cdf_positions(p, 4, False, gh),
                    *sum(_draw_level([s, s, s], 4, gh, False), []), *sum(_draw_level([s, s, s], 4, gh, True), [])]
            row = p.to(dev)
            got = [sample(row, gd), *device_multinomial(row, 4, True, gd)[0].tolist(),
                   *device_multinomial(row, 4, False, gd)[0].tolist(),
                   *sum(_draw_level([row, row, row], 4, gd, False), []),
                   *sum(_draw_level([row, row, row], 4, gd, True), [])]
            same += sum(a == b for a, b in zip(want, got))
            total += len(want)
            states += bool(torch.equal(gh.get_state(), gd.get_state()))
        out[str(dtype).split(".")[-1]] = {"draws_equal": same, "draws": total, "states_equal": states,
                                          "runs": seeds}
    return out


def _pair(vocab: int, dtype, dev: str):
    t = tiny_causal_lm("qwen2", vocab_size=vocab, hidden_size=64, num_heads=4, num_layers=2, dtype=dtype,
                       seed=0, logit_scale=4.0).to(dev)
    d = tiny_causal_lm("qwen2", vocab_size=vocab, hidden_size=32, num_heads=2, num_layers=1, dtype=dtype,
                       seed=1, logit_scale=4.0).to(dev)
    return t, d


def engine(dev: str, systems) -> dict:
    cpu, gpu = _pair(8192, torch.float64, "cpu"), _pair(8192, torch.float64, dev)
    out = {}
    for name in systems:
        for setting, (t, k, p) in SETTINGS.items():
            w = Warping(t, k, p)
            eq = 0
            for seed in range(3):
                a = Engine(*cpu, load_decoder(name), w).generate([3, 4, 5], 16, seed=seed).output_ids
                b = Engine(*gpu, load_decoder(name), w).generate([3, 4, 5], 16, seed=seed).output_ids
                eq += a == b
            out[f"{name}/{setting}"] = f"{eq}/3"
    return out


class _Words:
    def __init__(self, dec):
        self.dec, self.words = dec, []

    def __getattr__(self, k):
        return getattr(self.dec, k)

    def step(self, ctx):
        s = ctx.generator.get_state()
        out = self.dec.step(ctx)
        self.words.append(words_between(s, ctx.generator.get_state()))
        return out


def timing(dev: str, tokens: int, repeats: int, vocab: int, systems) -> dict:
    pair = _pair(vocab, torch.float32, dev)
    out = {}
    for setting, (t, k, p) in SETTINGS.items():
        for name in systems:
            per = {"race": [], "inverse_cdf": []}
            words = {}
            for rep in range(repeats + 1):  # the first round warms up, not recorded
                for scheme in ("race", "inverse_cdf") if rep % 2 else ("inverse_cdf", "race"):
                    dec = _Words(load_decoder(name))
                    eng = Engine(*pair, dec, Warping(t, k, p, draws=scheme))
                    if dev != "cpu":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    res = eng.generate([3, 4, 5, 6], tokens, seed=rep)
                    wall = time.perf_counter() - t0
                    if rep:
                        per[scheme].append(wall / len(res.output_ids))
                        words[scheme] = statistics.fmean(dec.words)
            med = {s: statistics.median(v) for s, v in per.items()}
            out[f"{setting}/{name}"] = {"ms_per_token_race": 1e3 * med["race"],
                                        "ms_per_token_inverse_cdf": 1e3 * med["inverse_cdf"],
                                        "race_over_inverse_cdf": med["race"] / med["inverse_cdf"],
                                        "words_per_step": words}
            print(setting, name, out[f"{setting}/{name}"], flush=True)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_inverse_cdf")
    ap.add_argument("--dry-run", action="store_true", help="the CPU instead of CUDA (small sizes)")
    ap.add_argument("--budget-s", type=float, default=170)
    args = ap.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --dry-run for the CPU")
    dev = "cpu" if args.dry_run else "cuda"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
                    "torch": torch.__version__}
    t0 = time.perf_counter()
    vocab = 20_000 if args.dry_run else VOCAB
    few = ("spd", "specinfer")  # --dry-run: two systems
    report["vocab"] = vocab
    phases = [("draws", lambda: draws(dev, 2 if args.dry_run else 20, vocab)),
              ("engine", lambda: engine(dev, few if args.dry_run else SYSTEMS + ("mcns", "multinomial"))),
              ("timing", lambda: timing(dev, 6 if args.dry_run else 16, 1, vocab,
                                        few if args.dry_run else SYSTEMS))]
    for name, fn in phases:
        t = time.perf_counter()
        try:
            report[name] = fn()
        except Exception as e:  # noqa: BLE001  (recorded, the next phase still runs)
            report[name] = {"error": f"{type(e).__name__}: {e}"}
        report[f"{name}_s"] = round(time.perf_counter() - t, 1)
        (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        print(name, json.dumps(report[name])[:2000], flush=True)
    left = args.budget_s - (time.perf_counter() - t0)
    if dev == "cuda" and left > 40:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py", "-x",
                            "-k", "seeded or plain"], capture_output=True, text=True, timeout=left)
        report["tests"] = (r.stdout + r.stderr)[-3000:]
        report["tests_rc"] = r.returncode
    else:
        report["tests"] = f"skipped ({left:.0f} s left)"
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "tests"}, indent=1)[:6000])


if __name__ == "__main__":
    main()

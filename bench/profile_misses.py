"""Where the harness time goes in the overhead bench's missed settings, against SpD in the same
setting: a function-level profile (cProfile self time) and a count of the random numbers drawn.

    python bench/profile_misses.py --out results/bench/profile_misses_cpu.md

For each (system, setting) below: the tiny overhead pair (``bench/overhead.py``'s ``build_pair``:
hidden 64, target 2 layers, draft 1 layer random or a copy of the target), 3 prompts x 32 new
tokens, gamma 4, seeds 0-2, torch threads 1; one untimed run, then one under cProfile and a
``TorchFunctionMode`` that counts the exponentials (``Tensor.exponential_``: ``torch.multinomial``'s
calls made in Python: the host's seeded-stream draws of tree children, beams and device draws;
``torch.multinomial`` makes its own inside, one per entry for a single draw) and the entries
``torch.multinomial`` is called on, in a separate run (the counting costs time). Shares are of the profiled ``generate`` calls' total; self time by function (innermost), the
eight largest. Profiling slows Python calls, so shares, not times, compare across systems.
"""

from __future__ import annotations

import argparse
import cProfile
import platform
import pstats
import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import build_pair, make_prompts  # noqa: E402

from mtad.core.engine import Engine  # noqa: E402
from mtad.core.warping import Warping  # noqa: E402
from mtad.run.cli import load_decoder  # noqa: E402

MODES = {"greedy": Warping(0.0), "sample": Warping(1.0, 10, 0.9), "sample_nok": Warping(1.0, 0, 0.9)}
# the settings of results/bench/overhead_tiny_cpu.md with the largest ratios to SpD
CASES = [
    ("sample_nok", "random", ["spd", "specinfer", "mcns", "tree_mtad", "mtad", "mtjd"]),
    ("greedy", "equal", ["spd", "tree_mtad", "mtad", "mjgd"]),
]


class Draws(TorchFunctionMode):
    """Counts random numbers: exponentials made, entries ``torch.multinomial`` is called on."""

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "exponential_":
            self.counts["exponentials"] += args[0].numel()
        elif name == "multinomial":
            self.counts["multinomial_entries"] += args[0].numel()
            self.counts["multinomial_calls"] += 1
        return func(*args, **kwargs)


def _label(key) -> str:
    path, line, fn = key
    if path == "~":
        return fn
    p = Path(path)
    short = str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else p.name
    return f"{fn} ({short}:{line})"


def profile(name: str, mode: str, draft: str, vocab: int) -> dict:
    torch.set_num_threads(1)
    pair = build_pair(vocab, 64, 2, 64, 1, draft)
    knobs = {} if name in ("specinfer", "mcss", "mcns") else {"gamma": 4}
    prompts = make_prompts(3, 32, vocab)

    def run(profiler=None):
        tokens = steps = 0
        decoders = [load_decoder(name, **knobs) for _ in prompts]  # (config parsing: not profiled)
        for i, (ids, dec) in enumerate(zip(prompts, decoders)):
            engine = Engine(pair.target, pair.draft, dec, MODES[mode], pair.vocab_size, ())
            if profiler:
                profiler.enable()
            out = engine.generate(ids, 32, seed=i)
            if profiler:
                profiler.disable()
            tokens += len(out.output_ids)
            steps += out.num_steps
        return tokens, steps

    run()  # warm-up
    prof, draws = cProfile.Profile(), Draws()
    tokens, steps = run(prof)
    with draws:  # a separate run: the counting mode's own cost stays out of the profile
        run()
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values())  # self time of everything profiled
    # inside the models: the causal-LM forward's cumulative time (both models are Qwen2ForCausalLM)
    models = max((v[3] for k, v in st.stats.items() if k[0].endswith("modeling_qwen2.py") and k[2] == "forward"),
                 default=0.0)
    top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:8]
    return {"tokens": tokens, "steps": steps, "total_s": total, "models_s": models,
            "top": [(_label(k), v[2] / total) for k, v in top], **draws.counts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--out", default="results/bench/profile_misses_cpu.md")
    args = ap.parse_args()
    git = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# Where the missed overhead settings spend their time (cProfile self time, random numbers drawn)",
        "",
        f"Command: `python bench/profile_misses.py --vocab {args.vocab} --out {args.out}`; "
        f"git {git}; torch {torch.__version__}; {platform.machine()}, torch threads 1. "
        f"Vocabulary {args.vocab:,}, 3 prompts x 32 new tokens, gamma 4 (SpecInfer, MCNS: their "
        "configs' trees); settings as `bench/overhead.py`'s (*sample_nok*: T 1, top-p 0.9 alone; "
        "*greedy*: T 0). Shares of the profiled total; exponentials and multinomial entries per "
        "emitted token; *outside the models*: the profiled total less the causal-LM forward's "
        "cumulative time (the overhead bench's quantity, under the profiler's per-call cost).",
        "",
    ]
    for mode, draft, systems in CASES:
        lines += [f"## {mode}, {draft} draft", ""]
        lines += ["| system | tokens/step | Python-made exponentials per token | torch.multinomial entries per token "
                  "| profiled ms per token (x SpD) | outside the models, ms per token (x SpD) "
                  "| largest self-time shares (of the whole) |", "|---|---:|---:|---:|---:|---:|---|"]
        base = base_out = None
        for name in systems:
            r = profile(name, mode, draft, args.vocab)
            per = r["total_s"] / r["tokens"]
            out = (r["total_s"] - r["models_s"]) / r["tokens"]
            base, base_out = base or per, base_out or out
            shares = "; ".join(f"{label} {100 * s:.1f}%" for label, s in r["top"][:5])
            lines.append(f"| {name} | {r['tokens'] / r['steps']:.2f} | {r.get('exponentials', 0) / r['tokens']:,.0f} "
                         f"| {r.get('multinomial_entries', 0) / r['tokens']:,.0f} | {1000 * per:.1f} "
                         f"({per / base:.2f}x) | {1000 * out:.1f} ({out / base_out:.2f}x) | {shares} |")
            print(lines[-1], flush=True)
        lines.append("")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

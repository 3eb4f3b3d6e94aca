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

    python bench/profile_misses.py --goals results/bench/overhead_tiny_cpu.json \
        --out results/bench/profile_goal_misses_cpu.md

takes its cases from an overhead run instead: every (setting, system) whose goal against SpD
that run's 95% interval does not settle as met, with SpD in each such setting, at the run's own
sizes, vocabularies, drafts and sampling settings.
"""

from __future__ import annotations

import argparse
import cProfile
import json
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
from speed import parse_decoder  # noqa: E402

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


def profile(name: str, mode: str, draft: str, vocab: int, prompts: int = 3, tokens: int = 32,
            modes: dict | None = None, sizes: tuple = (64, 2, 64, 1), gamma: int = 4) -> dict:
    torch.set_num_threads(1)
    pair = build_pair(vocab, *sizes[:2], *sizes[2:], draft)
    dec_name, knobs = parse_decoder(name, gamma)
    ids_list = make_prompts(prompts, 32, vocab)
    warping = (modes or MODES)[mode]

    def run(profiler=None):
        n_tok = steps = 0
        decoders = [load_decoder(dec_name, **knobs) for _ in ids_list]  # (config parsing: not profiled)
        for i, (ids, dec) in enumerate(zip(ids_list, decoders)):
            engine = Engine(pair.target, pair.draft, dec, warping, pair.vocab_size, ())
            if profiler:
                profiler.enable()
            out = engine.generate(ids, tokens, seed=i)
            if profiler:
                profiler.disable()
            n_tok += len(out.output_ids)
            steps += out.num_steps
        return n_tok, steps

    run()  # warm-up
    prof, draws = cProfile.Profile(), Draws()
    n_tok, steps = run(prof)
    with draws:  # a separate run: the counting mode's own cost stays out of the profile
        run()
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values())  # self time of everything profiled
    # inside the models: the causal-LM forward's cumulative time (both models are Qwen2ForCausalLM)
    models = max((v[3] for k, v in st.stats.items() if k[0].endswith("modeling_qwen2.py") and k[2] == "forward"),
                 default=0.0)
    top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:8]
    return {"tokens": n_tok, "steps": steps, "total_s": total, "models_s": models,
            "top": [(_label(k), v[2] / total) for k, v in top], **draws.counts}


def goal_cases(path: str) -> tuple[list[tuple[int, str, str, list[str]]], dict, dict]:
    """(vocab, mode, draft, systems) for every setting of an overhead run with a goal against SpD
    its 95% interval does not settle as met (SpD first), the run's warpings and sizes."""
    saved = json.loads(Path(path).read_text())
    a = saved["args"]
    report = saved.get("report") or {}
    cases = []
    for setting, v in report.items():
        missed = [g.split("_le_")[0] for g, goal in v["goals"].items()
                  if g.endswith("x_spd") and goal["verdict"] != "met"]
        if missed:
            vocab, draft, mode = setting.split("/")
            cases.append((int(vocab[1:]), mode, draft, ["spd", *missed]))
    modes = {"greedy": Warping(0.0), "sample": Warping(a["temperature"], a["top_k"], a["top_p"]),
             "sample_nok": Warping(a["temperature"], 0, a["top_p"])}
    sizes = (a["hidden"], a["layers"], a["draft_hidden"], a["draft_layers"])
    return cases, modes, dict(sizes=sizes, gamma=a["gamma"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--goals", help="an overhead run's JSON: profile its settings' unmet goals against SpD")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", default="results/bench/profile_misses_cpu.md")
    args = ap.parse_args(argv)
    git = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True).stdout.strip()
    if args.goals:
        cases, modes, extra = goal_cases(args.goals)
        source = (f"cases: every setting of `{args.goals}` with a goal against SpD its 95% interval does "
                  "not settle as met, those systems and SpD, at that run's sizes and sampling settings")
        command = f"python bench/profile_misses.py --goals {args.goals} --out {args.out}"
    else:
        cases = [(args.vocab, mode, draft, systems) for mode, draft, systems in CASES]
        modes, extra = MODES, {}
        source = f"vocabulary {args.vocab:,}; settings as `bench/overhead.py`'s"
        command = f"python bench/profile_misses.py --vocab {args.vocab} --out {args.out}"
    if (args.prompts, args.tokens) != (3, 32):
        command += f" --prompts {args.prompts} --tokens {args.tokens}"
    lines = [
        "# Where the missed overhead settings spend their time (cProfile self time, random numbers drawn)",
        "",
        f"Command: `{command}`; git {git}; torch {torch.__version__}; {platform.machine()}, torch threads 1. "
        f"{args.prompts} prompts x {args.tokens} new tokens, gamma 4 (SpecInfer, MCSS, MCNS: their configs' "
        f"trees); {source} (*sample_nok*: T 1, top-p 0.9 alone; *greedy*: T 0). Shares of the profiled total; "
        "exponentials and multinomial entries per emitted token; *outside the models*: the profiled total "
        "less the causal-LM forward's cumulative time (the overhead bench's quantity, under the profiler's "
        "per-call cost).",
        "",
    ]
    for vocab, mode, draft, systems in cases:
        lines += [f"## V{vocab}/{draft}/{mode}" if args.goals else f"## {mode}, {draft} draft", ""]
        lines += ["| system | tokens/step | Python-made exponentials per token | torch.multinomial entries per token "
                  "| profiled ms per token (x SpD) | outside the models, ms per token (x SpD) "
                  "| largest self-time shares (of the whole) |", "|---|---:|---:|---:|---:|---:|---|"]
        base = base_out = None
        for name in systems:
            r = profile(name, mode, draft, vocab, args.prompts, args.tokens, modes, **extra)
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

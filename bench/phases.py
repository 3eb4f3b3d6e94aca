#!/usr/bin/env python
"""Harness time per step by phase, the models' forward passes left out: where a decoder's time
outside the models goes, on the overhead bench's tiny pair (``bench/overhead.py``).

Each phase is a harness function (drafting's warping and draws, the walk, its rule updates,
SpecTr's rho, the runner's own work around a pass, ...) timed by a wrapper around it: a phase's
time is its own, less the phases it calls and less the forward passes made inside it (forward
hooks on the two models' top-level modules). *rest* is the step's time outside the models less
every phase's: the engine, the step's glue and whatever no phase names. Per step, mean over the
prompts; one thread. The wrappers cost about a microsecond per call, so the shares are what to
read (``bench/overhead.py`` measures the totals without them).

    python bench/phases.py --vocab 32000 --draft equal --systems spd,specinfer --out results/bench/phases.md
    python bench/phases.py --vocab 257 --hidden 16 --draft-hidden 16 --prompts 1 --max-new-tokens 4  # seconds
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import build_pair, make_prompts  # noqa: E402
from speed import parse_decoder  # noqa: E402

from mtad.core import allocator  # noqa: E402
from mtad.core.engine import Engine  # noqa: E402
from mtad.core.warping import Warping  # noqa: E402
from mtad.run.cli import load_decoder  # noqa: E402

#: (module, attribute path, phase): wrapped where callers look it up
PHASES = (
    ("mtad.core.runner", "ModelRunner.forward", "runner around a pass"),
    ("mtad.propose.chain", "draft_chain", "chain drafting"),
    ("mtad.propose.chain", "sample", "chain draws"),
    ("mtad.propose.tree", "draft_tree", "tree drafting"),
    ("mtad.propose.tree", "draft_chains", "tree drafting"),
    ("mtad.propose.tree", "warped_supports", "draft rows warped"),
    ("mtad.propose.tree", "_draw_level", "tree draws"),
    ("mtad.propose.beam", "_beam_sample", "beam drafting"),
    ("mtad.propose.beam", "scoring_probs", "draft rows warped"),
    ("mtad.propose.beam", "_slot_then_row", "beam draws"),
    ("mtad.propose.beam", "_slot_then_row_host", "beam draws"),
    ("mtad.verify.chain", "verify_chain", "chain verification"),
    ("mtad.verify.multidraft", "MultiDraft.verify", "multi-draft verification"),
    ("mtad.verify.multidraft", "_walk", "walk"),
    ("mtad.verify.multidraft", "compress_support", "walk: supports merged"),
    ("mtad.verify.multidraft", "_lazy_pick", "walk: outcome drawn"),
    ("mtad.verify.multidraft", "_Stages._catch_up", "walk: rule updates"),
    ("mtad.verify.multidraft", "spectr_rho", "walk: SpecTr rho"),
    ("mtad.verify.multidraft", "spectr_rho_select", "walk: SpecTr rho"),
    ("mtad.verify.multidraft", "_draw_support", "walk: correction or bonus"),
    ("mtad.core.sampling", "Rows.__getitem__", "target rows warped (lazily)"),
    ("mtad.verify.score", "Scores._warp_rows", "target rows warped (lazily)"),
    ("mtad.verify.score", "Scores._warped_row", "target rows warped (lazily)"),
    ("mtad.verify.threshold", "score", "target pass's scores"),
    ("mtad.verify.chain", "score", "target pass's scores"),
    ("mtad.verify.threshold", "TreeThreshold.verify", "threshold verification"),
    ("mtad.verify.threshold", "JointThreshold.verify", "threshold verification"),
    ("mtad.core.runner", "ModelRunner.end", "runner after a step (cache kept)"),
)


class PhaseClock:
    """Wrappers around ``PHASES`` and forward hooks on the models: each phase's own time."""

    def __init__(self, models):
        self.own: dict[str, float] = defaultdict(float)
        self.forward = 0.0
        self._stack: list[float] = []  # time spent in wrapped callees / passes, per open frame
        self._labels: list[str] = []  # the open phases, innermost last
        self._undo = []
        self._t0: list[float] = []
        for mod_name, path, label in PHASES:
            mod = importlib.import_module(mod_name)
            *outer, attr = path.split(".")
            owner = mod
            for part in outer:
                owner = getattr(owner, part)
            if not hasattr(owner, attr):
                continue
            fn = getattr(owner, attr)
            self._undo.append((owner, attr, fn))
            setattr(owner, attr, self._wrap(fn, label))
        self._hooks = [h for m in models for h in (m.register_forward_pre_hook(self._pre),
                                                   m.register_forward_hook(self._post))]

    def _wrap(self, fn, label):
        def timed(*args, **kwargs):
            self._stack.append(0.0)
            self._labels.append(label)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                self._labels.pop()
                inner = self._stack.pop()
                self.own[label] += dt - inner
                if self._stack:
                    self._stack[-1] += dt
        return timed

    def _pre(self, module, args):
        self._stack.append(0.0)
        self._t0.append(time.perf_counter())

    def _post(self, module, args, out):
        dt = time.perf_counter() - self._t0.pop()
        self._stack.pop()
        self.forward += dt
        if self._stack:
            self._stack[-1] += dt

    def phase(self) -> str:
        """The innermost open phase (``rest`` outside every phase)."""
        return self._labels[-1] if self._labels else "rest"

    def in_pass(self) -> bool:
        """Whether a model's forward pass is open."""
        return bool(self._t0)

    def reset(self):
        self.own.clear()
        self.forward = 0.0

    def close(self):
        for owner, attr, fn in self._undo:
            setattr(owner, attr, fn)
        for h in self._hooks:
            h.remove()


def profile(args) -> str:
    allocator.tune()
    torch.set_num_threads(args.threads)
    pair = build_pair(args.vocab, args.hidden, args.layers, args.draft_hidden, args.draft_layers, args.draft)
    warping = Warping(args.temperature, args.top_k, args.top_p)
    prompts = make_prompts(args.prompts, args.prompt_length, args.vocab, args.prompt_seed)
    systems = args.systems.split(",")
    decs = {s: load_decoder(*parse_decoder(s, args.gamma)[:1], **parse_decoder(s, args.gamma)[1]) for s in systems}
    clock = PhaseClock([pair.target, pair.draft])
    results = {}
    try:
        for s in systems:  # warm-up: lazy imports, caches
            Engine(pair.target, pair.draft, decs[s], warping, pair.vocab_size, ()).generate(prompts[0], 4, seed=0)
        for s in systems:
            clock.reset()
            wall = tokens = steps = 0
            rows: dict[str, float] = {}
            for i, ids in enumerate(prompts):
                t0 = time.perf_counter()
                res = Engine(pair.target, pair.draft, decs[s], warping, pair.vocab_size, ()).generate(
                    ids, args.max_new_tokens, seed=1000 * i)
                wall += time.perf_counter() - t0
                tokens, steps = tokens + len(res.output_ids), steps + res.num_steps
            outside = wall - clock.forward
            results[s] = dict(steps=steps, tokens=tokens, outside=outside, own=dict(clock.own))
            if args.rows:  # the same generations again, their row operations timed per phase
                from row_ops import RowOpClock

                for i, ids in enumerate(prompts):
                    ops = RowOpClock(args.vocab, clock.in_pass, clock.phase)
                    with ops:
                        again = Engine(pair.target, pair.draft, decs[s], warping, pair.vocab_size, ()).generate(
                            ids, args.max_new_tokens, seed=1000 * i)
                    for k, v in ops.by.items():
                        rows[k] = rows.get(k, 0.0) + v
                    steps -= again.num_steps
                if steps:
                    raise SystemExit(f"{s}: the run with its row operations timed made other steps than the "
                                     "plain one; the split would compare different work")
                results[s]["rows"] = rows
    finally:
        clock.close()
    mode = ("greedy" if args.temperature == 0 else f"T {args.temperature:g}"
            + (f", top-k {args.top_k}" if args.top_k else "") + (f", top-p {args.top_p:g}" if args.top_p < 1 else ""))
    labels = list(dict.fromkeys(label for _, _, label in PHASES))
    lines = [f"## Harness time per step by phase: V{args.vocab}, {args.draft} draft, {mode} (`bench/phases.py`)", "",
             (__doc__ or "").split("\n\n")[1].replace("\n", " "), "",
             f"Command: `{command('phases.py', args.argv)}`; {args.prompts} prompts x "
             f"{args.max_new_tokens} tokens, prompt seed {args.prompt_seed}, gamma {args.gamma}, torch threads "
             f"{torch.get_num_threads()}. Milliseconds per step (share of the step's time outside the models).",
             _machine(), "",
             "| phase | " + " | ".join(systems) + " |", "| --- |" + " ---: |" * len(systems)]
    rows = [("outside the models, all", {s: r["outside"] for s, r in results.items()})]
    rows += [(label, {s: r["own"].get(label, 0.0) for s, r in results.items()}) for label in labels]
    rows.append(("rest", {s: r["outside"] - sum(r["own"].values()) for s, r in results.items()}))
    for label, vals in rows:
        if label not in ("outside the models, all", "rest") and not any(vals[s] > 0 for s in systems):
            continue
        cells = [f"{1e3 * vals[s] / results[s]['steps']:.3f} ({vals[s] / results[s]['outside']:.0%})" for s in systems]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| tokens per step | " + " | ".join(f"{results[s]['tokens'] / results[s]['steps']:.2f}"
                                                  for s in systems) + " |")
    lines.append("| outside the models, ms per token | " + " | ".join(
        f"{1e3 * results[s]['outside'] / results[s]['tokens']:.3f}" for s in systems) + " |")
    if args.rows:
        lines += ["", "### Each phase less its operations on vocabulary rows (the glue), and those operations", "",
                  ROWS_NOTE, "",
                  "| phase | " + " | ".join(systems) + " |", "| --- |" + " ---: |" * len(systems)]
        for label, vals in rows:
            if label == "outside the models, all":
                glue = {s: vals[s] - sum(results[s]["rows"].values()) for s in systems}
                ops = {s: sum(results[s]["rows"].values()) for s in systems}
            else:
                glue = {s: vals[s] - results[s]["rows"].get(label, 0.0) for s in systems}
                ops = {s: results[s]["rows"].get(label, 0.0) for s in systems}
            if label not in ("outside the models, all", "rest") and not any(vals[s] > 0 for s in systems):
                continue
            cells = [f"{1e3 * glue[s] / results[s]['steps']:.3f} + {1e3 * ops[s] / results[s]['steps']:.3f}"
                     for s in systems]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


ROWS_NOTE = ("With `--rows` every prompt runs a second time, with the same seed, under `bench/row_ops.py`'s "
             "`RowOpClock`: each operation outside the models on at least half a vocabulary row of entries is "
             "timed and charged to the innermost open phase (*rest* outside every phase). A cell is the phase's "
             "own time in the plain run less its row operations' time in the second run, then + those operations' "
             "time (ms per step): glue + row ops. The wrappers' and the clock's own costs fall in the glue.")


def command(script: str, argv: list[str]) -> str:
    """The command a record names, ``python bench/SCRIPT ARGS``, with every absolute path argument
    (``PATH`` or ``--opt=PATH``) as ``mtad.core.io.shown_path`` shows it (relative, or its name):
    a record names no directory of the machine that made it."""
    from mtad.core.io import shown_path

    def shown(arg: str) -> str:
        opt, eq, path = arg.rpartition("=") if arg.startswith("--") and "=" in arg else ("", "", arg)
        return f"{opt}{eq}{shown_path(path)}" if Path(path).is_absolute() else arg

    return " ".join(["python", f"bench/{script}", *map(shown, argv)])


def publish(text: str, out: str | None) -> str:
    """Write a bench's markdown to ``out`` (if given) and print it."""
    if out:
        Path(out).write_text(text)
    print(text)
    return text


def _machine() -> str:
    """The machine and commit a table was made on (``mtad.core.machine.cpu_info``)."""
    import subprocess

    from mtad.core.machine import cpu_info

    cpu = cpu_info()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=Path(__file__).resolve().parent,
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "?"
    return (f"Machine: {cpu.get('model')}, {cpu.get('usable_cpus')} usable CPUs, ISA {' '.join(cpu.get('isa') or [])}, "
            f"native bfloat16: {'yes' if cpu.get('native_bf16') else 'no'}; torch {torch.__version__}; git {commit}.")


def add_run_arguments(ap: argparse.ArgumentParser, vocab: int, draft: str, prompts: int) -> None:
    """The tiny pair, prompts and warping options ``bench/phases.py`` and ``bench/draw_paths.py`` share."""
    ap.add_argument("--vocab", type=int, default=vocab)
    ap.add_argument("--draft", default=draft, choices=("random", "equal"))
    ap.add_argument("--systems", default="spd,specinfer,mcss,spectr,beam_specinfer,tree_mtad")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--draft-hidden", type=int, default=64)
    ap.add_argument("--draft-layers", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=prompts)
    ap.add_argument("--prompt-length", type=int, default=32)
    ap.add_argument("--prompt-seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="write the table here (markdown)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(ap, vocab=32000, draft="equal", prompts=3)
    ap.add_argument("--rows", action="store_true",
                    help="split each phase into its operations on vocabulary rows and the rest (a second run)")
    args = ap.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    publish(profile(args), args.out)


if __name__ == "__main__":
    main()

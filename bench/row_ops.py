#!/usr/bin/env python
"""Harness time per step split in two: the operations on vocabulary rows, and the rest. What a
faster row kernel (a fused softmax and draw, say) could buy each decoder against SpD.

Each system runs every prompt twice, interleaved (systems rotated per prompt), with the same
seeds, so both runs make the same steps and tokens (checked):

- *plain*: the step's time outside the models, as ``bench/overhead.py`` measures it (wall time
  less the two models' forward passes, timed by forward hooks on their top-level modules);
- *timed*: the same generation under a dispatch mode (``RowOpClock``) that times every tensor
  operation outside the models with an argument or result of at least half a vocabulary row of
  entries (logits, warped rows, their float64 copies and cumulative sums, rows cut into blocks,
  nuclei, gathers and concatenations of rows), views left out (they read nothing). Only
  the operation's own call is timed, not the mode's bookkeeping around it.

*row ops* is the timed run's total of those operations; *rest* is the plain run's time outside
the models less it: the engine, the decoders' Python, the small tensors, the runner's masks and
caches, numpy's searches. An operation that only reads a few entries of a row (a gather of the
drafted tokens' masses) counts as a row op at its own, small, cost; numpy work on a row (the
host searches of sorted cumulative sums, ``O(log V)`` each) counts in the rest.

The ratio to SpD's per emitted token moves monotonically, as the row operations get faster for
every decoder alike, from today's (*all*) to the rest's alone (*rest*): if the rest alone is
above the goal (1.5x), no faster row kernel meets the goal in that cell; only less of the rest
does. Where *rest* is within the goal and *all* is not, a faster row kernel could close the cell.

    python bench/row_ops.py --vocab 32000 --draft equal --systems spd,tree_mtad --out results/bench/row_ops.md
    python bench/row_ops.py --vocab 257 --hidden 16 --draft-hidden 16 --prompts 1 --max-new-tokens 4  # seconds
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import build_pair, make_prompts  # noqa: E402
from phases import _machine, add_run_arguments, command, publish  # noqa: E402
from speed import parse_decoder  # noqa: E402

from mtad.core import allocator  # noqa: E402
from mtad.core.engine import Engine  # noqa: E402
from mtad.core.warping import Warping  # noqa: E402
from mtad.run.cli import load_decoder  # noqa: E402

GOAL = 1.5  # the goals table's: each decoder within 1.5x SpD's harness time per emitted token


class ForwardClock:
    """Forward hooks on the models' top-level modules: the time inside them, and whether a pass
    is open (so that the row-op clock leaves the models' own operations out)."""

    def __init__(self, models):
        self.forward = 0.0
        self.depth = 0
        self._t0: list[float] = []
        self._hooks = [h for m in models for h in (m.register_forward_pre_hook(self._pre),
                                                   m.register_forward_hook(self._post))]

    def _pre(self, module, args):
        self.depth += 1
        self._t0.append(time.perf_counter())

    def _post(self, module, args, out):
        self.forward += time.perf_counter() - self._t0.pop()
        self.depth -= 1

    def close(self):
        for h in self._hooks:
            h.remove()


class RowOpClock(TorchDispatchMode):
    """Times each operation outside the models (``inside()`` false) with an argument or a result
    of at least half a row of ``vocab`` entries: whole rows, a row cut into blocks or cut short (a
    block-sum or block-max pass over a row's first ``BLOCK * (V // BLOCK)`` entries), a nucleus;
    views are not timed (``OpOverload.is_view``): they read no data. ``where()`` (optional) names
    the phase an operation runs in (``bench/phases.py``): ``by`` sums the time per phase."""

    def __init__(self, vocab: int, inside: Callable[[], bool], where: Callable[[], str] | None = None):
        super().__init__()
        self.vocab, self.inside, self.where = vocab, inside, where
        self.seconds = 0.0
        self.calls = 0
        self.by: dict[str, float] = defaultdict(float)

    def _rows(self, x) -> bool:
        return isinstance(x, torch.Tensor) and 2 * x.numel() >= self.vocab

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.is_view or self.inside():
            return func(*args, **kwargs)
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        dt = time.perf_counter() - t0
        if any(map(self._rows, tree_leaves((args, kwargs)))) or any(map(self._rows, tree_leaves(out))):
            self.seconds += dt
            self.calls += 1
            if self.where is not None:
                self.by[self.where()] += dt
        return out


DESCRIPTION = (
    "Each system runs every prompt twice, interleaved (systems rotated per prompt), with the same seeds, so both runs "
    "make the same steps and tokens (checked). The *plain* run gives the time outside the models per step, as "
    "`bench/overhead.py` measures it (wall time less the two models' forward passes, timed by forward hooks on their "
    "top-level modules). The *timed* run repeats it under a dispatch mode that times every tensor operation outside "
    "the models with an argument or result of at least half a vocabulary row of entries (logits, warped rows, their "
    "float64 copies and cumulative sums, rows cut into blocks, nuclei, gathers and concatenations of rows; outside "
    "the models nothing else is that large), views left out; only "
    "each operation's own call is timed. *Row ops* is that total; the *rest* is the plain run's time outside the "
    "models less it: the engine, the decoders' Python, small tensors, the runner's masks and caches, numpy's searches "
    "of cumulative sums. As the row operations get faster for every decoder alike, a decoder's ratio to SpD's per "
    "emitted token moves monotonically from today's (*all*) to the rest's alone (*rest*): where the rest alone is "
    "above the goal, no faster row kernel (a fused softmax and draw, say) meets it in that cell; only less of the rest "
    "does. Point estimates of one run each (no interval): read them against the goals table's verdicts.")

#: the goals table's modes (``bench/verdicts.py``'s names): temperature, top-k, top-p
MODES = {"greedy": (0.0, 0, 1.0), "topk10": (1.0, 10, 1.0), "plain": (1.0, 0, 1.0), "topp0.9": (1.0, 0, 0.9)}


def measure(args, vocab: int, draft: str, mode: str) -> dict:
    """One setting: per system, the plain run's time outside the models and the timed run's row
    operations, summed over the prompts, with steps and tokens."""
    pair = build_pair(vocab, args.hidden, args.layers, args.draft_hidden, args.draft_layers, draft)
    warping = Warping(*MODES[mode])
    prompts = make_prompts(args.prompts, args.prompt_length, vocab, args.prompt_seed)
    systems = args.systems.split(",")
    decs = {}
    for s in systems:
        name, kw = parse_decoder(s, args.gamma)[:2]
        decs[s] = load_decoder(name, **kw)
    fwd = ForwardClock([pair.target, pair.draft])
    acc = {s: dict(outside=0.0, rows=0.0, calls=0, steps=0, tokens=0) for s in systems}

    def run(s, ids, seed):
        return Engine(pair.target, pair.draft, decs[s], warping, pair.vocab_size, ()).generate(
            ids, args.max_new_tokens, seed=seed)

    try:
        for s in systems:  # warm-up: lazy imports, caches
            run(s, prompts[0], 0)
        for i, ids in enumerate(prompts):
            order = systems[i % len(systems):] + systems[: i % len(systems)]
            for s in order:
                f0, t0 = fwd.forward, time.perf_counter()
                plain = run(s, ids, 1000 * i)
                wall, f1 = time.perf_counter() - t0, fwd.forward
                clock = RowOpClock(vocab, lambda: fwd.depth > 0)
                with clock:
                    timed = run(s, ids, 1000 * i)
                if (timed.output_ids, timed.num_steps) != (plain.output_ids, plain.num_steps):
                    raise SystemExit(f"{s}, prompt {i}: the timed run made other tokens or steps than the "
                                     "plain one; the split would compare different work")
                a = acc[s]
                a["outside"] += wall - (f1 - f0)
                a["rows"] += clock.seconds
                a["calls"] += clock.calls
                a["steps"] += plain.num_steps
                a["tokens"] += len(plain.output_ids)
    finally:
        fwd.close()
    return acc


def _cell(acc: dict, s: str) -> dict:
    """One system's numbers in one setting, per step and per emitted token (ms)."""
    a = acc[s]
    rest = a["outside"] - a["rows"]
    return dict(steps=a["steps"], tokens=a["tokens"], tokens_per_step=a["tokens"] / a["steps"],
                outside_step=1e3 * a["outside"] / a["steps"], rows_step=1e3 * a["rows"] / a["steps"],
                rest_step=1e3 * rest / a["steps"], outside_token=1e3 * a["outside"] / a["tokens"],
                rest_token=1e3 * rest / a["tokens"], row_calls_step=a["calls"] / a["steps"])


def verdict(all_x: float, rest_x: float, goal: float = GOAL) -> str:
    """What faster row operations could do for a cell, from its ratios to SpD per token today
    (``all_x``) and with the row operations free for every decoder (``rest_x``)."""
    if all_x <= goal:
        return "within the goal"
    if rest_x <= goal:
        return "faster row kernels could close it"
    return "the rest alone misses: no row kernel closes it"


def render(args, results: dict) -> str:
    """The record: one row per setting and decoder (SpD first, the reference of the ratios)."""
    systems = args.systems.split(",")
    lines = ["## Harness time split into vocabulary-row operations and the rest (`bench/row_ops.py`)", "",
             DESCRIPTION, "",
             f"Command: `{command('row_ops.py', args.argv)}`; {args.prompts} prompts x {args.max_new_tokens} "
             f"tokens, prompt seed {args.prompt_seed}, gamma {args.gamma}, torch threads {torch.get_num_threads()}; "
             "modes: " + ", ".join(f"{m} = T {t:g}, top-k {k}, top-p {p:g}" for m, (t, k, p) in MODES.items()
                                   if m in args.modes.split(",")) + ".",
             _machine(), "",
             "ms per step outside the models (plain run), of it in row operations (timed run; their share) and the "
             "rest; per emitted token, today's ratio to SpD's (*all*) and the rest's alone (*rest*: every decoder's "
             f"row operations free); the verdict against the goal ({GOAL}x).", "",
             "| setting | system | tokens/step | outside ms/step | row ops ms/step | row op calls/step | rest ms/step "
             "| all x SpD | rest x SpD | verdict |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for setting, acc in results.items():
        spd = _cell(acc, "spd")
        for s in systems:
            c = _cell(acc, s)
            all_x, rest_x = c["outside_token"] / spd["outside_token"], c["rest_token"] / spd["rest_token"]
            lines.append(f"| {setting} | {s} | {c['tokens_per_step']:.2f} | {c['outside_step']:.3f} | "
                         f"{c['rows_step']:.3f} ({c['rows_step'] / c['outside_step']:.0%}) | "
                         f"{c['row_calls_step']:.1f} | {c['rest_step']:.3f} | {all_x:.2f} | {rest_x:.2f} | "
                         f"{'reference' if s == 'spd' else verdict(all_x, rest_x)} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(ap, vocab=32000, draft="equal", prompts=3)
    ap.add_argument("--vocabs", help="comma-separated vocabularies (default: --vocab)")
    ap.add_argument("--drafts", help="comma-separated drafts, random and / or equal (default: --draft)")
    ap.add_argument("--modes", default="plain", help="comma-separated, of " + ", ".join(MODES))
    ap.add_argument("--json", help="write the numbers here too")
    args = ap.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    systems = args.systems.split(",")
    if systems[0] != "spd":
        ap.error("--systems: SpD is the reference of every ratio; name spd first (e.g. spd,tree_mtad)")
    bad = [m for m in args.modes.split(",") if m not in MODES]
    if bad:
        ap.error(f"--modes: unknown {', '.join(bad)}; use some of {', '.join(MODES)}")
    vocabs = [int(v) for v in (args.vocabs or str(args.vocab)).split(",")]
    drafts = (args.drafts or args.draft).split(",")
    allocator.tune()
    torch.set_num_threads(args.threads)
    results = {}
    for vocab in vocabs:
        for draft in drafts:
            for mode in args.modes.split(","):
                results[f"V{vocab}/{draft}/{mode}"] = measure(args, vocab, draft, mode)
                print(f"[V{vocab}/{draft}/{mode}] done", file=sys.stderr, flush=True)
    text = publish(render(args, results), args.out)
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({k: {s: _cell(acc, s) for s in acc} for k, acc in results.items()},
                                              indent=1) + "\n")
    return text


if __name__ == "__main__":
    main()

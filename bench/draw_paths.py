#!/usr/bin/env python
"""Where block-sum draws pay: each site of ``mtad.core.cdf_blocks.SITES`` on and off, in one process.

The block sums (``mtad.core.cdf_blocks``) give the inverse-CDF draw's index without the row's
whole float64 cumulative sum: the same tokens, bit for bit, so a site can use them or not and
only the harness's time moves. Timed alone they are faster; in a run the caches are cold after
each forward pass, so what a site gains there is measured there. One more switch is timed the
same way: ``beam_rows``, a beam walk's q reading the rows its slot-then-row draws warped instead
of warping them again (``mtad.propose.beam.REUSE_DRAWN_ROWS``), and ``host_beams``, a beam's
bookkeeping and its slot-then-row reads on the host (``mtad.propose.beam.HOST_BEAMS``). For each site, every decoder
runs each prompt twice in one process, once with the site on and once with every site off
(the order alternating by prompt), on the overhead bench's tiny pair (``bench/overhead.py``),
at plain temperature by default. Each cell: the geometric mean over prompts of on / off of the
harness time per emitted token (wall less the models' forward passes), with its range; both runs
must emit the same tokens (checked).

    python bench/draw_paths.py --vocab 151936 --draft random --out results/bench/draw_paths_cpu.md
    python bench/draw_paths.py --vocab 70000 --hidden 16 --draft-hidden 16 --prompts 2 --max-new-tokens 4  # seconds
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import build_pair, make_prompts, measure  # noqa: E402
from phases import _machine, add_run_arguments, command, publish  # noqa: E402
from speed import ForwardTimer, parse_decoder  # noqa: E402

from mtad.core import allocator, cdf_blocks  # noqa: E402
from mtad.core.warping import Warping  # noqa: E402
from mtad.propose import beam  # noqa: E402
from mtad.run.cli import load_decoder  # noqa: E402

#: what can be switched: the block-sum sites (``cdf_blocks.SITES``), ``beam_rows``, a beam walk's
#: q reading the rows its draws warped (``mtad.propose.beam.REUSE_DRAWN_ROWS``), and ``host_beams``,
#: a beam's bookkeeping on the host (``mtad.propose.beam.HOST_BEAMS``): the same tokens either way
SITES = (*cdf_blocks.SITES, "beam_rows", "host_beams")


def _state() -> dict[str, bool]:
    return {**cdf_blocks.SITES, "beam_rows": beam.REUSE_DRAWN_ROWS, "host_beams": beam.HOST_BEAMS}


def _set(state: dict[str, bool]) -> None:
    cdf_blocks.SITES.update({k: v for k, v in state.items() if k in cdf_blocks.SITES})
    beam.REUSE_DRAWN_ROWS = state["beam_rows"]
    beam.HOST_BEAMS = state["host_beams"]


def run(args) -> str:
    torch.set_num_threads(args.threads)
    systems = args.systems.split(",")
    sites = args.sites.split(",")
    unknown = [s for s in sites if s not in SITES]
    if unknown:
        raise SystemExit(f"--sites: unknown {unknown}; choose among {list(SITES)}")
    pair = build_pair(args.vocab, args.hidden, args.layers, args.draft_hidden, args.draft_layers, args.draft)
    timers = {"target": ForwardTimer(pair.target), "draft": ForwardTimer(pair.draft)}
    w = Warping(args.temperature, args.top_k, args.top_p)
    decs = {s: load_decoder(*parse_decoder(s, args.gamma)[:1], **parse_decoder(s, args.gamma)[1]) for s in systems}
    prompts = make_prompts(args.prompts, args.prompt_length, args.vocab, args.prompt_seed)
    default = _state()
    for s in systems:  # warm-up
        measure(s, pair, timers, decs[s], prompts[0], 4, w, args.gamma, 0)
    ratios: dict[tuple[str, str], list[float]] = {}
    try:
        for site in sites:
            for pi, ids in enumerate(prompts):
                for s in systems:
                    got, toks = {}, {}
                    for on in ((True, False) if pi % 2 == 0 else (False, True)):
                        _set({k: k == site and on for k in SITES})
                        r = measure(s, pair, timers, decs[s], ids, args.max_new_tokens, w, args.gamma, 1000 * pi)
                        got[on], toks[on] = r["overhead"] / r["tokens"], r["ids"]
                    if toks[True] != toks[False]:
                        raise SystemExit(f"{s}: the site {site!r} changed the tokens: it is not an exact "
                                         "change of the harness's work")
                    ratios.setdefault((site, s), []).append(got[True] / got[False])
            print(f"[{site}] done", file=sys.stderr, flush=True)
    finally:
        _set(default)
    mode = f"T {args.temperature:g}" + (f", top-k {args.top_k}" if args.top_k else "") + (
        f", top-p {args.top_p:g}" if args.top_p < 1 else "" if args.top_k else ", plain")
    lines = [f"## Block-sum draws by site, on / off in one process: V{args.vocab}, {args.draft} draft, {mode} "
             "(`bench/draw_paths.py`)", "",
             " ".join((__doc__ or "").split("\n\n")[1].split()), "",
             f"Command: `{command('draw_paths.py', args.argv)}`; {args.prompts} prompts x "
             f"{args.max_new_tokens} tokens, prompt seed {args.prompt_seed}, gamma {args.gamma}, torch threads "
             f"{torch.get_num_threads()}; the sites' defaults: "
             + ", ".join(f"{k} {'on' if v else 'off'}" for k, v in default.items()) + ".",
             _machine(), "",
             "| site | " + " | ".join(systems) + " |", "| --- |" + " ---: |" * len(systems)]
    for site in sites:
        cells = []
        for s in systems:
            r = ratios[(site, s)]
            g = math.exp(sum(math.log(x) for x in r) / len(r))
            cells.append(f"{g:.3f} [{min(r):.2f}, {max(r):.2f}]")
        lines.append(f"| {site} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(ap, vocab=151936, draft="random", prompts=4)
    ap.add_argument("--sites", default=",".join(SITES))
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    allocator.tune()  # as the entry points run (mtad.core.allocator)
    publish(run(args), args.out)


if __name__ == "__main__":
    main()

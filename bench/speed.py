#!/usr/bin/env python
"""Side-by-side speed benchmark: our decoders vs Hugging Face ``generate`` (plain and assisted).

One process, one model pair, the same prompts; runs are interleaved (prompt-major,
decoders in rotating order per repeat) so that machine noise hits every decoder alike.
Prints tokens/s (median over repeats, with min-max spread), block efficiency, ratios to
HF assisted generation and to our autoregressive decoder, and the share of wall time
spent inside model forward passes (measured the same way for every method: forward
hooks on the two models); the rest is harness overhead. With greedy decoding it also
checks that our SpD emits exactly HF's tokens.

    python bench/speed.py                                  # offline pair, HumanEval + CNN/DM
    python bench/speed.py model=tiny_random --n-prompts 2  # seconds, pipeline check
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtad.cli import compose_config, load_decoder  # noqa: E402
from mtad.engine import Engine  # noqa: E402
from mtad.records import provenance, write_json_atomic  # noqa: E402
from mtad.warping import Warping  # noqa: E402


class ForwardTimer:
    """Accumulates wall time and call count of a model's top-level forward via hooks."""

    def __init__(self, model):
        self.model, self.total, self.calls, self._t0 = model, 0.0, 0, None
        self._h = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]

    def _pre(self, *_):
        self._t0 = time.perf_counter()

    def _post(self, *_):
        self.total += time.perf_counter() - self._t0
        self.calls += 1

    def snapshot(self):
        return self.total, self.calls


def load_prompts(task_name: str, n: int, tokenizer) -> list[list[int]]:
    cfg = compose_config([f"task={task_name}"], drop=("model", "logger"))
    task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
    task_cfg.pop("scorer", None)
    task = instantiate(task_cfg)
    return [task.render(ex, tokenizer, 0, []) for ex in task.load()[:n]]


def hf_generate(pair, ids, max_new, warping: Warping, assistant: bool, gamma: int, seed: int):
    kwargs = dict(max_new_tokens=max_new, min_new_tokens=0, pad_token_id=pair.tokenizer.pad_token_id
                  if getattr(pair.tokenizer, "pad_token_id", None) is not None else 0)
    if warping.greedy:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=True, temperature=warping.temperature, top_k=warping.top_k or None,
                      top_p=warping.top_p)
    if assistant:
        kwargs.update(assistant_model=pair.draft)
        pair.draft.generation_config.num_assistant_tokens = gamma
        pair.draft.generation_config.num_assistant_tokens_schedule = "constant"
        pair.draft.generation_config.assistant_confidence_threshold = 0.0
    torch.manual_seed(seed)
    inp = torch.tensor([ids], device=pair.target.device)
    t0 = time.perf_counter()
    out = pair.target.generate(inp, attention_mask=torch.ones_like(inp), **kwargs)
    wall = time.perf_counter() - t0
    return out[0, len(ids):].tolist(), wall


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the model, e.g. model=tiny_random")
    ap.add_argument("--tasks", default="humaneval,cnn_dailymail")
    ap.add_argument("--n-prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="greedy,sample")
    ap.add_argument("--decoders", default="hf_ar,ar,hf_assisted,spd,specinfer,mcss,spectr,mtad,tree_mtad")
    ap.add_argument("--out", default="results/bench/speed.json")
    ap.add_argument("--report", help="only print the report of an earlier run's JSON")
    args = ap.parse_args(argv)
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        print_report(summarize(saved["rows"], saved["args"]["decoders"].split(",")), saved["rows"])
        return

    cfg = compose_config(args.overrides, drop=("task", "logger"))
    pair = instantiate(cfg.model)
    tok = pair.tokenizer
    timers = {"target": ForwardTimer(pair.target), "draft": ForwardTimer(pair.draft)}
    prompts = {t: load_prompts(t, args.n_prompts, tok) for t in args.tasks.split(",")}
    names = args.decoders.split(",")
    modes = {"greedy": Warping(0.0), "sample": Warping(float(cfg.temperature), int(cfg.top_k), float(cfg.top_p))}
    engines = {}
    for n in names:
        if n in ("hf_ar", "hf_assisted"):
            continue
        dec = load_decoder("multinomial" if n == "ar" else n, gamma=args.gamma)
        engines[n] = dec

    rows = []  # one per (task, mode, decoder, prompt, repeat)
    # warm-up: one short run of each method
    first = next(iter(prompts.values()))[0]
    for n in names:
        for mname, w in modes.items():
            if mname in args.modes:
                _run(n, pair, engines, first, 4, w, args.gamma, 0)
    for task, plist in prompts.items():
        for mname in args.modes.split(","):
            w = modes[mname]
            for pi, ids in enumerate(plist):
                for rep in range(args.repeats):
                    order = names[rep % len(names):] + names[: rep % len(names)]
                    for n in order:
                        f0 = {k: t.snapshot() for k, t in timers.items()}
                        out, wall = _run(n, pair, engines, ids, args.max_new_tokens, w, args.gamma, 1000 * pi + rep)
                        fwd = sum(t.snapshot()[0] - f0[k][0] for k, t in timers.items())
                        tcalls = timers["target"].snapshot()[1] - f0["target"][1]
                        rows.append(dict(task=task, mode=mname, decoder=n, prompt=pi, repeat=rep,
                                         tokens=len(out), wall=wall, forward=fwd, target_calls=tcalls,
                                         ids=out))
                    print(f"[{task}/{mname}] prompt {pi} repeat {rep} done", file=sys.stderr, flush=True)

    report = summarize(rows, names)
    print_report(report, rows)
    write_json_atomic(args.out, {"report": report, "rows": rows, "args": vars(args),
                                 "model": {"target": pair.target_id, "draft": pair.draft_id, **pair.info},
                                 "provenance": provenance()})
    print(f"\nwritten: {args.out}")


def _run(name, pair, engines, ids, max_new, warping, gamma, seed):
    if name == "hf_ar":
        return hf_generate(pair, ids, max_new, warping, False, gamma, seed)
    if name == "hf_assisted":
        return hf_generate(pair, ids, max_new, warping, True, gamma, seed)
    eng = Engine(pair.target, pair.draft, engines[name], warping, pair.vocab_size, pair.eos_token_ids)
    res = eng.generate(ids, max_new, seed=seed)
    return res.output_ids, res.wall_time + res.prefill_time


def summarize(rows, names):
    report = {}
    for key in sorted({(r["task"], r["mode"]) for r in rows}):
        sub = [r for r in rows if (r["task"], r["mode"]) == key]
        per = {}
        for n in names:
            rs = [r for r in sub if r["decoder"] == n]
            if not rs:
                continue
            # tokens/s per repeat, pooled over prompts
            reps = sorted({r["repeat"] for r in rs})
            tps = [sum(r["tokens"] for r in rs if r["repeat"] == k) / sum(r["wall"] for r in rs if r["repeat"] == k)
                   for k in reps]
            toks = sum(r["tokens"] for r in rs)
            # decoding target passes: ours prefill in a separate pass; HF's first pass both
            # prefills and emits (plain) or verifies the first draft (assisted)
            passes = sum(r["target_calls"] - (0 if n.startswith("hf_") else 1) for r in rs)
            per[n] = dict(tokens_per_s=statistics.median(tps), spread=(min(tps), max(tps)),
                          block_efficiency=toks / max(passes, 1),
                          forward_share=sum(r["forward"] for r in rs) / sum(r["wall"] for r in rs))
        for d in per.values():
            d["vs_hf_assisted"] = d["tokens_per_s"] / per["hf_assisted"]["tokens_per_s"] if "hf_assisted" in per else None
            d["vs_ar"] = d["tokens_per_s"] / per["ar"]["tokens_per_s"] if "ar" in per else None
        if key[1] == "greedy" and "spd" in per and "hf_assisted" in per:
            pairs = [(a["ids"], b["ids"]) for a in sub if a["decoder"] == "spd"
                     for b in sub if b["decoder"] == "hf_assisted" and b["prompt"] == a["prompt"]
                     and b["repeat"] == a["repeat"]]
            per["spd"]["equals_hf_greedy"] = all(x == y for x, y in pairs)
            per["spd"]["equal_prompts"] = f"{sum(x == y for x, y in pairs)}/{len(pairs)}"
        report["/".join(key)] = per
    return report


def print_report(report, rows):
    for key, per in report.items():
        print(f"\n## {key}")
        print(f"{'decoder':<12} {'tok/s':>7} {'spread':>15} {'block_eff':>9} {'x HF-asst':>9} {'x AR':>6} {'fwd share':>9}")
        for n, d in per.items():
            sp = f"{d['spread'][0]:.2f}-{d['spread'][1]:.2f}"
            vs_hf = f"{d['vs_hf_assisted']:.2f}" if d["vs_hf_assisted"] is not None else "-"
            vs_ar = f"{d['vs_ar']:.2f}" if d["vs_ar"] is not None else "-"
            extra = f"  greedy tokens == HF assisted: {d['equal_prompts']}" if "equal_prompts" in d else ""
            print(f"{n:<12} {d['tokens_per_s']:>7.2f} {sp:>15} {d['block_efficiency']:>9.2f} {vs_hf:>9} "
                  f"{vs_ar:>6} {d['forward_share']:>9.1%}{extra}")
    print("\nblock efficiency = new tokens / decoding target passes (forward hooks; HF's first pass counts,"
          " ours prefill separately); tokens/s include prefill")
    print(json.dumps({"runs": len(rows)}))


if __name__ == "__main__":
    main()

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
    python bench/speed.py --tasks humaneval:0-9,cnn_dailymail:0-4 \
        --decoders hf_assisted,hf_heuristic,spd,spd/gamma=auto,tree_mtad,tree_mtad/gamma=5/width=2

Decoder specs: a decoder name (``conf/decoder/<name>.yaml`` with ``--gamma``), optionally
followed by ``/knob=value`` overrides (``tree_mtad/gamma=auto/width=auto``); the spec is the
row's label. HF rows: ``hf_ar`` (plain ``generate``), ``hf_assisted`` (assisted generation,
constant ``--gamma`` draft tokens, confidence stopping off: the same draft length as our
SpD), ``hf_heuristic`` (assisted generation with HF's heuristic schedule: start at 5 draft
tokens, +2 after a fully accepted draft, -1 otherwise, reset every call so repeats are
independent; the schedule HF shipped as its default with assisted generation) and
``hf_default`` (today's ``GenerationConfig`` defaults: 20 draft tokens, constant schedule,
stop drafting below ``assistant_confidence_threshold`` 0.4; HF only adapts that threshold
when scikit-learn is installed, which is recorded).
Task specs: ``name`` (the first ``--n-prompts`` examples) or ``name:a-b`` (examples a..b,
inclusive): tune on one range, report on another.

``--fixed-length`` (the claims report's speed benchmark, ``make bench-claim4``): every run
produces exactly ``--max-new-tokens`` tokens (EOS ignored, so two decoders are timed on the
same number of tokens whatever their samples) and ``wall`` is decoding time only (prefill
excluded; the prefill is in ``prefill``). HF rows are refused there (``generate`` times
prefill and decoding together). Without it, a run stops at EOS and ``wall`` includes the
prefill. Block efficiency is ``mtad.core.metrics.block_efficiency`` (emitted tokens / steps) for
our decoders and ``mtad.core.metrics.tokens_per_target_pass`` (tokens per decoding target pass)
for HF's, which report no steps.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtad.core import allocator  # noqa: E402
from mtad.core.engine import Engine  # noqa: E402
from mtad.core.io import shown_path  # noqa: E402
from mtad.core.metrics import block_efficiency, tokens_per_target_pass  # noqa: E402
from mtad.core.warping import Warping  # noqa: E402
from mtad.run.cli import compose_config, load_decoder  # noqa: E402
from mtad.run.provenance import provenance, write_json_atomic  # noqa: E402


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


def parse_task(spec: str, n_default: int) -> tuple[str, int, int]:
    """``humaneval`` -> (humaneval, 0, n_default - 1); ``humaneval:10-19`` -> (humaneval, 10, 19)."""
    name, _, rng = spec.partition(":")
    if not rng:
        return name, 0, n_default - 1
    try:
        a, _, b = rng.partition("-")
        lo, hi = int(a), int(b or a)
    except ValueError:
        raise SystemExit(f"--tasks: bad range in {spec!r}; write name:first-last, e.g. humaneval:10-19") from None
    if lo < 0 or hi < lo:
        raise SystemExit(f"--tasks: bad range in {spec!r}; need 0 <= first <= last")
    return name, lo, hi


def load_prompts(task_name: str, lo: int, hi: int, tokenizer) -> list[list[int]]:
    cfg = compose_config([f"task={task_name}"], drop=("model", "logger"))
    task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
    task_cfg.pop("scorer", None)
    task = instantiate(task_cfg)
    examples = task.load()
    if hi >= len(examples):
        raise SystemExit(f"--tasks: {task_name} has {len(examples)} examples; range ends at {hi}")
    return [task.render(ex, tokenizer, 0, []) for ex in examples[lo : hi + 1]]


HF_ROWS = ("hf_ar", "hf_assisted", "hf_heuristic", "hf_default")


def parse_decoder(spec: str, gamma: int) -> tuple[str, dict]:
    """``tree_mtad/gamma=5/width=2`` -> ("tree_mtad", {"gamma": "5", "width": "2"}); ar = multinomial."""
    name, *kv = spec.split("/")
    knobs = {"gamma": gamma}
    for item in kv:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"--decoders: {spec!r}: write overrides as /knob=value, e.g. spd/gamma=6")
        knobs[k] = v
    return ("multinomial" if name == "ar" else name), knobs


def hf_generate(pair, ids, max_new, warping: Warping, assistant: str | None, gamma: int, seed: int):
    kwargs = dict(max_new_tokens=max_new, min_new_tokens=0, pad_token_id=pair.tokenizer.pad_token_id
                  if getattr(pair.tokenizer, "pad_token_id", None) is not None else 0)
    if warping.greedy:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=True, temperature=warping.temperature, top_k=warping.top_k or None,
                      top_p=warping.top_p)
    if assistant:
        kwargs.update(assistant_model=pair.draft)
        gc = pair.draft.generation_config
        # set on every call: HF's "heuristic" schedule writes its state back into this config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = {
            "hf_assisted": (gamma, "constant", 0.0),
            "hf_heuristic": (5, "heuristic_transient", 0.0),
            "hf_default": (20, "constant", 0.4),
        }[assistant]
    torch.manual_seed(seed)
    inp = torch.tensor([ids], device=pair.target.device)
    t0 = time.perf_counter()
    out = pair.target.generate(inp, attention_mask=torch.ones_like(inp), **kwargs)
    wall = time.perf_counter() - t0
    return out[0, len(ids):].tolist(), wall


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the model, e.g. model=tiny_random")
    ap.add_argument("--tasks", default="humaneval,cnn_dailymail",
                    help="task specs: name or name:first-last (inclusive example range)")
    ap.add_argument("--n-prompts", type=int, default=3, help="prompts for a task given without a range")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="greedy,sample")
    ap.add_argument("--decoders", default="hf_ar,ar,hf_assisted,spd,specinfer,mcss,spectr,mtad,tree_mtad")
    ap.add_argument("--out", default="results/bench/speed.json")
    ap.add_argument("--compare", default="",
                    help="extra paired comparisons a:b (row labels, comma-separated), e.g. "
                         "tree_mtad/gamma=4/width=2:spd/gamma=3")
    ap.add_argument("--report", help="only print the report of an earlier run's JSON")
    ap.add_argument("--fixed-length", action="store_true",
                    help="every run emits exactly --max-new-tokens tokens (EOS ignored); wall = "
                         "decoding time, prefill excluded")
    args = ap.parse_args(argv)
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        print_header(saved)
        print_report(summarize(saved["rows"], saved["args"]["decoders"].split(",")), saved["rows"])
        print_comparisons(compare(saved["rows"], args.compare or saved["args"].get("compare", "")))
        return
    allocator.tune()  # as the entry points run (mtad.core.allocator); recorded in the provenance

    if unknown := [m for m in args.modes.split(",") if m not in MODES]:
        raise SystemExit(f"--modes: unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    cfg = compose_config(args.overrides, drop=("task", "logger"))
    pair = instantiate(cfg.model)
    tok = pair.tokenizer
    timers = {"target": ForwardTimer(pair.target), "draft": ForwardTimer(pair.draft)}
    specs = [parse_task(t, args.n_prompts) for t in args.tasks.split(",")]
    prompts = {name: load_prompts(name, lo, hi, tok) for name, lo, hi in specs}
    first_index = {name: lo for name, lo, _ in specs}
    names = args.decoders.split(",")
    if args.fixed_length and (hf := [n for n in names if n in HF_ROWS]):
        raise SystemExit(f"--fixed-length: HF rows {hf} time prefill with decoding; leave them out")
    modes = {"greedy": Warping(0.0), "sample": Warping(float(cfg.temperature), int(cfg.top_k), float(cfg.top_p)),
             # top-p alone: a draw's support is the nucleus, not bounded by top-k
             "sample_nok": Warping(float(cfg.temperature), 0, float(cfg.top_p))}
    # One decoder object per (spec, task, mode), like one sweep point: a gamma=auto controller
    # learns from the steps of its own task and mode only.
    engines = {}

    def decoder(n, key):
        if (n, key) not in engines:
            dec_name, knobs = parse_decoder(n, args.gamma)
            engines[(n, key)] = load_decoder(dec_name, **knobs)
        return engines[(n, key)]

    for n in names:  # fail early on a bad spec
        if n not in HF_ROWS:
            decoder(n, "warm-up")

    rows = []  # one per (task, mode, decoder, prompt, repeat)
    # warm-up: one short run of each method
    first = next(iter(prompts.values()))[0]
    for n in names:
        for mname, w in modes.items():
            if mname in args.modes.split(","):
                _run(n, pair, None if n in HF_ROWS else decoder(n, "warm-up"), first, 4, w, args.gamma, 0,
                     args.fixed_length)
    for task, plist in prompts.items():
        for mname in args.modes.split(","):
            w = modes[mname]
            for pi, ids in enumerate(plist):
                for rep in range(args.repeats):
                    shift = (pi + rep) % len(names)  # rotate the order: no decoder always runs first
                    order = names[shift:] + names[:shift]
                    for n in order:
                        f0 = {k: t.snapshot() for k, t in timers.items()}
                        dec = None if n in HF_ROWS else decoder(n, (task, mname))
                        out, wall, extra = _run(n, pair, dec, ids, args.max_new_tokens, w, args.gamma,
                                                1000 * pi + rep, args.fixed_length)
                        fwd = sum(t.snapshot()[0] - f0[k][0] for k, t in timers.items())
                        tcalls = timers["target"].snapshot()[1] - f0["target"][1]
                        rows.append(dict(task=task, mode=mname, decoder=n, prompt=first_index[task] + pi,
                                         repeat=rep, tokens=len(out), wall=wall, forward=fwd,
                                         # the span the forward timers cover: they also time the
                                         # prefill, which --fixed-length leaves out of wall
                                         timed=wall + (extra.get("prefill", 0.0) if args.fixed_length else 0.0),
                                         target_calls=tcalls, ids=out, **extra))
                    print(f"[{task}/{mname}] prompt {pi} repeat {rep} done", file=sys.stderr, flush=True)

    report = summarize(rows, names)
    print_report(report, rows)
    comparisons = compare(rows, args.compare)
    print_comparisons(comparisons)
    timing = ("fixed length: every run emits max_new_tokens tokens (EOS ignored); wall = decoding only, "
              "prefill excluded" if args.fixed_length else
              "runs stop at EOS (lengths differ); wall = prefill + decoding")
    write_json_atomic(args.out, {"report": report, "comparisons": comparisons, "rows": rows,
                                 "args": {**vars(args), "out": shown_path(args.out)},  # never absolute
                                 "timing": timing,
                                 "model": {"target": pair.target_id, "draft": pair.draft_id, **pair.info},
                                 "torch_threads": torch.get_num_threads(),
                                 "sklearn_installed": importlib.util.find_spec("sklearn") is not None,
                                 "provenance": provenance()})
    print(f"\nwritten: {args.out}")


MODES = ("greedy", "sample", "sample_nok")  # T 0; the config's T, top-k, top-p; the same without top-k


def _run(name, pair, dec, ids, max_new, warping, gamma, seed, fixed_length=False):
    if name in HF_ROWS:
        out, wall = hf_generate(pair, ids, max_new, warping, None if name == "hf_ar" else name, gamma, seed)
        return out, wall, {}
    eos = () if fixed_length else pair.eos_token_ids
    eng = Engine(pair.target, pair.draft, dec, warping, pair.vocab_size, eos)
    res = eng.generate(ids, max_new, seed=seed)
    steps = max(res.num_steps, 1)
    extra = dict(steps=res.num_steps, mean_drafted=sum(s.drafted for s in res.steps) / steps,
                 mean_tree_size=sum(s.tree_size for s in res.steps) / steps, prefill=res.prefill_time,
                 block_efficiency=res.block_efficiency)
    shapes = [s.shape for s in res.steps if s.shape]
    if shapes:  # gamma=auto / width=auto: how often each shape was chosen
        extra["shapes"] = dict(Counter(f"g{sh.get('gamma')}w{sh.get('width', 1)}" for sh in shapes))
    return res.output_ids, res.wall_time + (0.0 if fixed_length else res.prefill_time), extra


def _per_prompt_rate(rs) -> dict[int, float]:
    """tokens/s per prompt, pooled over repeats."""
    out = {}
    for pi in sorted({r["prompt"] for r in rs}):
        mine = [r for r in rs if r["prompt"] == pi]
        out[pi] = sum(r["tokens"] for r in mine) / sum(r["wall"] for r in mine)
    return out


def _per_prompt_outside(rs) -> dict[int, float]:
    """Seconds outside the two models' forward passes per emitted token, per prompt, pooled over
    repeats: (timed span - forward) / tokens, the forward hooks' time taken over the span they
    timed (prefill included on both sides)."""
    out = {}
    for pi in sorted({r["prompt"] for r in rs}):
        mine = [r for r in rs if r["prompt"] == pi]
        tokens = sum(r["tokens"] for r in mine)
        if tokens:
            out[pi] = sum(r.get("timed", r["wall"]) - r["forward"] for r in mine) / tokens
    return out


def _paired_ratio(mine: dict[int, float], ref: dict[int, float]) -> dict | None:
    """Ratio of geometric means of per-prompt values (tokens/s, or seconds outside the models per
    token), 95% bootstrap interval over prompts."""
    common = sorted(set(mine) & set(ref))
    if not common:
        return None
    from mtad.core.stats import ratio_of_geometric_means

    iv = ratio_of_geometric_means([mine[p] for p in common], [ref[p] for p in common])
    return dict(estimate=iv.estimate, low=iv.low, high=iv.high, n=iv.n)


def summarize(rows, names):
    report = {}
    for key in sorted({(r["task"], r["mode"]) for r in rows}):
        sub = [r for r in rows if (r["task"], r["mode"]) == key]
        per = {}
        rates, outside = {}, {}
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
            passes = sum(r["target_calls"] - (0 if n in HF_ROWS else 1) for r in rs)
            rates[n] = _per_prompt_rate(rs)
            outside[n] = _per_prompt_outside(rs)
            steps = sum(r.get("steps", 0) for r in rs)
            per[n] = dict(tokens_per_s=statistics.median(tps), spread=(min(tps), max(tps)),
                          block_efficiency=(block_efficiency(toks, steps) if steps  # HF's: no steps
                                            else tokens_per_target_pass(toks, max(passes, 1))),
                          forward_share=sum(r["forward"] for r in rs) / sum(r.get("timed", r["wall"]) for r in rs),
                          outside_ms_per_token=1000 * sum(r.get("timed", r["wall"]) - r["forward"] for r in rs)
                          / max(toks, 1),
                          prompts=len(rates[n]))
            if "steps" in rs[0]:
                per[n]["mean_drafted"] = sum(r["mean_drafted"] * r["steps"] for r in rs) / max(steps, 1)
                per[n]["mean_tree_size"] = sum(r["mean_tree_size"] * r["steps"] for r in rs) / max(steps, 1)
        for n, d in per.items():
            d["vs_hf_assisted"] = d["tokens_per_s"] / per["hf_assisted"]["tokens_per_s"] if "hf_assisted" in per else None
            d["vs_ar"] = d["tokens_per_s"] / per["ar"]["tokens_per_s"] if "ar" in per else None
            d["paired_vs_spd"] = _paired_ratio(rates[n], rates["spd"]) if "spd" in rates else None
            d["paired_vs_hf_assisted"] = (_paired_ratio(rates[n], rates["hf_assisted"])
                                          if "hf_assisted" in rates else None)
            d["outside_vs_spd"] = _paired_ratio(outside[n], outside["spd"]) if "spd" in outside else None
            d["outside_goal"] = _outside_verdict(n, d["outside_vs_spd"])
        if key[1] == "greedy" and "spd" in per and "hf_assisted" in per:
            pairs = [(a["ids"], b["ids"]) for a in sub if a["decoder"] == "spd"
                     for b in sub if b["decoder"] == "hf_assisted" and b["prompt"] == a["prompt"]
                     and b["repeat"] == a["repeat"]]
            per["spd"]["equals_hf_greedy"] = all(x == y for x, y in pairs)
            per["spd"]["equal_prompts"] = f"{sum(x == y for x, y in pairs)}/{len(pairs)}"
        report["/".join(key)] = per
    return report


OUTSIDE_LIMIT = 1.5  # the overhead bench's goal: every decoder's time outside the models <= 1.5x SpD's


def _outside_verdict(name: str, r: dict | None) -> str | None:
    """What the paired interval of the time outside the models says of the overhead bench's goals
    (``bench/overhead.py``): a decoder's <= ``OUTSIDE_LIMIT`` x SpD's; for HF assisted generation,
    SpD's <= HF's (its ratio to SpD >= 1). met / missed / unresolved (the interval straddles the
    limit)."""
    if r is None or name == "spd" or (name in HF_ROWS and name != "hf_assisted"):
        return None
    if name == "hf_assisted":  # the goal is SpD <= HF: HF / SpD >= 1
        return "met" if r["low"] >= 1 else "missed" if r["high"] < 1 else "unresolved"
    return "met" if r["high"] <= OUTSIDE_LIMIT else "missed" if r["low"] > OUTSIDE_LIMIT else "unresolved"


def compare(rows, spec: str) -> list[dict]:
    """Paired tokens/s ratios a / b per (task, mode) for each ``a:b`` in ``spec``."""
    out = []
    for item in [x for x in spec.split(",") if x]:
        a, sep, b = item.rpartition(":")
        if not sep:
            raise SystemExit(f"--compare: write a:b, got {item!r}")
        for key in sorted({(r["task"], r["mode"]) for r in rows}):
            sub = [r for r in rows if (r["task"], r["mode"]) == key]
            ra = _per_prompt_rate([r for r in sub if r["decoder"] == a])
            rb = _per_prompt_rate([r for r in sub if r["decoder"] == b])
            out.append(dict(a=a, b=b, task=key[0], mode=key[1], ratio=_paired_ratio(ra, rb)))
    return out


def print_comparisons(comparisons: list[dict]) -> None:
    if comparisons:
        print("\n## paired comparisons (ratio of geometric means of per-prompt tokens/s, 95% CI)")
    for c in comparisons:
        print(f"{c['task'] + '/' + c['mode']:<24} {c['a']:>34} / {c['b']:<26} {_fmt_ratio(c['ratio'])}")


def _fmt_ratio(r) -> str:
    return "-" if not r else f"{r['estimate']:.2f} [{r['low']:.2f},{r['high']:.2f}]"


def print_header(saved: dict) -> None:
    """What produced a saved run: its command, commit, pair, machine and stack (from its JSON)."""
    a, pv = saved.get("args", {}), saved.get("provenance", {})
    opts = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in a.items()
                    if k not in ("overrides", "report", "compare", "fixed_length") and v is not None)
    flags = (" --fixed-length" if a.get("fixed_length") else "") + "".join(f" {o}" for o in a.get("overrides", []))
    git = pv.get("git", {})
    model = saved.get("model", {})

    def name(m):
        return f"{m.get('id')} ({m.get('dtype')})" if isinstance(m, dict) else str(m)

    cpu = pv.get("device", {}).get("cpu_info", {})
    pkgs = pv.get("packages", {})
    print(f"# python bench/speed.py {opts}{flags}")
    print(f"# git {str(git.get('commit'))[:10]}{' (dirty)' if git.get('dirty') else ''}; "
          f"{name(model.get('target'))} / {name(model.get('draft'))}; {cpu.get('model', '?')} "
          f"({cpu.get('torch_capability', '?')}, native bf16: {cpu.get('native_bf16', '?')}), "
          f"{cpu.get('usable_cpus', '?')} CPUs, torch threads {saved.get('torch_threads', '?')}; torch "
          f"{pkgs.get('torch', '?')}, transformers {pkgs.get('transformers', '?')}; {saved.get('timing', '')}")


def _fmt_ms(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def print_report(report, rows):
    for key, per in report.items():
        print(f"\n## {key}")
        print(f"{'decoder':<26} {'tok/s':>6} {'spread':>11} {'BE':>5} {'nodes':>5} {'x HF-asst':>9} "
              f"{'x AR':>5} {'x SpD, paired [95% CI]':>22} {'x HF-asst, paired':>18} {'fwd share':>9} "
              f"{'outside ms/tok':>14} {'outside x SpD, paired':>21} {'goal':>10}")
        for n, d in per.items():
            sp = f"{d['spread'][0]:.2f}-{d['spread'][1]:.2f}"
            vs_hf = f"{d['vs_hf_assisted']:.2f}" if d["vs_hf_assisted"] is not None else "-"
            vs_ar = f"{d['vs_ar']:.2f}" if d["vs_ar"] is not None else "-"
            nodes = f"{d['mean_tree_size']:.1f}" if "mean_tree_size" in d else "-"
            extra = f"  greedy tokens == HF assisted: {d['equal_prompts']}" if "equal_prompts" in d else ""
            print(f"{n:<26} {d['tokens_per_s']:>6.2f} {sp:>11} {d['block_efficiency']:>5.2f} {nodes:>5} "
                  f"{vs_hf:>9} {vs_ar:>5} {_fmt_ratio(d.get('paired_vs_spd')):>22} "
                  f"{_fmt_ratio(d.get('paired_vs_hf_assisted')):>18} {d['forward_share']:>9.1%} "
                  f"{_fmt_ms(d.get('outside_ms_per_token')):>14} {_fmt_ratio(d.get('outside_vs_spd')):>21} "
                  f"{_outside_verdict(n, d.get('outside_vs_spd')) or '-':>10}{extra}")
    print("\nBE = emitted tokens / steps (mtad.core.metrics) for ours; new tokens / decoding target passes for"
          " HF's (forward hooks; HF's first pass counts); nodes = mean target tree nodes per step; tok/s"
          " include prefill except with --fixed-length (median over repeats, spread = min-max); paired"
          " = ratio of geometric means of per-prompt tokens/s with a"
          " 95% bootstrap interval over prompts; fwd share = time inside the models' top-level forward over"
          " the time they were timed in (prefill + decoding: the share's span includes the prefill also"
          " with --fixed-length); outside = that span less the forward time, per emitted token (the harness's"
          " own time: warping, drafting bookkeeping, draws, cache edits), paired = ratio of geometric means of"
          " per-prompt values with a 95% bootstrap interval (below 1: less than SpD's); goal = what that"
          f" interval says of the overhead bench's goals (a decoder's <= {OUTSIDE_LIMIT}x SpD's; on the"
          " hf_assisted row, SpD's <= HF's): met, missed, or unresolved (the interval straddles the limit;"
          " unadjusted for the number of rows)")
    print(json.dumps({"runs": len(rows)}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Measure the cost model on this machine, check its predictions, save the prior ``auto`` loads.

(a) target pass time vs rows n (the pending endpoint row + n-1 tree nodes), median of
    ``--repeats`` at a real prompt's context; (b) draft pass time vs width (W tree nodes after
    the endpoint, as in a beam depth); (c) acceptance per depth and per-step harness overhead
    of spd, mtad and tree_mtad on the *tuning* prompts; (d) predicted tokens/s of SpD(gamma)
    and tree-MTAD(W, gamma) from (a)-(c) against tokens/s measured on the *report* prompts
    (relative error), plus a prediction with the acceptance seen on the report prompts
    themselves (isolating the timing model's error), and the ``auto`` decoders' measured
    tokens/s with the shapes they chose. Writes ``--out`` (JSON), ``--plot`` (PNG) and adds this
    machine's entry to ``--prior`` (what ``gamma=auto`` loads). docs/cost_model.md explains it.

    python bench/cost_model.py                                   # offline pair, ~15 min on 2 cores
    python bench/cost_model.py model=tiny_random --n-prompts 1 --max-new-tokens 8 --repeats 2 \\
        --out /tmp/cm.json --plot /tmp/cm.png --prior /tmp/prior.json   # seconds, pipeline check
    python bench/cost_model.py --report results/bench/cost_model_cpu.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from hydra.utils import instantiate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from speed import load_prompts as speed_prompts  # noqa: E402  (bench/speed.py, same folder)
from speed import parse_task  # noqa: E402

from mtad.autotune.autoshape import RHO, machine_id, model_key  # noqa: E402
from mtad.autotune.costmodel import (  # noqa: E402
    AcceptanceModel,
    CostModel,
    PassTime,
    fit_overhead,
    predict,
    relative_error,
    save_prior,
)
from mtad.core.engine import Engine  # noqa: E402
from mtad.core.runner import ROOT, ModelRunner  # noqa: E402
from mtad.core.warping import Warping  # noqa: E402
from mtad.run.cli import compose_config, load_decoder  # noqa: E402
from mtad.run.provenance import provenance, write_json_atomic  # noqa: E402


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def load_prompts(spec: str, n: int, tokenizer) -> list[list[int]]:
    """``task:a-b`` (inclusive example indices, as in bench/speed.py), the first ``n`` of them."""
    name, lo, hi = parse_task(spec if ":" in spec else f"{spec}:0-{n - 1}", n)
    return speed_prompts(name, lo, min(hi, lo + n - 1), tokenizer)


# ------------------------------------------------------------------ (a), (b) pass times
def time_pass(runner: ModelRunner, committed: list[int], rows: int, with_pending: bool) -> float:
    """Seconds of one forward of ``rows`` rows on top of ``committed`` (the cache rolls back)."""
    runner.begin(committed)
    fill = committed[-64:] * (rows // max(len(committed[-64:]), 1) + 1)
    if with_pending:  # the endpoint row + rows-1 chain nodes in one call (a target verify pass)
        k = rows - 1
        toks, parents = fill[:k], ([ROOT] + list(range(1, k)))[:k]  # a chain: rows 1..k
    else:  # the endpoint first, then rows sibling nodes (a beam depth on the draft)
        runner.forward([], [])  # feeds the pending endpoint (root logits)
        toks, parents = fill[:rows], [ROOT] * rows
    t0 = runner.forward_time
    runner.forward(toks, parents)
    dt = runner.forward_time - t0
    runner.end(committed)
    return dt


def measure_passes(model, vocab, prompt, sizes, repeats, with_pending) -> dict[int, list[float]]:
    runner = ModelRunner(model, vocab)
    runner.prefill(prompt)
    for n in sizes[:3]:  # warm-up
        time_pass(runner, prompt, n, with_pending)
    out: dict[int, list[float]] = {n: [] for n in sizes}
    rng = random.Random(0)
    for _ in range(repeats):
        order = list(sizes)
        rng.shuffle(order)  # load from other processes hits every size alike
        for n in order:
            out[n].append(time_pass(runner, prompt, n, with_pending))
    return out


# ---------------------------------------------------------------------------- (c), (d)
def run_decoder(pair, decoder, prompts, max_new, warping) -> dict:
    eng = Engine(pair.target, pair.draft, decoder, warping, pair.vocab_size, pair.eos_token_ids)
    eng.generate(prompts[0], min(4, max_new), seed=0)  # warm-up
    steps, tokens, wall = [], 0, 0.0
    for i, ids in enumerate(prompts):
        res = eng.generate(ids, max_new, seed=1000 * i)
        tokens += res.new_tokens
        wall += res.wall_time
        steps += [dict(drafted=s.drafted, accepted=s.accepted, tree_size=s.tree_size, wall=s.wall_time,
                       target=s.target_time, draft=s.draft_time, shape=s.shape) for s in res.steps]
    return {"tokens": tokens, "wall": wall, "tokens_per_s": tokens / wall if wall else float("nan"),
            "steps": steps}


def acceptance_of(runs: dict, kind: str, widths) -> AcceptanceModel:
    m = AcceptanceModel(rho=RHO[kind], width_strength=1.0, depth_strength=1.0)
    for w in widths:
        for s in runs[(kind, w)]["steps"]:
            if s["drafted"] > 0:
                m.observe(w, s["drafted"], s["accepted"])
    return m


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the model, e.g. model=tiny_random")
    ap.add_argument("--tune-prompts", default="humaneval:10-19", help="task:a-b, acceptance/overhead")
    ap.add_argument("--report-prompts", default="humaneval:0-9", help="task:a-b, measured tokens/s")
    ap.add_argument("--n-prompts", type=int, default=3, help="prompts used from each selection")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5, help="timed passes per size")
    ap.add_argument("--nodes", default="1,2,3,4,5,6,8,10,12,16,24,32,48,64", help="target rows")
    ap.add_argument("--draft-widths", default=",".join(map(str, range(1, 17))))
    ap.add_argument("--spd-gammas", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--tree-widths", default="1,2,4")
    ap.add_argument("--tree-gammas", default="2,4,6")
    ap.add_argument("--mtad-widths", default="1,2,4", help="chain MTAD widths for its acceptance prior")
    ap.add_argument("--no-auto", action="store_true", help="skip the gamma=auto runs")
    ap.add_argument("--out", default=None, help="default results/bench/cost_model_<device>.json")
    ap.add_argument("--plot", default=None, help="default: --out with .png")
    ap.add_argument("--prior", default="results/bench/cost_model_prior.json")
    ap.add_argument("--report", help="only print the report of an earlier run's JSON")
    args = ap.parse_args(argv)
    if args.report:
        print_report(json.loads(Path(args.report).read_text()))
        return

    t_start = time.perf_counter()
    cfg = compose_config(args.overrides, drop=("task", "logger"))
    pair = instantiate(cfg.model)
    device = pair.target.device if hasattr(pair.target, "device") else next(pair.target.parameters()).device
    out_path = Path(args.out or f"results/bench/cost_model_{torch.device(device).type}.json")
    plot_path = Path(args.plot or out_path.with_suffix(".png"))
    tune = load_prompts(args.tune_prompts, args.n_prompts, pair.tokenizer)
    report = load_prompts(args.report_prompts, args.n_prompts, pair.tokenizer)
    warping = Warping(float(cfg.temperature), int(cfg.top_k), float(cfg.top_p))
    log = lambda msg: print(f"[{time.perf_counter() - t_start:6.0f}s] {msg}", file=sys.stderr, flush=True)  # noqa: E731

    # (a), (b)
    tgt = measure_passes(pair.target, pair.vocab_size, report[0], ints(args.nodes), args.repeats, True)
    log("target pass times measured")
    drf = measure_passes(pair.draft, pair.vocab_size, report[0], ints(args.draft_widths), args.repeats, False)
    log("draft pass times measured")
    target_pass, draft_pass = PassTime.fit(tgt), PassTime.fit(drf)

    # (c) tuning runs: SpD at the largest gamma gives S(d) for every smaller gamma
    g_max = max(ints(args.spd_gammas))
    tg_max = max(ints(args.tree_gammas))
    tuning = {("spd", 1): run_decoder(pair, load_decoder("spd", gamma=g_max), tune, args.max_new_tokens, warping)}
    for kind, widths in (("tree_mtad", ints(args.tree_widths)), ("mtad", ints(args.mtad_widths))):
        for w in widths:
            dec = load_decoder(kind, gamma=tg_max, width=w, tau=float(cfg.tau))
            tuning[(kind, w)] = run_decoder(pair, dec, tune, args.max_new_tokens, warping)
    log("tuning runs done")
    kinds = {"spd": [1], "tree_mtad": ints(args.tree_widths), "mtad": ints(args.mtad_widths)}
    acc = {k: acceptance_of(tuning, k, ws) for k, ws in kinds.items()}
    overhead, node_fraction = {}, {}
    for kind, ws in kinds.items():
        steps = [s for w in ws for s in tuning[(kind, w)]["steps"] if s["drafted"] > 0]
        overhead[kind] = fit_overhead((s["drafted"], s["wall"] - s["target"] - s["draft"]) for s in steps)
    wide = [s["tree_size"] / (w * s["drafted"]) for w in kinds["tree_mtad"] if w > 1
            for s in tuning[("tree_mtad", w)]["steps"] if s["drafted"] > 0]
    node_fraction["tree_mtad"] = sum(wide) / len(wide) if wide else 1.0
    cost = CostModel(target_pass, draft_pass, overhead, node_fraction)

    # (d) predicted vs measured on the report prompts
    configs = [("spd", g, 1) for g in ints(args.spd_gammas)]
    configs += [("tree_mtad", g, w) for w in ints(args.tree_widths) for g in ints(args.tree_gammas)]
    rows = []
    for kind, g, w in configs:
        dec = load_decoder(kind, gamma=g) if kind == "spd" else load_decoder(kind, gamma=g, width=w, tau=float(cfg.tau))
        r = run_decoder(pair, dec, report, args.max_new_tokens, warping)
        seen = AcceptanceModel(rho=RHO[kind], width_strength=1e-9, depth_strength=1e-9)
        for s in r["steps"]:
            if s["drafted"] > 0:
                seen.observe(w, s["drafted"], s["accepted"])
        full = [s for s in r["steps"] if s["drafted"] == g]
        pred = predict(cost, acc[kind], kind, g, w)
        pred_seen = predict(cost, seen, kind, g, w) if seen.observations(w) else float("nan")
        rows.append(dict(decoder=kind, gamma=g, width=w, measured_tokens_per_s=r["tokens_per_s"],
                         predicted_tokens_per_s=pred, relative_error=relative_error(pred, r["tokens_per_s"]),
                         predicted_with_seen_acceptance=pred_seen,
                         relative_error_seen_acceptance=relative_error(pred_seen, r["tokens_per_s"]),
                         expected_tokens_tuning=acc[kind].expected_tokens(w, g),
                         tokens_per_step_measured=r["tokens"] / max(len(r["steps"]), 1),
                         step_seconds_predicted=cost.step_time(kind, g, w),
                         step_seconds_measured=(sum(s["wall"] for s in full) / len(full)) if full else None))
        log(f"{kind} g={g} W={w}: measured {r['tokens_per_s']:.2f} tok/s, predicted {pred:.2f}")

    entry = {"machine": machine_id(device), "target": model_key(pair.target), "draft": model_key(pair.draft),
             **cost.to_dict(), "acceptance": {k: a.to_dict() for k, a in acc.items()},
             "pair": {"name": pair.name, "target": pair.target_id, "draft": pair.draft_id},
             "tune_prompts": args.tune_prompts, "time_utc": provenance()["time_utc"]}
    save_prior(args.prior, entry)

    auto = []
    if not args.no_auto:
        import os

        os.environ["MTAD_COST_PRIOR"] = str(Path(args.prior).resolve())
        for kind, knobs in (("spd", {"gamma": "auto"}), ("tree_mtad", {"gamma": "auto", "width": "auto"})):
            dec = load_decoder(kind, **knobs, **({} if kind == "spd" else {"tau": float(cfg.tau)}))
            r = run_decoder(pair, dec, report, args.max_new_tokens, warping)
            shapes: dict[str, int] = {}
            for s in r["steps"]:
                if s["shape"]:
                    key = f"g{s['shape']['gamma']}w{s['shape']['width']}"
                    shapes[key] = shapes.get(key, 0) + 1
            auto.append(dict(decoder=kind, knobs=knobs, measured_tokens_per_s=r["tokens_per_s"],
                             shapes_chosen=shapes))
            log(f"{kind} auto: {r['tokens_per_s']:.2f} tok/s, shapes {shapes}")

    result = {
        "args": vars(args),
        "model": {"pair": pair.name, "target": pair.target_id, "draft": pair.draft_id, "info": pair.info},
        "machine": entry["machine"],
        "pass_time": {"target": {"measured": {str(k): v for k, v in tgt.items()}, "fit": target_pass.to_dict()},
                      "draft": {"measured": {str(k): v for k, v in drf.items()}, "fit": draft_pass.to_dict()}},
        "overhead": {k: list(v) for k, v in overhead.items()},
        "node_fraction": node_fraction,
        "acceptance": {k: {"counts": a.to_dict(),
                           "per_depth_rate": {str(w): c.rates() for w, c in a.counts.items()},
                           "survival": {str(w): a.survival(w, g_max) for w in a.counts},
                           "alpha": {str(w): a.pooled(w) for w in a.counts}} for k, a in acc.items()},
        "autoregressive_tokens_per_s_predicted": cost.autoregressive_tokens_per_s(),
        "rows": rows,
        "auto": auto,
        "seconds": time.perf_counter() - t_start,
        "provenance": provenance(extra={"torch_threads": torch.get_num_threads()}),
    }
    write_json_atomic(out_path, result)
    plot(result, plot_path)
    print_report(result)
    print(f"\nwritten: {out_path}, {plot_path}; prior entry for {entry['machine']} in {args.prior}")


def print_report(r: dict) -> None:
    print(f"machine: {r['machine']}  pair: {r['model']['target']} / {r['model']['draft']}")
    for m in ("target", "draft"):
        fit = r["pass_time"][m]["fit"]
        pts = "  ".join(f"{n}:{1000 * s:.1f}" for n, s in zip(fit["n"], fit["seconds"]))
        print(f"{m} ms per pass by rows  {pts}")
    print("overhead s/step (c0, c1*gamma): " + ", ".join(f"{k} {v[0]:.4f}+{v[1]:.4f}g" for k, v in r["overhead"].items()))
    for k, a in r["acceptance"].items():
        print(f"{k} alpha by width: " + ", ".join(f"W={w}: {v:.3f}" for w, v in a["alpha"].items()))
    print(f"\n{'decoder':<10} {'g':>2} {'W':>2} {'meas tok/s':>10} {'pred':>7} {'err':>7} {'pred(seen acc)':>14} {'err':>7}")
    for x in r["rows"]:
        print(f"{x['decoder']:<10} {x['gamma']:>2} {x['width']:>2} {x['measured_tokens_per_s']:>10.2f} "
              f"{x['predicted_tokens_per_s']:>7.2f} {x['relative_error']:>+7.1%} "
              f"{x['predicted_with_seen_acceptance']:>14.2f} {x['relative_error_seen_acceptance']:>+7.1%}")
    errs = [abs(x["relative_error"]) for x in r["rows"]]
    errs_seen = [abs(x["relative_error_seen_acceptance"]) for x in r["rows"]]
    if errs:
        print(f"mean |relative error|: {sum(errs) / len(errs):.1%} (tuning acceptance), "
              f"{sum(errs_seen) / len(errs_seen):.1%} (report prompts' own acceptance)")
        best_m = max(r["rows"], key=lambda x: x["measured_tokens_per_s"])
        best_p = max(r["rows"], key=lambda x: x["predicted_tokens_per_s"])
        print(f"fastest measured: {best_m['decoder']} g={best_m['gamma']} W={best_m['width']}; "
              f"fastest predicted: {best_p['decoder']} g={best_p['gamma']} W={best_p['width']}")
    for a in r.get("auto", []):
        print(f"{a['decoder']} {a['knobs']}: {a['measured_tokens_per_s']:.2f} tok/s, shapes {a['shapes_chosen']}")


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for m, color in (("target", "C0"), ("draft", "C1")):
        meas = r["pass_time"][m]["measured"]
        for n, v in meas.items():
            ax1.scatter([int(n)] * len(v), [1000 * x for x in v], s=6, color=color, alpha=0.3)
        fit = r["pass_time"][m]["fit"]
        ax1.plot(fit["n"], [1000 * s for s in fit["seconds"]], "-o", ms=3, color=color, label=f"{m} (median, monotone fit)")
    ax1.set(xlabel="rows in one forward pass (target: endpoint + tree nodes; draft: beam width)",
            ylabel="ms per pass", title="pass time vs rows")
    ax1.legend(fontsize=8)
    for kind, marker in (("spd", "o"), ("tree_mtad", "s")):
        xs = [x for x in r["rows"] if x["decoder"] == kind]
        ax2.scatter([x["measured_tokens_per_s"] for x in xs], [x["predicted_tokens_per_s"] for x in xs],
                    marker=marker, label=kind)
        for x in xs:
            ax2.annotate(f"g{x['gamma']}" + (f"W{x['width']}" if kind != "spd" else ""),
                         (x["measured_tokens_per_s"], x["predicted_tokens_per_s"]), fontsize=6)
    vals = [v for x in r["rows"] for v in (x["measured_tokens_per_s"], x["predicted_tokens_per_s"])]
    if vals:
        lo, hi = min(vals) * 0.9, max(vals) * 1.1
        ax2.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="predicted = measured")
    ax2.set(xlabel="measured tokens/s (report prompts)", ylabel="predicted tokens/s (tuning acceptance)",
            title="cost model: predicted vs measured")
    ax2.legend(fontsize=8)
    fig.suptitle(f"{r['model']['target']} / {r['model']['draft']} on {r['machine']}", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()

"""Host round-trips per decoding step, for every decoder and shape (``make bench-transfers``).

Runs each decoder (``conf/decoder/*.yaml``) through ``Engine.generate`` on tiny random
models whose tensors the device checker (``mtad.testing.devicecheck``) places on virtual CUDA
devices (target ``cuda:0``, draft ``cuda:1``), and counts device-to-host transfers per
step, split into drafting (before the target's first pass in the step) and verification
(after it), and device synchronisations. The counts depend on the code's structure, not
on the machine: no timing here. Shapes: gamma 2/4/8; tree decoders with W 1/4 (tree-MTAD's
beam width; SpecInfer/MCSS/MCNS ``k_config = [W, 1, ..., 1]``; SpecTr ``num_drafts = W``);
BiLD's ``max_run = gamma``; MTJD/MJGD by beam search over ``gamma`` positions.

    python bench/transfers.py --out results/bench/transfers
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from mtad.core.engine import Engine
from mtad.core.warping import Warping
from mtad.models.tiny import tiny_causal_lm
from mtad.run.cli import compose_config, group_options
from mtad.testing import unsupported_by
from mtad.testing.devicecheck import virtual_pair
from mtad.testing.streams import words_between

TREE = {"specinfer", "mcss", "mcns", "spectr", "tree_mtad"}
NO_SHAPE = {"multinomial", "greedy"}


def shapes(name: str, gammas, widths) -> list[dict]:
    """Decoder overrides for each (gamma, W) of the table."""
    if name in NO_SHAPE:
        return [{}]
    out = []
    for g in gammas:
        for w in (widths if name in TREE else [None]):
            if name in ("specinfer", "mcss", "mcns"):
                out.append({"k_config": [w] + [1] * (g - 1)})
            elif name == "spectr":
                out.append({"gamma": g, "num_drafts": w})
            elif name == "tree_mtad":
                out.append({"gamma": g, "width": w})
            elif name in ("bild", "bild_sampling"):
                out.append({"max_run": g})
            elif name in ("mjgd", "mtjd"):
                out.append({"gamma": g, "method": "beam"})
            elif name == "mtad":
                out.append({"gamma": g, "width": 4})
            else:
                out.append({"gamma": g})
    return out


def label(name: str, over: dict) -> tuple[str, str]:
    if "k_config" in over:
        return str(len(over["k_config"])), str(over["k_config"][0])
    g = over.get("gamma", over.get("max_run", "-"))
    w = over.get("width", over.get("num_drafts", "-"))
    return str(g), str(w)


def load_decoder(name: str, **fields):
    """``conf/decoder/<name>.yaml`` with its own fields overridden (``decoder.<field>=...``)."""
    from hydra.utils import instantiate

    def fmt(v):
        return "[" + ",".join(map(str, v)) + "]" if isinstance(v, list) else str(v)

    cfg = compose_config([f"decoder={name}"] + [f"decoder.{k}={fmt(v)}" for k, v in fields.items()],
                         drop=("task", "model", "logger"))
    return instantiate(cfg.decoder)


#: per-step counts of the table: device-to-host ("draft", "verify"), host-to-device copies,
#: pageable ("h2d_*": each waits for the stream) and pinned non-blocking ("pinned_*": no wait)
KEYS = ("draft", "verify", "h2d_draft", "h2d_verify", "pinned_draft", "pinned_verify")
#: host work per step that should not grow with the vocabulary: random numbers the generator drew
#: (32-bit words: a uniform double or an exponential takes 2; ``mtad.testing.streams``) and bytes
#: copied host-to-device
HOST_KEYS = ("words", "h2d_bytes")


#: warpings of the table: the name in its T column -> Warping
SETTINGS = {
    "1": Warping(1.0, top_k=10, top_p=0.9),
    "0": Warping(0.0, top_k=10, top_p=0.9),
    "1 top-p": Warping(1.0, top_k=0, top_p=0.9),  # a support not bounded by top-k
    "1 plain": Warping(1.0),  # every token has mass: a support is the whole row
    # the exponential race at the same settings (the scheme before the inverse CDF), side by side
    "1 top-p race": Warping(1.0, top_k=0, top_p=0.9, draws="race"),
    "1 plain race": Warping(1.0, draws="race"),
}


def count_words(decoder, out: list[int]) -> None:
    """Append the random numbers (32-bit words) each step of ``decoder`` draws to ``out``."""
    step = decoder.step

    def counted(ctx):
        before = ctx.generator.get_state()
        try:
            return step(ctx)
        finally:
            out.append(words_between(before, ctx.generator.get_state()))

    decoder.step = counted


def measure(target, draft, name: str, over: dict, warping: Warping, tokens: int, prompts) -> dict:
    per_step, engine_h2d, engine_pinned, largest, words = [], 0, 0, 0, []
    for i, prompt in enumerate(prompts):
        dec = load_decoder(name, **over)
        with virtual_pair(target, draft) as vd:
            engine = Engine(target, draft, dec, warping)
            vd.watch_decoder(dec)
            count_words(dec, words)
            engine.generate(prompt, tokens, seed=i)
        per_step += vd.steps
        largest = max(largest, vd.largest_read)
        syncs = vd.counts["syncs"]
        engine_h2d += vd.counts["h2d_engine"]
        engine_pinned += vd.counts["pinned_engine"]
    n = len(per_step)
    row = {"decoder": name, "overrides": over, "steps": n, "largest_read": largest,
           "syncs_per_step_last_prompt": syncs / max(len(vd.steps), 1),
           # begin/end (cache compaction) and prefill, outside decoder steps, per step
           "h2d_engine_per_step": engine_h2d / n, "pinned_engine_per_step": engine_pinned / n}
    for s, w in zip(per_step, words):
        s["words"] = w
    for k in KEYS + HOST_KEYS:
        row[f"{k}_mean"] = statistics.fmean(s[k] for s in per_step)
        row[f"{k}_max"] = max(s[k] for s in per_step)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench/transfers")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--gammas", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--decoders", nargs="*", default=None)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS)[:4], choices=list(SETTINGS),
                    help="warpings (T column): top-k 10 + top-p 0.9 at T 1 and 0, top-p alone, plain T 1 "
                         "(and '... race': the same drawn by the exponential race)")
    ap.add_argument("--host-work", action="store_true",
                    help="only the host work per step (random numbers, bytes to the device) at each of "
                         "--vocabs, both draw schemes side by side: a section of <out>.md")
    ap.add_argument("--vocabs", type=int, nargs="+", default=[32_000, 151_936])
    args = ap.parse_args(argv)
    if args.host_work:
        return host_work(args, sys.argv[1:] if argv is None else argv)
    target = tiny_causal_lm("qwen2", vocab_size=args.vocab, dtype=torch.float32, seed=0, logit_scale=4.0)
    draft = tiny_causal_lm("qwen2", vocab_size=args.vocab, hidden_size=16, num_heads=2, num_layers=1,
                           dtype=torch.float32, seed=1, logit_scale=4.0)
    prompts = [[3, 4, 5], [7, 1, 9, 2]]
    rows = []
    for setting in args.settings:
        warping = SETTINGS[setting]
        for name in args.decoders or group_options("decoder"):
            if why := unsupported_by(load_decoder(name), warping):  # (greedy match: temperature 0 only)
                print(f"T={setting} skipped: {why}", flush=True)
                continue
            for over in shapes(name, args.gammas, args.widths):
                r = measure(target, draft, name, over, warping, args.tokens, prompts)
                r["temperature"] = warping.temperature
                r["setting"] = setting
                rows.append(r)
                print(f"T={setting} {name} {over}: " + ", ".join(
                    f"{k} {r[k + '_mean']:.2f} (max {r[k + '_max']})" for k in KEYS)
                    + f", largest read {r['largest_read']}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"command": "python bench/transfers.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "vocab": args.vocab, "tokens": args.tokens, "prompts": len(prompts),
            "sampling": "T 1 and 0 with top-k 10, top-p 0.9; '1 top-p': T 1, top-p 0.9 alone; "
                        "'1 plain': T 1 without top-k or top-p",
            "devices": "target cuda:0, draft cuda:1 (virtual)"}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = [
        "# Copies per step, both directions, by phase",
        "",
        f"`make bench-transfers` (`{meta['command'].strip()}`): tiny random models, vocabulary "
        f"{args.vocab}, {len(prompts)} prompts x {args.tokens} new tokens, {meta['sampling']}, "
        f"{meta['devices']}, counted by `mtad.testing.devicecheck`. *draft*: copies before the target's "
        "first pass in a step; *verify*: after it (MTJD/MJGD have no draft: their beam search over "
        "the block's positions runs on the target, one transfer per position). Mean (max) per step. "
        "*D2H*: device-to-host transfers (host round-trips). *H2D sync*: host-to-device copies from "
        "pageable memory (each waits for the device's stream). *H2D pinned*: host-to-device copies "
        "from pinned memory with `non_blocking=True` (queued, no wait). *engine*: pageable + pinned "
        "host-to-device copies outside decoder steps (prefill, `begin`/`end` and the cache "
        "compaction), per step. Synchronisations: one per device per step (the engine's), none "
        "inside a step. *largest read*: entries in the longest device-to-host transfer of the run "
        f"(a whole vocabulary row would be {args.vocab}). At plain temperature a draw's "
        "exponentials (or uniforms) cross to the device in a pinned copy of their own "
        "(`docs/devices.md`, rule 3). *1 top-p*: a nucleus longer than the 255-entry hint "
        "(this random pair's hold thousands of tokens) does not cross: the first read brings the "
        "top 256 entries and the support's size, and the draw is made on the device with that "
        "many exponentials (a pinned copy), its token read back: hence two reads per draft depth "
        "there. A verification reads the support sizes of the rows its final draw may come from "
        "with its scalars and draws a long one at once (a multi-draft walk whose draft rows stayed "
        "on the device runs there without reading the target's hints): two reads, MTJD one per "
        "block position and its last position's draw. No read is longer than a first read (a "
        "beam's: its W rows' hints, ids, values and q).",
        "",
        "| T | decoder | gamma | W | D2H draft | D2H verify | H2D sync draft | H2D sync verify "
        "| H2D pinned draft | H2D pinned verify | engine H2D sync + pinned | largest read | steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(r, k):
        return f"{r[k + '_mean']:.2f} ({r[k + '_max']})"

    for r in rows:
        g, w = label(r["decoder"], r["overrides"])
        lines.append(f"| {r['setting']} | {r['decoder']} | {g} | {w} | "
                     + " | ".join(cell(r, k) for k in KEYS)
                     + f" | {r['h2d_engine_per_step']:.2f} + {r['pinned_engine_per_step']:.2f}"
                     f" | {r['largest_read']} | {r['steps']} |")
    md = out.with_suffix(".md")
    kept = md.read_text() if md.exists() else ""  # the host-work section (``--host-work``) stays
    kept = kept[kept.index(HOST_BEGIN):] if HOST_BEGIN in kept else ""
    md.write_text("\n".join(lines) + "\n" + ("\n" + kept if kept else ""))
    print(f"-> {out.with_suffix('.md')}")


HOST_SETTINGS = ("1 plain race", "1 plain", "1 top-p race", "1 top-p")
HOST_DECODERS = ("spd", "specinfer", "mcss", "spectr", "tree_mtad", "mtad", "beam_specinfer", "multinomial")
HOST_BEGIN, HOST_END = "<!-- host work: begin -->", "<!-- host work: end -->"


def host_work(args, argv) -> None:
    """Random numbers and host-to-device bytes per step at each vocabulary, the race and the
    inverse CDF side by side; written as its own section of ``<out>.md`` (and ``<out>_host.json``)."""
    prompts = [[3, 4, 5], [7, 1, 9, 2]]
    decoders = args.decoders or list(HOST_DECODERS)
    rows = []
    for vocab in args.vocabs:
        target = tiny_causal_lm("qwen2", vocab_size=vocab, hidden_size=16, num_heads=2, num_layers=1,
                                dtype=torch.float32, seed=0, logit_scale=4.0)
        draft = tiny_causal_lm("qwen2", vocab_size=vocab, hidden_size=16, num_heads=2, num_layers=1,
                               dtype=torch.float32, seed=1, logit_scale=4.0)
        for name in decoders:
            over = shapes(name, args.gammas, args.widths)[-1]
            for setting in HOST_SETTINGS:
                r = measure(target, draft, name, over, SETTINGS[setting], args.tokens, prompts)
                r.update(vocab=vocab, setting=setting, scheme=SETTINGS[setting].scheme)
                rows.append(r)
                print(f"V={vocab} T={setting} {name} {over}: words/step {r['words_mean']:.0f} "
                      f"(max {r['words_max']}), h2d bytes/step {r['h2d_bytes_mean']:.0f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python bench/transfers.py " + " ".join(argv)
    out.with_name(out.name + "_host.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    lines = [
        HOST_BEGIN,
        "## Host work per step: random numbers and bytes to the device, by draw scheme",
        "",
        f"`{command}`: tiny random float32 models (hidden 16, one layer), {len(prompts)} prompts x "
        f"{args.tokens} new tokens, the decoders' largest shape of the table above, virtual CUDA devices "
        "(target cuda:0, draft cuda:1). *words*: 32-bit random numbers the one generator drew in a step "
        "(a uniform double or an exponential takes 2; what a draw that rewinds the generator leaves "
        "drawn; `mtad.testing.streams`). *H2D bytes*: bytes copied host-to-device in a step (inputs of the "
        "passes, the draws' random numbers). Mean (max) per step. *race*: each draw takes one exponential "
        "per entry of its support (the scheme every committed record was drawn with; `draws=race`); "
        "*inverse CDF*: one uniform per draw, two for a beam's with replacement (a slot, then a token of its row; "
        "the default at plain temperature and top-p alone).",
        "",
        "| V | decoder | gamma | W | T | scheme | words / step | H2D bytes / step | steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        g, w = label(r["decoder"], r["overrides"])
        lines.append(f"| {r['vocab']} | {r['decoder']} | {g} | {w} | {r['setting'].replace(' race', '')} | "
                     f"{r['scheme'].replace('_', ' ')} | {r['words_mean']:.0f} ({r['words_max']}) | "
                     f"{r['h2d_bytes_mean']:.0f} ({r['h2d_bytes_max']}) | {r['steps']} |")
    lines.append(HOST_END)
    md = out.with_suffix(".md")
    text = md.read_text() if md.exists() else ""
    if HOST_BEGIN in text:
        text = text[: text.index(HOST_BEGIN)] + text[text.index(HOST_END) + len(HOST_END):].lstrip("\n")
    md.write_text(text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")
    print(f"-> {md}")


if __name__ == "__main__":
    main()

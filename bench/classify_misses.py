"""The unmet goals of an overhead run (``bench/overhead.py``'s JSON), sorted into the classes
``docs/speed.md`` explains ("What stops the settings the goals table misses"), with each
cell's ratio per token, per step and SpD's tokens per step over the system's.

    python bench/classify_misses.py results/bench/overhead_tiny_cpu.json

Rules, in order: MJGD / MTJD (no draft: the joint search); per step at most 1.5x SpD with
fewer tokens per step than SpD (acceptance with these models); top-p alone (the seeded draws
over wide nuclei); greedy (beam drafting's softmax and top-W per depth); else top-k with more
warped rows per emitted token.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

CLASSES = {
    "joint": "MJGD / MTJD: the joint search (no draft)",
    "acceptance": "fewer tokens per step (per step <= 1.5x SpD)",
    "top_p": "top-p alone: seeded draws over wide nuclei",
    "greedy_beam": "greedy beam drafting: softmax and top-W per depth",
    "top_k_rows": "top-k: more warped rows per emitted token",
}


def classify(report: dict) -> dict[str, list[dict]]:
    """class -> the unmet cells (goals against SpD whose 95% interval does not settle as met)."""
    out: dict[str, list[dict]] = defaultdict(list)
    for setting, v in report.items():
        mode = setting.split("/")[-1]
        for g, goal in v["goals"].items():
            if not g.endswith("x_spd") or goal["verdict"] == "met":
                continue
            s = g.split("_le_")[0]
            me, spd = v["systems"][s], v["systems"]["spd"]
            step = me["vs_spd_per_step"]["estimate"]
            acc = spd["tokens_per_step"] / me["tokens_per_step"]
            if s in ("mjgd", "mtjd"):
                c = "joint"
            elif step <= goal["limit"] and acc > 1.0:
                c = "acceptance"
            elif mode == "sample_nok":
                c = "top_p"
            elif mode == "greedy":
                c = "greedy_beam"
            else:
                c = "top_k_rows"
            out[c].append(dict(setting=setting, system=s, per_token=goal["ratio"], verdict=goal["verdict"],
                               per_step=step, spd_tokens_per_step_over_its=acc))
    return {c: out[c] for c in CLASSES if c in out}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="an overhead run's JSON (bench/overhead.py --out)")
    args = ap.parse_args(argv)
    classes = classify(json.loads(Path(args.run).read_text())["report"])
    for c, cells in classes.items():
        print(f"{CLASSES[c]}: {len(cells)}")
        for x in cells:
            print(f"    {x['setting']} {x['system']} {x['per_token']:.2f}x SpD per token ({x['verdict']}); "
                  f"per step {x['per_step']:.2f}x, SpD's tokens per step / its {x['spd_tokens_per_step_over_its']:.2f}")
    print(f"unmet: {sum(len(v) for v in classes.values())}")


if __name__ == "__main__":
    main()

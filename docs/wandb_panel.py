"""Draw what the W&B perplexity-vs-speed panel shows, from runs logged offline (no account).

    HF_HUB_OFFLINE=1 .venv/bin/python docs/wandb_panel.py [--out docs/wandb_panel.png]

Runs four decoders on the tiny random pair with ``logger=wandb logger.mode=offline`` into a
temporary ``wandb/`` folder, reads the runs back from their ``.wandb`` files
(``mtad.run.tracking.offline_runs``) and plots each run's summary the way the W&B scatter panel
does: x = ``tokens_per_s``, y = ``ppl``, one point per run, named by the run name. Error bars
are the runs' bootstrap intervals (``*_ci_low``/``*_ci_high``); lossless decoders are filled
markers, lossy ones hollow. The tiny pair is random, so the numbers mean nothing: the figure
shows the panel's layout (docs/wandb.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

DECODERS = ("multinomial", "spd", "mtad", "tree_mtad")
GROUP = "wandb_panel_demo"


def log_demo_runs(wandb_dir: Path) -> list[dict]:
    from mtad.run.cli import compose_config
    from mtad.run.evaluate import run
    from mtad.run.tracking import offline_runs

    for decoder in DECODERS:
        cfg = compose_config(
            [
                "+experiment=debug",
                f"decoder={decoder}",
                "logger=wandb",
                "logger.mode=offline",
                f"logger.group={GROUP}",
                f"logger.dir={wandb_dir}",
                "limit=2",
                f"output_dir={wandb_dir / 'runs' / decoder}",
            ]
        )
        run(cfg)
    return offline_runs(wandb_dir)


def _err(s: dict, key: str) -> list[list[float]] | None:
    lo, hi = s.get(f"{key}_ci_low"), s.get(f"{key}_ci_high")
    if lo is None or hi is None:
        return None
    return [[max(s[key] - lo, 0.0)], [max(hi - s[key], 0.0)]]


def plot_panel(runs: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(runs):
        s, color = r["summary"], colors[i % len(colors)]
        ax.errorbar(
            s["tokens_per_s"],
            s["ppl"],
            xerr=_err(s, "tokens_per_s"),
            yerr=_err(s, "ppl"),
            fmt="o",
            markersize=8,
            color=color,
            markerfacecolor=color if s.get("lossless") else "white",
            capsize=3,
            label=f"{r['name']}  ({'lossless' if s.get('lossless') else 'lossy'})",
        )
    ax.set_xlabel("summary: tokens_per_s")
    ax.set_ylabel("summary: ppl")
    groups = sorted({r["group"] for r in runs})
    ax.set_title(f"W&B scatter panel, group {', '.join(groups)}\n(tiny random pair: layout only)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best", title="run name", title_fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".png")))
    args = ap.parse_args()
    os.environ.setdefault("WANDB_SILENT", "true")
    with tempfile.TemporaryDirectory() as tmp:
        runs = log_demo_runs(Path(tmp))
        print(plot_panel(runs, Path(args.out)))


if __name__ == "__main__":
    main()

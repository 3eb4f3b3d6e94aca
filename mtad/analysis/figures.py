"""Figures of sweep results: perplexity vs speed per task, ablations over a knob.

Works on the points frame of ``mtad.analysis.render.load_points``. Every figure is titled with its
pair(s), task(s) and the settings its points share; error bars are the points' 95% bootstrap
intervals (marginal: each point's own; the paired comparisons are the claims report's and the
ablation's ratio panel); lossless decoders are filled markers (solid lines), lossy ones hollow
(dashed); axes name their statistic (``mtad.core.metrics.AXIS_LABELS``);
point labels are moved apart (adjustText); gamma and width are drawn on log2 axes with a tick
at each value swept. Every name from the records is drawn as plain text
(``mtad.core.escape.plot_text``: no mathtext). It knows nothing about files.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from mtad.analysis.tables import INTERVALS, _num, settings_line
from mtad.core.escape import plot_text
from mtad.core.metrics import AXIS_LABELS

#: Knobs drawn on a log2 axis in ablation plots (powers of two in the sweeps).
LOG2_KNOBS = ("gamma", "width")


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Non-dominated (speed, perplexity) points: faster is better, lower perplexity is better."""
    pts = sorted(
        ((s, p) for s, p in points if not (math.isnan(s) or math.isnan(p))),
        key=lambda t: (-t[0], t[1]),
    )
    front, best = [], math.inf
    for s, p in pts:
        if p < best:
            front.append((s, p))
            best = p
    return sorted(front)


def _errors(g: pd.DataFrame, col: str) -> list[list[float]] | None:
    """Asymmetric error bars from the interval column of ``col`` (0 where absent)."""
    ci = g.get(INTERVALS.get(col, ""))
    if ci is None or not any(isinstance(c, tuple) for c in ci):
        return None
    lo = [v - c[0] if isinstance(c, tuple) else 0.0 for v, c in zip(g[col], ci)]
    hi = [c[1] - v if isinstance(c, tuple) else 0.0 for v, c in zip(g[col], ci)]
    return [[max(x, 0.0) for x in lo], [max(x, 0.0) for x in hi]]


def _label_points(ax, texts, xs: Sequence[float] = (), ys: Sequence[float] = ()) -> None:
    """Move point labels apart (adjustText) so that they overlap neither one another nor the
    points (``xs``, ``ys``); the figure's layout is settled first (labels move in display space)."""
    if len(texts) > 1:
        from adjustText import adjust_text

        ax.figure.canvas.draw()
        adjust_text(texts, x=list(xs) or None, y=list(ys) or None, ax=ax, expand=(1.3, 1.8),
                    force_text=(0.4, 0.8), max_move=None, iter_lim=2000,
                    arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.5})


def _title(df: pd.DataFrame, head: str) -> str:
    pairs = ", ".join(str(p) for p in dict.fromkeys(df["pair"]))
    fixed = settings_line(df)
    return plot_text(f"{head} — {pairs}", 400) + (f"\n{plot_text(fixed, 400)}" if fixed else "")


#: x axes of the perplexity-vs-speed figure: column -> (axis label, title word).
#: ``block_efficiency`` (tokens per target pass) does not depend on the machine's load: the
#: speed proxy for records generated on a shared machine.
PARETO_X = {"tokens_per_s": (f"{AXIS_LABELS['tokens_per_s']}, 95% CI", "speed"),
            "block_efficiency": (f"{AXIS_LABELS['block_efficiency']}: tokens per step, 95% CI",
                                 "block efficiency")}
#: What the error bars of a Pareto panel are, under its title.
PARETO_CAPTION = "bars: each point's marginal 95% CI; paired comparisons: results/claims/claims.md"


def _n_text(sub: pd.DataFrame) -> str:
    """"n = 30 examples per point" (or the range when the points differ)."""
    ns = sorted({int(v) for v in sub.get("examples", pd.Series(dtype=float)).dropna()})
    if not ns:
        return ""
    return f"n = {ns[0]} examples per point" if len(ns) == 1 else f"n = {ns[0]}–{ns[-1]} examples per point"


def plot_pareto(df: pd.DataFrame, task: str, ax=None, x: str = "tokens_per_s", caption: str = PARETO_CAPTION):
    """Perplexity vs ``x`` (``PARETO_X``: tokens/s, or block efficiency) for one task: a point
    per run with its bootstrap intervals, filled = lossless decoder, hollow = lossy; marker per
    pair; the Pareto front (higher x, lower perplexity) as a step; ``caption`` under the title
    (where the paired comparisons of these points are)."""
    import matplotlib.pyplot as plt

    if x not in PARETO_X:
        raise ValueError(f"pareto x={x!r}: one of {', '.join(PARETO_X)}")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.8))
    sub = df[(df["task"] == task) & (df["status"] == "done")].dropna(subset=[x, "perplexity"])
    markers = "osD^vP*X"
    texts: list = []
    points_x: list[float] = []
    points_y: list[float] = []
    for i, (pair, g) in enumerate(sub.groupby("pair", sort=False)):
        for lossless, h in g.groupby(g["lossless"].eq(True), sort=False):
            color = f"C{i}"
            ax.errorbar(
                h[x],
                h["perplexity"],
                xerr=_errors(h, x),
                yerr=_errors(h, "perplexity"),
                fmt=markers[i % len(markers)],
                color=color,
                markerfacecolor=color if lossless else "white",
                markersize=7,
                capsize=2,
                elinewidth=0.8,
                label=plot_text((f"{pair}: " if sub["pair"].nunique() > 1 else "")
                                + ("lossless (filled)" if lossless else "lossy (hollow)")),
            )
        # points at the same place (e.g. MTAD and tree-MTAD at width 1: one algorithm, the same
        # records) get one joined label instead of two labels drawn over each other
        at: dict[tuple[float, float], list[str]] = {}
        for _, r in g.iterrows():
            at.setdefault((float(r[x]), float(r["perplexity"])), []).append(str(r["label"]))
        texts += [ax.text(px, py, plot_text(" = ".join(labels)), fontsize=7)
                  for (px, py), labels in at.items()]
        points_x += [px for px, _ in at]
        points_y += [py for _, py in at]
        front = pareto_front(list(zip(g[x], g["perplexity"])))
        if len(front) > 1:
            xs, ys = zip(*front)
            ax.step(xs, ys, where="post", linestyle="--", linewidth=1.0, alpha=0.7, color=f"C{i}",
                    label=plot_text((f"{pair}: " if sub["pair"].nunique() > 1 else "") + "Pareto front"))
    ax.set_xlabel(PARETO_X[x][0])
    ax.set_ylabel(f"{AXIS_LABELS['perplexity']}, 95% CI")
    n_text = _n_text(sub)
    head = f"perplexity vs {PARETO_X[x][1]}: {task}" + (f" ({n_text})" if n_text else "")  # _title escapes
    ax.set_title(_title(sub if len(sub) else df, head) + (f"\n{caption}" if len(sub) else ""),
                 fontsize=8)
    if sub.empty:
        states = sorted(set(df.loc[df["task"] == task, "status"].dropna()))
        why = f"\n({plot_text(', '.join(map(str, states)))}: see the table's notes)" if states else ""
        ax.text(0.5, 0.5, f"no finished runs{why}", ha="center", va="center",
                transform=ax.transAxes)
    else:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    _label_points(ax, texts, points_x, points_y)
    return ax


def _knob_axis(ax, knob: str, values: Sequence[float]) -> None:
    """A tick at each value swept, the axis padded around them; log2 scale for ``LOG2_KNOBS``
    with positive values."""
    vals = sorted(set(values))
    if not vals:
        return
    log2 = knob in LOG2_KNOBS and min(vals) > 0
    if log2:
        ax.set_xscale("log", base=2)
        ax.set_xlim(vals[0] / 2 ** 0.3, vals[-1] * 2 ** 0.3)
    else:
        pad = 0.08 * (vals[-1] - vals[0]) or 0.5
        ax.set_xlim(vals[0] - pad, vals[-1] + pad)
    ax.set_xticks(vals)
    ax.set_xticklabels([str(int(v)) if float(v).is_integer() else f"{v:g}" for v in vals])
    ax.minorticks_off()


#: Ablation panels, the paper's (quality, then tokens per target pass): (column, axis label).
#: No wall-clock panel: a curve's points may come from runs under different loads and thread
#: counts (the default point is the claims'), so their tokens/s are not comparable; the table
#: keeps them with that caveat, and speed is the interleaved benchmark's.
ABLATION_PANELS = (("perplexity", AXIS_LABELS["perplexity"]),
                   ("block_efficiency", AXIS_LABELS["block_efficiency"]))
#: Identity keys that vary between points without being a knob of the decoder: never an
#: ablation axis (a point at another number of examples is not a setting of the algorithm).
NOT_KNOBS = ("limit", "seed", "max_new_tokens")


def _dodge(knob: str, values: Sequence[float], k: int, n: int, grid: Sequence[float]) -> list[float]:
    """x positions of the k-th of n lines at ``values``, moved apart so that equal knob values
    do not hide each other's intervals: by a fraction of the smallest spacing of ``grid`` (the
    values swept), multiplicative on a log2 axis."""
    if n < 2:
        return list(values)
    off = (k - (n - 1) / 2) * 0.12  # in units of the smallest spacing (log2 units on a log axis)
    if knob in LOG2_KNOBS and min(values, default=0) > 0:
        return [v * 2 ** off for v in values]
    vals = sorted(set(grid))
    step = min((b - a for a, b in zip(vals, vals[1:])), default=1.0)
    return [v + off * step for v in values]


def plot_ablation(df: pd.DataFrame, knob: str, paired: pd.DataFrame | None = None, default=None):
    """Ablation over ``knob``: a row per task (tasks differ in scale), columns perplexity and
    block efficiency vs the knob with 95% intervals, a line per (pair, decoder), decoders
    moved apart slightly on x; lossless decoders solid, lossy dashed. With ``paired`` (the
    frame of ``mtad.analysis.render.paired_vs_default``), a last column: perplexity over that
    at the knob's ``default``, paired over examples."""
    import matplotlib.pyplot as plt

    sub = df[df["status"] == "done"].copy()
    sub["_x"] = [_num(ident.get(knob)) for ident in sub["_identity"]]
    sub = sub.dropna(subset=["_x"])
    # every value the sweep asks for, finished or not: the same x axis in every panel
    grid = sorted({x for x in (_num(i.get(knob)) for i in df["_identity"]) if not math.isnan(x)}
                  | set(sub["_x"]))
    tasks = list(dict.fromkeys((sub if len(sub) else df)["task"]))
    has_paired = paired is not None and not paired.empty
    ncol = len(ABLATION_PANELS) + has_paired
    fig, axes = plt.subplots(max(len(tasks), 1), ncol, squeeze=False, sharex=True,
                             figsize=(4.4 * ncol, 0.6 + 3.3 * max(len(tasks), 1)))
    many_pairs = sub["pair"].nunique() > 1
    colors = {}
    for r, task in enumerate(tasks):
        lines = list(sub[sub["task"] == task].groupby(["pair", "decoder"], sort=False))
        for k, ((pair, dec), g) in enumerate(lines):
            g = g.sort_values("_x")
            lossless = bool(g["lossless"].eq(True).all())
            name = plot_text(f"{dec}" + (f" / {pair}" if many_pairs else ""))
            color = colors.setdefault(name, f"C{len(colors)}")
            xs = _dodge(knob, list(g["_x"]), k, len(lines), grid)
            for ax, (col, _) in zip(axes[r], ABLATION_PANELS):
                ax.errorbar(xs, g[col], yerr=_errors(g, col), marker="o", capsize=2, color=color,
                            markerfacecolor=color if lossless else "white",
                            linestyle="-" if lossless else "--", label=name)
            if has_paired:
                q = paired[(paired["pair"] == pair) & (paired["task"] == task) & (paired["decoder"] == dec)]
                q = q.sort_values(knob)
                lo = [max(v - a, 0.0) if not math.isnan(a) else 0.0 for v, a in zip(q["ratio"], q["low"])]
                hi = [max(h - v, 0.0) if not math.isnan(h) else 0.0 for v, h in zip(q["ratio"], q["high"])]
                axes[r][-1].errorbar(_dodge(knob, list(q[knob]), k, len(lines), grid), q["ratio"],
                                     yerr=[lo, hi], marker="o", capsize=2, color=color,
                                     markerfacecolor=color if lossless else "white",
                                     linestyle="-" if lossless else "--", label=name)
        labels = [label for _, label in ABLATION_PANELS]
        if has_paired:
            labels.append(f"PPL ÷ PPL at {plot_text(f'{knob}={default}')}\n(paired over examples)")
            axes[r][-1].axhline(1.0, color="0.5", lw=0.8, zorder=0)
        for c, (ax, label) in enumerate(zip(axes[r], labels)):
            ax.set_xlabel(plot_text(knob))
            ax.set_ylabel(label)
            ax.set_title(plot_text(task), fontsize=9)
            ax.grid(alpha=0.3)
            _knob_axis(ax, knob, grid)
            if c == 0 and lines:
                ax.legend(fontsize=7, title="filled, solid = lossless\nhollow, dashed = lossy",
                          title_fontsize=7)
    n_text = _n_text(sub)
    head = f"Ablation over {knob} on {', '.join(str(t) for t in tasks)}" + (f" ({n_text})" if n_text else "")
    fig.suptitle(_title(sub if len(sub) else df, head), fontsize=10)
    fig.tight_layout()
    return fig

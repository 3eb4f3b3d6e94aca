"""Sweep results -> the paper's tables and figures (Markdown, LaTeX, CSV, PNG).

Reads only files under a results folder, through ``mtad.results`` (a sweep's
``<root>/<sweep>/`` with ``sweep.json``, a Hydra multirun folder, or one run folder), so it
reruns alone:

    python -m mtad.render results/sweeps/table2_smoke --out results/table2_smoke [--wandb]

Writes to ``--out``:
- ``table2.md``, ``table2.tex``, ``table2.csv``: one table per model pair; rows = decoders
  (plus the knobs that vary among a decoder's points, e.g. ``mtad (gamma=6)``); per task:
  score, perplexity, tokens/s, J/token, block efficiency, speedup vs multinomial and vs SpD;
- ``points.csv``: one numeric row per point (status and reason included);
- ``pareto_<task>.png`` and ``pareto.png``: perplexity vs tokens/s, Pareto front drawn;
- ``ablation_<knob>.png``: tokens/s, block efficiency and perplexity vs each knob that varies
  among a decoder's points (gamma, tau, width, ...).

Conventions: a value that is missing (point not run, skipped, failed, metric absent) shows
as "–", never 0; J/token shows "n/a" when the run's energy meter was unavailable. Speedups
are tokens/s over the baseline run (multinomial, SpD) of the same sweep with the same pair,
task and sampling/length settings (``mtad.metrics``). It knows nothing about how the runs
were made; metric definitions live in ``mtad.metrics``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

MISSING = "–"
NOT_AVAILABLE = "n/a"
#: Row order of the table (others follow alphabetically).
DECODER_ORDER = (
    "multinomial",
    "greedy",
    "spd",
    "specinfer",
    "spectr",
    "mcss",
    "mcns",
    "typical",
    "bild",
    "mjgd",
    "mtad",
    "tree_mtad",
)
#: Settings a baseline must share with a run for a speedup to be computed.
BASELINE_KEYS = ("pair", "task", "temperature", "top_k", "top_p", "max_new_tokens", "limit")
#: Table columns per task: (column, header, format).
COLUMNS = (
    ("score", "score", "{:.3f}"),
    ("perplexity", "PPL", "{:.2f}"),
    ("tokens_per_s", "tok/s", "{:.2f}"),
    ("j_per_token", "J/tok", "{:.3g}"),
    ("block_efficiency", "BE", "{:.2f}"),
    ("speedup_multinomial", "×MN", "{:.2f}×"),
    ("speedup_spd", "×SpD", "{:.2f}×"),
)
#: Knobs first looked for when labelling variants and drawing ablations.
KNOBS = (
    "gamma",
    "tau",
    "width",
    "temperature",
    "top_k",
    "top_p",
    "max_new_tokens",
    "limit",
    "seed",
)


# ----------------------------------------------------------------------------- loading


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, f"{key}."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list) else v
    return out


def _num(v) -> float:
    """A float, NaN for None/missing/non-numeric (never 0)."""
    if v is None or isinstance(v, bool):
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def point_dirs(sweep_dir: Path, only_current: bool = True) -> list[Path]:
    """Point folders (``mtad.results.point_dirs``): a sweep's current points, a multirun's
    jobs, or a single run folder."""
    from mtad.results import point_dirs as _point_dirs

    return _point_dirs(sweep_dir, only_current)


def load_points(sweep_dir: str | Path, only_current: bool = True) -> pd.DataFrame:
    """One row per point: identity (pair, task, decoder, knobs), status and metrics.

    Folders are read through ``mtad.results.load_point``; two folders holding the same point
    (legacy duplicates) give one row, the finished one.
    """
    from mtad.results import load_point

    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"no sweep folder {sweep_dir}")
    rows = []
    points = [load_point(d) for d in point_dirs(sweep_dir, only_current)]
    points.sort(key=lambda p: p["status"] != "done")
    seen: set[str] = set()
    for pt in points:
        key = pt["identity_hash"] or str(pt["dir"])
        if key in seen:
            continue
        seen.add(key)
        summary, ident, choices = pt["summary"], pt["config"], pt["choices"]
        row: dict[str, Any] = {
            "hash": pt["dir"].name,
            "pair": choices.get("model") or (ident.get("model") or {}).get("name"),
            "task": choices.get("task") or (ident.get("task") or {}).get("name"),
            "decoder": choices.get("decoder")
            or str((ident.get("decoder") or {}).get("_target_", "?")).rsplit(".", 1)[-1].lower(),
            "status": pt["status"],
            "reason": pt["reason"],
            **{k: ident.get(k) for k in KNOBS},
            "_identity": _flatten(ident),
        }
        if summary is not None:
            m = summary.get("metrics") or {}
            score = summary.get("score") or {}
            row.update(
                status="done",
                pair=row["pair"] or (summary.get("model") or {}).get("pair"),
                task=row["task"] or summary.get("task"),
                decoder=choices.get("decoder") or summary.get("decoder"),
                score=_num(score.get("value")),
                score_metric=score.get("metric"),
                score_stderr=_num(score.get("stderr")),
                perplexity=_num(m.get("perplexity")),
                tokens_per_s=_num(m.get("tokens_per_s")),
                ms_per_token=_num(m.get("ms_per_token")),
                j_per_token=_num(m.get("j_per_token")),
                block_efficiency=_num(m.get("block_efficiency")),
                acceptance_rate=_num(m.get("acceptance_rate")),
                examples=m.get("examples"),
                new_tokens=m.get("new_tokens"),
                energy_source=summary.get("energy_source"),
                energy_unavailable=summary.get("energy_source") is None,
                data_source=summary.get("data_source"),
                data_substitute=bool(summary.get("data_substitute")),
            )
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    for col, *_ in COLUMNS:
        if col not in df:
            df[col] = math.nan
    df["label"] = variant_labels(df)
    return add_speedups(df)


def variant_labels(df: pd.DataFrame) -> pd.Series:
    """Row labels: the decoder, plus the settings that vary among its points of one (pair, task)."""
    varying: set[str] = set()
    for _, g in df.groupby(["pair", "task", "decoder"], dropna=False):
        if len(g) < 2:
            continue
        flat = pd.DataFrame(list(g["_identity"]))
        for col in flat.columns:
            if flat[col].astype(str).nunique() > 1:
                varying.add(col)
    # decoder.gamma follows gamma (interpolation): name the top-level knob only
    varying = {
        k for k in varying if not (k.startswith("decoder.") and k.split(".", 1)[1] in varying)
    }
    keys = sorted(varying, key=lambda k: (k not in KNOBS, KNOBS.index(k) if k in KNOBS else 0, k))

    def label(row) -> str:
        parts = [f"{k}={row['_identity'].get(k)}" for k in keys if k in row["_identity"]]
        return f"{row['decoder']} ({', '.join(parts)})" if parts else str(row["decoder"])

    return df.apply(label, axis=1)


def varying_knobs(df: pd.DataFrame) -> list[str]:
    """Identity keys that vary among the points of one (pair, task, decoder): the ablation axes."""
    labels = df["label"].str.extract(r"\((.*)\)$")[0].dropna()
    keys: list[str] = []
    for s in labels:
        for part in s.split(", "):
            k = part.split("=", 1)[0]
            if k not in keys:
                keys.append(k)
    return keys


def add_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """``speedup_multinomial`` and ``speedup_spd``: tokens/s over the matching baseline run's.

    The baseline must share ``BASELINE_KEYS``; among several, those that also share the
    ablated settings (``varying_knobs``: gamma, draft size, ...) are preferred; the rest are
    averaged.
    """
    df = df.copy()
    varying = varying_knobs(df) if "label" in df else []
    for baseline, col in (("multinomial", "speedup_multinomial"), ("spd", "speedup_spd")):
        df[col] = math.nan
        base = df[(df["decoder"] == baseline) & (df["status"] == "done")]
        for i, row in df[df["status"] == "done"].iterrows():
            cand = base
            for k in BASELINE_KEYS:
                cand = cand[cand[k].astype(str) == str(row[k])]
            for k in varying:
                if len(cand) < 2:
                    break
                value = str(row["_identity"].get(k))
                same = cand[[str(ident.get(k)) == value for ident in cand["_identity"]]]
                cand = same if len(same) else cand
            rate = cand["tokens_per_s"].mean() if len(cand) else math.nan
            if rate and not math.isnan(rate) and not math.isnan(row["tokens_per_s"]):
                df.at[i, col] = row["tokens_per_s"] / rate
    return df


# ----------------------------------------------------------------------------- tables


def _variant_key(label: str) -> tuple:
    """Sort key of ``"mtad (gamma=8, tau=0.5)"``: the values, numbers as numbers (2 < 8 < 16)."""
    inner = label[label.index("(") + 1 : -1] if label.endswith(")") and "(" in label else ""
    key = []
    for part in filter(None, inner.split(", ")):
        value = part.split("=", 1)[-1]
        num = _num(value)
        key.append((0, num, "") if not math.isnan(num) else (1, 0.0, value))
    return tuple(key)


def _order(labels: Sequence[str], decoders: Sequence[str]) -> list[str]:
    def key(item):
        label, dec = item
        return (
            DECODER_ORDER.index(dec) if dec in DECODER_ORDER else len(DECODER_ORDER),
            dec,
            _variant_key(label),
        )

    seen = dict.fromkeys(zip(labels, decoders))
    return [label for label, _ in sorted(seen, key=key)]


def _task_order(tasks: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(tasks))


def format_cell(row: pd.Series | None, col: str, fmt: str = "{:.4g}") -> str:
    if row is None or row.get("status") != "done":
        return MISSING
    v = row.get(col)
    if col == "j_per_token" and (v is None or math.isnan(v)) and row.get("energy_unavailable"):
        return NOT_AVAILABLE
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return MISSING
    return fmt.format(v)


def table2(df: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """Per model pair: (text, numbers), rows = variants, columns = (task, metric).

    ``text`` holds the display strings ("–" missing, "n/a" no energy meter); ``numbers`` the
    floats (NaN where missing).
    """
    out = {}
    for pair in dict.fromkeys(df["pair"]):
        sub = df[df["pair"] == pair]
        rows = _order(list(sub["label"]), list(sub["decoder"]))
        tasks = _task_order(list(sub["task"]))
        cols = pd.MultiIndex.from_tuples(
            [(t, h) for t in tasks for _, h, _ in COLUMNS], names=["task", "metric"]
        )
        text = pd.DataFrame(MISSING, index=pd.Index(rows, name="decoder"), columns=cols)
        nums = pd.DataFrame(math.nan, index=pd.Index(rows, name="decoder"), columns=cols)
        for _, r in sub.iterrows():
            for col, head, fmt in COLUMNS:
                text.loc[r["label"], (r["task"], head)] = format_cell(r, col, fmt)
                if r["status"] == "done":
                    nums.loc[r["label"], (r["task"], head)] = _num(r.get(col))
        out[str(pair)] = (text, nums)
    return out


def csv_table(sub: pd.DataFrame, text: pd.DataFrame) -> pd.DataFrame:
    """The table of one pair for CSV: plain numbers (4 significant digits), "–" / "n/a" kept."""
    out = pd.DataFrame(
        MISSING,
        index=text.index,
        columns=[
            f"{t}/{c}"
            for t in dict.fromkeys(text.columns.get_level_values(0))
            for c, _, _ in COLUMNS
        ],
    )
    for _, r in sub.iterrows():
        for col, _, _ in COLUMNS:
            out.loc[r["label"], f"{r['task']}/{col}"] = format_cell(r, col)
    out.insert(0, "pair", str(sub["pair"].iloc[0]))
    return out.reset_index()


def notes(df: pd.DataFrame) -> list[str]:
    """Footnotes: skipped/failed points with reasons, stand-in data, unavailable energy."""
    out = []
    for _, r in df[df["status"].isin(["skipped", "failed", "pending"])].iterrows():
        why = f": {r['reason']}" if r.get("reason") else ""
        out.append(f"{r['pair']} / {r['task']} / {r['label']}: {r['status']}{why}")
    if "data_substitute" in df:
        subs = sorted({str(t) for t, s in zip(df["task"], df["data_substitute"]) if s is True})
        if subs:
            out.append(f"stand-in data (not the paper's): {', '.join(subs)}")
    if "energy_unavailable" in df and df["energy_unavailable"].eq(True).any():
        out.append(
            f"J/tok {NOT_AVAILABLE}: no energy meter on the machine that ran the point (NVML/RAPL)"
        )
    return out


def to_markdown(text: pd.DataFrame, title: str | None = None) -> str:
    heads = ["decoder"] + [f"{t} {h}" for t, h in text.columns]
    lines = [f"### {title}", ""] if title else []
    lines.append("| " + " | ".join(heads) + " |")
    lines.append("| --- | " + " | ".join("---:" for _ in text.columns) + " |")
    for label, row in text.iterrows():
        lines.append("| " + " | ".join([str(label), *map(str, row.values)]) + " |")
    return "\n".join(lines) + "\n"


def _tex(s: str) -> str:
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("_", r"\_"),
        ("%", r"\%"),
        ("&", r"\&"),
        ("#", r"\#"),
        ("×", r"$\times$"),
        ("–", "--"),
    ):
        s = s.replace(a, b)
    return s


def to_latex(text: pd.DataFrame, caption: str | None = None) -> str:
    tasks = list(dict.fromkeys(text.columns.get_level_values(0)))
    per = len(COLUMNS)
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        r"\setlength{\tabcolsep}{3pt}",
        r"\begin{tabular}{l" + "r" * (per * len(tasks)) + "}",
        r"\toprule",
    ]
    lines.append(
        " & " + " & ".join(rf"\multicolumn{{{per}}}{{c}}{{{_tex(t)}}}" for t in tasks) + r" \\"
    )
    lines.append(
        "".join(rf"\cmidrule(lr){{{2 + i * per}-{1 + (i + 1) * per}}}" for i in range(len(tasks)))
    )
    lines.append("decoder & " + " & ".join(_tex(h) for _, h in text.columns) + r" \\")
    lines.append(r"\midrule")
    for label, row in text.iterrows():
        lines.append(" & ".join([_tex(str(label)), *(_tex(str(v)) for v in row.values)]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if caption:
        lines.append(rf"\caption{{{_tex(caption)}}}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- figures


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


def plot_pareto(df: pd.DataFrame, task: str, ax=None):
    """Perplexity vs tokens/s for one task: a point per run (marker per pair), the front as a step."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 4))
    sub = df[(df["task"] == task) & (df["status"] == "done")].dropna(
        subset=["tokens_per_s", "perplexity"]
    )
    markers = "osD^vP*X"
    for i, (pair, g) in enumerate(sub.groupby("pair", sort=False)):
        ax.scatter(
            g["tokens_per_s"], g["perplexity"], marker=markers[i % len(markers)], label=str(pair)
        )
        for _, r in g.iterrows():
            ax.annotate(
                str(r["label"]),
                (r["tokens_per_s"], r["perplexity"]),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
        front = pareto_front(list(zip(g["tokens_per_s"], g["perplexity"])))
        if len(front) > 1:
            xs, ys = zip(*front)
            ax.step(xs, ys, where="post", linestyle="--", linewidth=0.8, alpha=0.7)
    ax.set_xlabel("tokens/s")
    ax.set_ylabel("perplexity (target)")
    ax.set_title(str(task))
    if sub.empty:
        ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
    elif sub["pair"].nunique() > 1:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return ax


def plot_ablation(df: pd.DataFrame, knob: str):
    """tokens/s, block efficiency and perplexity vs ``knob``: a line per (pair, task, decoder)."""
    import matplotlib.pyplot as plt

    sub = df[df["status"] == "done"].copy()
    sub["_x"] = [_num(ident.get(knob)) for ident in sub["_identity"]]
    sub = sub.dropna(subset=["_x"])
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for (pair, task, dec), g in sub.groupby(["pair", "task", "decoder"], sort=False):
        g = g.sort_values("_x")
        name = f"{dec} / {task}" + (f" / {pair}" if sub["pair"].nunique() > 1 else "")
        for ax, col in zip(axes, ("tokens_per_s", "block_efficiency", "perplexity")):
            ax.plot(g["_x"], g[col], marker="o", label=name)
    for ax, col in zip(axes, ("tokens/s", "block efficiency", "perplexity")):
        ax.set_xlabel(knob)
        ax.set_ylabel(col)
        ax.grid(alpha=0.3)
    if len(sub):
        axes[0].legend(fontsize=7)
    fig.suptitle(f"ablation: {knob}")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- all outputs


def render(
    sweep_dir: str | Path, out_dir: str | Path, *, only_current: bool = True, logger=None
) -> dict[str, Path]:
    """Write every table and figure of one sweep folder into ``out_dir``; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep_dir, out_dir = Path(sweep_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    df = load_points(sweep_dir, only_current)
    written: dict[str, Path] = {}
    if df.empty:
        (out_dir / "table2.md").write_text(f"No points under {sweep_dir}.\n")
        return {"table2.md": out_dir / "table2.md"}
    name = sweep_dir.name
    tables = table2(df)
    footnotes = notes(df)
    md = [
        f"# {name}: Table 2",
        "",
        f"Rendered from `{sweep_dir}` by `python -m mtad.render {sweep_dir} --out {out_dir}`. "
        f"{MISSING} = not run / skipped / failed; {NOT_AVAILABLE} = no energy meter. "
        "×MN / ×SpD = tokens/s over the multinomial / SpD run of the same pair, task and settings.",
        "",
    ]
    tex, csv_parts = [], []
    for pair, (text, _) in tables.items():
        md.append(to_markdown(text, title=pair))
        tex.append(to_latex(text, caption=f"{name}: {pair}"))
        csv_parts.append(csv_table(df[df["pair"] == pair], text))
    if footnotes:
        md += ["", "Notes:", *[f"- {n}" for n in footnotes], ""]
    for fname, content in (("table2.md", "\n".join(md)), ("table2.tex", "\n".join(tex))):
        (out_dir / fname).write_text(content)
        written[fname] = out_dir / fname
    pd.concat(csv_parts, ignore_index=True).to_csv(out_dir / "table2.csv", index=False)
    written["table2.csv"] = out_dir / "table2.csv"
    cols = [
        "hash",
        "pair",
        "task",
        "decoder",
        "label",
        "status",
        "reason",
        *KNOBS,
        "score",
        "score_metric",
        "perplexity",
        "tokens_per_s",
        "ms_per_token",
        "j_per_token",
        "energy_source",
        "block_efficiency",
        "acceptance_rate",
        "speedup_multinomial",
        "speedup_spd",
        "examples",
        "new_tokens",
        "data_source",
        "data_substitute",
    ]
    df.reindex(columns=cols).to_csv(out_dir / "points.csv", index=False)
    written["points.csv"] = out_dir / "points.csv"

    tasks = _task_order(list(df["task"]))
    for task in tasks:
        ax = plot_pareto(df, task)
        path = out_dir / f"pareto_{task}.png"
        ax.figure.tight_layout()
        ax.figure.savefig(path, dpi=120)
        plt.close(ax.figure)
        written[path.name] = path
    ncol = min(3, len(tasks))
    nrow = math.ceil(len(tasks) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5 * ncol, 4 * nrow), squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        plot_pareto(df, task, ax=ax)
    for ax in list(axes.flat)[len(tasks) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out_dir / "pareto.png", dpi=120)
    plt.close(fig)
    written["pareto.png"] = out_dir / "pareto.png"
    for knob in varying_knobs(df):
        fig = plot_ablation(df, knob)
        path = out_dir / f"ablation_{knob}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written[path.name] = path

    if logger is not None:
        logger.start(
            {"sweep": name, "sweep_dir": str(sweep_dir), "points": len(df)}, name=f"render-{name}"
        )
        for pair, (_, nums) in tables.items():
            flat = nums.copy()
            flat.columns = [f"{t}/{h}" for t, h in nums.columns]
            logger.log_table(f"table2/{pair}", flat.reset_index())
        logger.log_table(
            "points",
            df.reindex(columns=cols).astype(object).where(df.reindex(columns=cols).notna(), None),
        )
        logger.log_image("pareto", str(out_dir / "pareto.png"))
        for task in tasks:
            logger.log_image(f"pareto/{task}", str(out_dir / f"pareto_{task}.png"))
        logger.finish()
    return written


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mtad.render", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", help="results/sweeps/<sweep>")
    ap.add_argument("--out", help="output folder (default: results/<sweep>)")
    ap.add_argument(
        "--all", action="store_true", help="every point folder, not only those in sweep.json"
    )
    ap.add_argument(
        "--wandb", action="store_true", help="log the tables and the Pareto charts to W&B"
    )
    ap.add_argument("--wandb-project", default="mtad")
    args = ap.parse_args(argv)
    sweep_dir = Path(args.sweep_dir)
    out = Path(args.out) if args.out else Path("results") / sweep_dir.name
    logger = None
    if args.wandb:
        from mtad.tracking import WandbLogger

        logger = WandbLogger(project=args.wandb_project, group=sweep_dir.name, tags=["render"])
    written = render(sweep_dir, out, only_current=not args.all, logger=logger)
    print(f"rendered {sweep_dir} -> {out}: {', '.join(sorted(written))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sweep results -> the paper's tables and figures (Markdown, LaTeX, CSV, PNG).

Reads only files under a results folder, through ``mtad.results`` (a sweep's
``<root>/<sweep>/`` with ``sweep.json``, a Hydra multirun folder, or one run folder), so it
reruns alone:

    python -m mtad.render results/sweeps/table2_smoke --out results/table2_smoke [--wandb]

Writes to ``--out``:
- ``table2.md``, ``table2.tex``, ``table2.csv``: per model pair, one block per task as in the
  paper, decoders as rows (plus the knobs that vary among a decoder's points, e.g.
  ``mtad (gamma=6)``): n, score, perplexity and tokens/s with 95% bootstrap intervals,
  J/token, block efficiency, speedup vs multinomial and vs SpD; one note per distinct reason
  (skipped, failed, speedup not computable, stand-in data, no energy meter), no absolute
  paths. Markdown from ``DataFrame.to_markdown``, LaTeX from ``Styler.to_latex``. A sweep
  whose decoders vary a knob is titled as an ablation over it;
- ``points.csv``: one numeric row per point (status and reason included);
- ``pareto_<task>.png`` (and ``pareto.png`` when there are several tasks): perplexity vs
  tokens/s with interval error bars, lossless decoders filled, lossy hollow, Pareto front;
- ``ablation_<knob>.png``: tokens/s, block efficiency and perplexity vs each knob that varies
  among a decoder's points (log2 axis for gamma and width).

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
import re
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
#: Table columns per task: (column, header, format). ``INTERVALS`` adds "[low, high]".
COLUMNS = (
    ("examples", "n", "{:.0f}"),
    ("score", "score", "{:.3f}"),
    ("perplexity", "PPL", "{:.2f}"),
    ("tokens_per_s", "tok/s", "{:.2f}"),
    ("j_per_token", "J/tok", "{:.3g}"),
    ("block_efficiency", "BE", "{:.2f}"),
    ("speedup_multinomial", "×MN", "{:.2f}×"),
    ("speedup_spd", "×SpD", "{:.2f}×"),
)
#: Columns shown with their 95% bootstrap interval over examples: column -> interval column.
INTERVALS = {"score": "score_ci", "perplexity": "perplexity_ci", "tokens_per_s": "tokens_per_s_ci"}
#: Speedup columns: column -> (baseline decoder, header).
SPEEDUPS = {"speedup_multinomial": ("multinomial", "×MN"), "speedup_spd": ("spd", "×SpD")}
#: Settings shared by every point of a table, shown under its title: key -> label.
SETTINGS = {
    "temperature": "T",
    "top_k": "top-k",
    "top_p": "top-p",
    "max_new_tokens": "new tokens",
    "limit": "examples per task",
    "seed": "seed",
}
#: Knobs drawn on a log2 axis in ablation plots (powers of two in the sweeps).
LOG2_KNOBS = ("gamma", "width")
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


def _interval(v) -> tuple[float, float] | None:
    """``[low, high]`` as floats, None when absent or not finite."""
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        return None
    lo, hi = _num(v[0]), _num(v[1])
    return None if math.isnan(lo) or math.isnan(hi) else (lo, hi)


def score_interval(point_dir: Path) -> tuple[float, float] | None:
    """95% bootstrap interval of the mean score over a point's examples (``samples.jsonl``).

    For summaries that carry a standard error only; the same bootstrap as every other interval.
    """
    from mtad.metrics import bootstrap_ci
    from mtad.results.io import read_jsonl

    path = Path(point_dir) / "samples.jsonl"
    scores = [r["score"] for r in read_jsonl(path) if isinstance(r.get("score"), (int, float))]
    return _interval(bootstrap_ci(scores)) if len(scores) > 1 else None


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
                score_ci=_interval(score.get("ci")) or score_interval(pt["dir"]),
                perplexity=_num(m.get("perplexity")),
                perplexity_ci=_interval(m.get("perplexity_ci")),
                tokens_per_s=_num(m.get("tokens_per_s")),
                tokens_per_s_ci=_interval(m.get("tokens_per_s_ci")),
                lossless=summary.get("lossless"),
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


def format_cell(row: pd.Series | None, col: str, fmt: str = "{:.4g}", interval: bool = True) -> str:
    """A table cell: the value, with its interval ``[low, high]`` for ``INTERVALS`` columns."""
    if row is None or row.get("status") != "done":
        return MISSING
    v = row.get(col)
    if col == "j_per_token" and (v is None or math.isnan(v)) and row.get("energy_unavailable"):
        return NOT_AVAILABLE
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return MISSING
    text = fmt.format(v)
    ci = row.get(INTERVALS.get(col, ""), None) if interval else None
    if isinstance(ci, tuple):
        text += f" [{fmt.format(ci[0])}, {fmt.format(ci[1])}]"
    return text


def table2(df: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """Per model pair: (text, numbers), rows = variants, columns = (task, metric).

    ``text`` holds the display strings ("–" missing, "n/a" no energy meter, intervals in
    brackets); ``numbers`` the floats (NaN where missing). ``to_markdown`` and ``to_latex``
    lay them out one block per task.
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
    """The table of one pair for CSV: plain numbers (4 significant digits), "–" / "n/a" kept,
    intervals in ``<column>_ci_low`` / ``<column>_ci_high`` columns."""
    tasks = list(dict.fromkeys(text.columns.get_level_values(0)))
    names = []
    for t in tasks:
        for c, _, _ in COLUMNS:
            names.append(f"{t}/{c}")
            if c in INTERVALS:
                names += [f"{t}/{c}_ci_low", f"{t}/{c}_ci_high"]
    out = pd.DataFrame(MISSING, index=text.index, columns=names)
    for _, r in sub.iterrows():
        for col, _, _ in COLUMNS:
            out.loc[r["label"], f"{r['task']}/{col}"] = format_cell(r, col, interval=False)
            ci = r.get(INTERVALS.get(col, ""), None)
            if r["status"] == "done" and isinstance(ci, tuple):
                out.loc[r["label"], f"{r['task']}/{col}_ci_low"] = f"{ci[0]:.4g}"
                out.loc[r["label"], f"{r['task']}/{col}_ci_high"] = f"{ci[1]:.4g}"
    out.insert(0, "pair", str(sub["pair"].iloc[0]))
    return out.reset_index()


def scrub_paths(text: str) -> str:
    """``text`` without absolute paths: the working directory and home are dropped / ``~``,
    any other absolute path keeps its last two parts."""
    text = str(text)
    for root, short in ((str(Path.cwd().resolve()), "."), (str(Path.home()), "~")):
        if len(root) > 1:
            text = re.sub(re.escape(root) + r"(?=/|\b)", short, text)
    return re.sub(
        r"(?<![\w.~])/(?:[^\s/:,;'\"()]+/)+([^\s/:,;'\"()]+/?[^\s/:,;'\"()]*)", r".../\1", text
    )


def _where(g: pd.DataFrame, df: pd.DataFrame) -> str:
    """Which points of a group: per (pair, task), "every decoder" or the labels."""
    many_pairs = df["pair"].nunique() > 1
    parts = []
    for (pair, task), h in g.groupby(["pair", "task"], sort=False):
        every = set(df[df["pair"] == pair]["label"])
        who = (
            "every decoder"
            if set(h["label"]) >= every and len(every) > 1
            else ", ".join(h["label"])
        )
        parts.append(f"{pair} / {task}: {who}" if many_pairs else f"{task}: {who}")
    return "; ".join(parts)


def speedup_notes(df: pd.DataFrame) -> list[str]:
    """Why a ×MN / ×SpD cell of a finished point is empty, one note per reason."""
    out: list[str] = []
    done = df[df["status"] == "done"]
    for col, (baseline, head) in SPEEDUPS.items():
        reasons: dict[str, list[str]] = {}
        for (pair, task), g in done.groupby(["pair", "task"], sort=False):
            if not g[col].isna().any() or g["tokens_per_s"].isna().all():
                continue
            base = g[g["decoder"] == baseline]
            if base.empty:
                why = f"no {baseline} run finished for this pair and task"
            elif base["tokens_per_s"].isna().all():
                why = f"the {baseline} run has no tokens/s"
            else:
                why = f"no {baseline} run with the same sampling and length settings ({', '.join(BASELINE_KEYS[2:])})"
            reasons.setdefault(why, []).append(
                f"{pair} / {task}" if df["pair"].nunique() > 1 else str(task)
            )
        out += [f"{head} {MISSING} on {', '.join(where)}: {why}" for why, where in reasons.items()]
    return out


def notes(df: pd.DataFrame) -> list[str]:
    """Footnotes, one per distinct reason: skipped/failed/pending points, speedups that cannot
    be computed, stand-in data, unavailable energy. No absolute paths."""
    out = []
    bad = df[df["status"].isin(["skipped", "failed", "pending"])].copy()
    if not bad.empty:
        bad["_why"] = [scrub_paths(r) if isinstance(r, str) and r else "" for r in bad["reason"]]
        for (status, why), g in bad.groupby(["status", "_why"], sort=False):
            out.append(f"{status} ({_where(g, df)})" + (f": {why}" if why else ""))
    out += speedup_notes(df)
    if "data_substitute" in df:
        subs = sorted({str(t) for t, s in zip(df["task"], df["data_substitute"]) if s is True})
        if subs:
            out.append(f"stand-in data (not the paper's): {', '.join(subs)}")
    if "energy_unavailable" in df and df["energy_unavailable"].eq(True).any():
        out.append(
            f"J/tok {NOT_AVAILABLE}: no energy meter on the machine that ran the point (NVML/RAPL)"
        )
    return out


def settings_line(df: pd.DataFrame) -> str:
    """The settings every point shares (``SETTINGS``), e.g. "T=1.0, top-k 10, ..."."""
    parts = []
    for key, name in SETTINGS.items():
        values = df[key].dropna().astype(str).unique() if key in df else []
        if len(values) == 1:
            parts.append(f"{name}={values[0]}" if len(name) <= 2 else f"{name} {values[0]}")
    return ", ".join(parts)


def _task_block(text: pd.DataFrame, task: str) -> pd.DataFrame:
    block = text[task].copy()
    block.index.name = "decoder"
    block.columns = [
        f"{h} [95% CI]" if any(h == hh for c, hh, _ in COLUMNS if c in INTERVALS) else h
        for h in block.columns
    ]
    return block


def to_markdown(text: pd.DataFrame, title: str | None = None, metrics: dict | None = None) -> str:
    """One block per task (decoders as rows), as in the paper; ``metrics``: task -> score name."""
    lines = [f"## {title}", ""] if title else []
    for task in dict.fromkeys(text.columns.get_level_values(0)):
        metric = (metrics or {}).get(task)
        lines += [f"### {task}" + (f" (score: {metric})" if metric else ""), ""]
        block = _task_block(text, task)
        lines += [
            block.to_markdown(
                colalign=("left",) + ("right",) * block.shape[1], disable_numparse=True
            ),
            "",
        ]
    return "\n".join(lines)


def to_latex(text: pd.DataFrame, caption: str | None = None) -> str:
    """The same blocks as one LaTeX table (booktabs), rows = (task, decoder)."""
    blocks = {t: _task_block(text, t) for t in dict.fromkeys(text.columns.get_level_values(0))}
    frame = pd.concat(blocks, names=["task", "decoder"])
    styler = (
        frame.style.format(escape="latex")
        .format_index(escape="latex", axis=0)
        .format_index(escape="latex", axis=1)
        .hide(axis="index", names=True)
    )
    tex = styler.to_latex(
        hrules=True,
        clines="skip-last;data",
        multirow_align="t",
        caption=caption,
        column_format="ll" + "r" * frame.shape[1],
        position="t",
        position_float="centering",
    )
    tex = tex.replace("×", r"$\times$").replace("–", "--")
    return "% needs \\usepackage{booktabs,multirow}\n" + tex


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


def _errors(g: pd.DataFrame, col: str) -> list[list[float]] | None:
    """Asymmetric error bars from the interval column of ``col`` (0 where absent)."""
    ci = g.get(INTERVALS.get(col, ""))
    if ci is None or not any(isinstance(c, tuple) for c in ci):
        return None
    lo = [v - c[0] if isinstance(c, tuple) else 0.0 for v, c in zip(g[col], ci)]
    hi = [c[1] - v if isinstance(c, tuple) else 0.0 for v, c in zip(g[col], ci)]
    return [[max(x, 0.0) for x in lo], [max(x, 0.0) for x in hi]]


def _label_points(ax, texts) -> None:
    """Move point labels apart (adjustText) so that they do not overlap."""
    if len(texts) > 1:
        from adjustText import adjust_text

        adjust_text(texts, ax=ax, arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.5})


def _title(df: pd.DataFrame, head: str) -> str:
    pairs = ", ".join(str(p) for p in dict.fromkeys(df["pair"]))
    fixed = settings_line(df)
    return f"{head} — {pairs}" + (f"\n{fixed}" if fixed else "")


def plot_pareto(df: pd.DataFrame, task: str, ax=None):
    """Perplexity vs tokens/s for one task: a point per run with its bootstrap intervals,
    filled = lossless decoder, hollow = lossy; marker per pair; the Pareto front as a step."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.8))
    sub = df[(df["task"] == task) & (df["status"] == "done")].dropna(
        subset=["tokens_per_s", "perplexity"]
    )
    markers = "osD^vP*X"
    texts = []
    for i, (pair, g) in enumerate(sub.groupby("pair", sort=False)):
        for lossless, h in g.groupby(g["lossless"].eq(True), sort=False):
            color = f"C{i}"
            ax.errorbar(
                h["tokens_per_s"],
                h["perplexity"],
                xerr=_errors(h, "tokens_per_s"),
                yerr=_errors(h, "perplexity"),
                fmt=markers[i % len(markers)],
                color=color,
                markerfacecolor=color if lossless else "white",
                markersize=7,
                capsize=2,
                elinewidth=0.8,
                label=f"{pair}: {'lossless' if lossless else 'lossy'}"
                if sub["pair"].nunique() > 1
                else ("lossless" if lossless else "lossy"),
            )
        texts += [
            ax.text(r["tokens_per_s"], r["perplexity"], f" {r['label']}", fontsize=7)
            for _, r in g.iterrows()
        ]
        front = pareto_front(list(zip(g["tokens_per_s"], g["perplexity"])))
        if len(front) > 1:
            xs, ys = zip(*front)
            ax.step(xs, ys, where="post", linestyle="--", linewidth=0.8, alpha=0.6, color=f"C{i}")
    ax.set_xlabel("tokens/s (95% CI)")
    ax.set_ylabel("perplexity under the target (95% CI)")
    ax.set_title(_title(sub if len(sub) else df, f"perplexity vs speed: {task}"), fontsize=9)
    if sub.empty:
        ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=7, title="filled = lossless", title_fontsize=7)
    ax.grid(alpha=0.3)
    _label_points(ax, texts)
    return ax


def _knob_axis(ax, knob: str, values: Sequence[float]) -> None:
    """Integer ticks at the values swept; log2 scale for ``LOG2_KNOBS`` with positive values."""
    vals = sorted(set(values))
    if knob in LOG2_KNOBS and vals and min(vals) > 0:
        ax.set_xscale("log", base=2)
    if all(float(v).is_integer() for v in vals):
        ax.set_xticks(vals)
        ax.set_xticklabels([str(int(v)) for v in vals])
        ax.minorticks_off()


def plot_ablation(df: pd.DataFrame, knob: str):
    """Ablation over ``knob``: tokens/s, block efficiency and perplexity (with intervals) vs the
    knob, a line per (pair, task, decoder); lossless decoders solid, lossy dashed."""
    import matplotlib.pyplot as plt

    sub = df[df["status"] == "done"].copy()
    sub["_x"] = [_num(ident.get(knob)) for ident in sub["_identity"]]
    sub = sub.dropna(subset=["_x"])
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    for (pair, task, dec), g in sub.groupby(["pair", "task", "decoder"], sort=False):
        g = g.sort_values("_x")
        lossless = bool(g["lossless"].eq(True).all())
        name = f"{dec} / {task}" + (f" / {pair}" if sub["pair"].nunique() > 1 else "")
        for ax, col in zip(axes, ("tokens_per_s", "block_efficiency", "perplexity")):
            ax.errorbar(
                g["_x"],
                g[col],
                yerr=_errors(g, col),
                marker="o",
                capsize=2,
                linestyle="-" if lossless else "--",
                label=name,
            )
    for ax, col in zip(axes, ("tokens/s", "block efficiency", "perplexity")):
        ax.set_xlabel(knob)
        ax.set_ylabel(col)
        ax.grid(alpha=0.3)
        _knob_axis(ax, knob, list(sub["_x"]))
    if len(sub):
        axes[0].legend(fontsize=7, title="solid = lossless", title_fontsize=7)
    tasks = ", ".join(str(t) for t in dict.fromkeys((sub if len(sub) else df)["task"]))
    fig.suptitle(_title(sub if len(sub) else df, f"Ablation over {knob} on {tasks}"), fontsize=10)
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
    knobs = varying_knobs(df)
    what = f"ablation over {', '.join(knobs)}" if knobs else "Table 2"
    metrics = {t: m for t, m in zip(df["task"], df.get("score_metric", [])) if isinstance(m, str)}
    shared = settings_line(df)
    md = [
        f"# {name}: {what}",
        "",
        f"Rendered by `python -m mtad.render {_shown(sweep_dir)} --out {_shown(out_dir)}`.",
        "n = examples; [a, b] = 95% bootstrap interval over examples; "
        f"{MISSING} = not run / skipped / failed (see the notes); {NOT_AVAILABLE} = no energy meter; "
        "×MN / ×SpD = tokens/s over the multinomial / SpD run of the same pair, task and settings.",
        "",
    ]
    if shared:
        md += [f"Settings of every point: {shared}.", ""]
    tex, csv_parts = [], []
    for pair, (text, _) in tables.items():
        md.append(
            to_markdown(text, title=f"{pair}" if not knobs else f"{pair}: {what}", metrics=metrics)
        )
        tex.append(to_latex(text, caption=f"{name} ({what}): {pair}".replace("_", r"\_")))
        csv_parts.append(csv_table(df[df["pair"] == pair], text))
    if footnotes:
        md += ["Notes:", "", *[f"- {n}" for n in footnotes], ""]
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
        "lossless",
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
    if len(tasks) > 1:  # one task: pareto_<task>.png is that figure already
        ncol = min(3, len(tasks))
        nrow = math.ceil(len(tasks) / ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(6 * ncol, 4.8 * nrow), squeeze=False)
        for ax, task in zip(axes.flat, tasks):
            plot_pareto(df, task, ax=ax)
        for ax in list(axes.flat)[len(tasks) :]:
            ax.axis("off")
        fig.tight_layout()
        fig.savefig(out_dir / "pareto.png", dpi=120)
        plt.close(fig)
        written["pareto.png"] = out_dir / "pareto.png"
    for knob in knobs:
        fig = plot_ablation(df, knob)
        path = out_dir / f"ablation_{knob}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written[path.name] = path

    if logger is not None:
        log_to_tracker(logger, name, df, tables, cols, out_dir, written)
    return written


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when under it, else its name (no absolute paths)."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return Path(path).name


def log_to_tracker(
    logger,
    name: str,
    df: pd.DataFrame,
    tables: dict,
    cols: list[str],
    out_dir: Path,
    written: dict[str, Path],
) -> None:
    """One tracker run for the rendering: Table 2 per pair, the points, a perplexity-vs-speed
    scatter of the finished points, and the figures."""
    logger.start({"sweep": {"name": name}, "points": len(df)}, name=f"render-{name}")
    for pair, (_, nums) in tables.items():
        flat = nums.copy()
        flat.columns = [f"{t}/{h}" for t, h in nums.columns]
        logger.log_table(f"table2/{pair}", flat.reset_index())
    points = df.reindex(columns=cols)
    logger.log_table("points", points.astype(object).where(points.notna(), None))
    done = df[df["status"] == "done"].dropna(subset=["tokens_per_s", "perplexity"])
    scatter = done.reindex(
        columns=["pair", "task", "label", "lossless", "tokens_per_s", "perplexity"]
    )
    logger.log_scatter(
        "ppl_vs_speed", scatter, "tokens_per_s", "perplexity", f"{name}: perplexity vs tokens/s"
    )
    for fname in sorted(written):
        if fname.endswith(".png"):
            logger.log_image(
                fname[: -len(".png")].replace("pareto_", "pareto/"), str(written[fname])
            )
    logger.finish()


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

"""Tables of sweep results: cells, Table 2 frames, notes, Markdown, LaTeX and CSV.

Works on the points frame of ``mtad.analysis.render.load_points`` (one row per point). Table 2 is laid
out as in the paper: per model pair, one block per task, decoders as rows; the columns are
n, score, perplexity and tokens/s with their 95% bootstrap intervals, J/token, block
efficiency and the speedups over multinomial and SpD. A value that is missing (point not run,
skipped, failed, metric absent) shows as "–", never 0; J/token shows "n/a" when the run's
energy meter was unavailable. Notes give one line per distinct reason and no absolute paths.
Markdown comes from ``DataFrame.to_markdown``, LaTeX from ``Styler.to_latex``, each name and
cell escaped for its format (``mtad.core.escape``; ``csv_frame`` for CSV). It knows
nothing about results folders (``mtad.analysis.render``) or figures (``mtad.analysis.figures``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from mtad.core.escape import csv_cell, latex, md_cell, md_text

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
INTERVALS = {"score": "score_ci", "perplexity": "perplexity_ci", "tokens_per_s": "tokens_per_s_ci",
             "block_efficiency": "block_efficiency_ci"}
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


def _num(v) -> float:
    """A float, NaN for None/missing/non-numeric (never 0)."""
    if v is None or isinstance(v, bool):
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


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


def columns(speedups: bool = True) -> tuple:
    """``COLUMNS``, without the speedup columns (``SPEEDUPS``) when ``speedups`` is false: a
    sweep whose tokens/s come from a shared machine (``sweep.render.<profile>.speedups``)."""
    return tuple(c for c in COLUMNS if speedups or c[0] not in SPEEDUPS)


def table2(df: pd.DataFrame, cols: Sequence = COLUMNS) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """Per model pair: (text, numbers), rows = variants, columns = (task, metric) for the
    metrics of ``cols`` (default ``COLUMNS``).

    ``text`` holds the display strings ("–" missing, "n/a" no energy meter, intervals in
    brackets); ``numbers`` the floats (NaN where missing). ``to_markdown`` and ``to_latex``
    lay them out one block per task.
    """
    out = {}
    for pair in dict.fromkeys(df["pair"]):
        sub = df[df["pair"] == pair]
        rows = _order(list(sub["label"]), list(sub["decoder"]))
        tasks = _task_order(list(sub["task"]))
        index = pd.MultiIndex.from_tuples(
            [(t, h) for t in tasks for _, h, _ in cols], names=["task", "metric"]
        )
        text = pd.DataFrame(MISSING, index=pd.Index(rows, name="decoder"), columns=index)
        nums = pd.DataFrame(math.nan, index=pd.Index(rows, name="decoder"), columns=index)
        for _, r in sub.iterrows():
            for col, head, fmt in cols:
                text.loc[r["label"], (r["task"], head)] = format_cell(r, col, fmt)
                if r["status"] == "done":
                    nums.loc[r["label"], (r["task"], head)] = _num(r.get(col))
        out[str(pair)] = (text, nums)
    return out


def csv_table(sub: pd.DataFrame, text: pd.DataFrame, cols: Sequence = COLUMNS) -> pd.DataFrame:
    """The table of one pair for CSV: plain numbers (4 significant digits), "–" / "n/a" kept,
    intervals in ``<column>_ci_low`` / ``<column>_ci_high`` columns."""
    tasks = list(dict.fromkeys(text.columns.get_level_values(0)))
    names = []
    for t in tasks:
        for c, _, _ in cols:
            names.append(f"{t}/{c}")
            if c in INTERVALS:
                names += [f"{t}/{c}_ci_low", f"{t}/{c}_ci_high"]
    out = pd.DataFrame(MISSING, index=text.index, columns=names)
    for _, r in sub.iterrows():
        for col, _, _ in cols:
            out.loc[r["label"], f"{r['task']}/{col}"] = format_cell(r, col, interval=False)
            ci = r.get(INTERVALS.get(col, ""), None)
            if r["status"] == "done" and isinstance(ci, tuple):
                out.loc[r["label"], f"{r['task']}/{col}_ci_low"] = f"{ci[0]:.4g}"
                out.loc[r["label"], f"{r['task']}/{col}_ci_high"] = f"{ci[1]:.4g}"
    out.insert(0, "pair", str(sub["pair"].iloc[0]))
    return out.reset_index()


def csv_frame(frame: pd.DataFrame, numbers: Sequence[str] = ()) -> pd.DataFrame:
    """``frame`` ready for ``to_csv``: every string cell and header through
    ``mtad.core.escape.csv_cell`` (a spreadsheet evaluates none); the columns ``numbers`` hold
    formatted numbers ("-0.05" stays a number there)."""
    out = frame.copy()
    for col in frame.columns:
        out[col] = frame[col].map(lambda v, n=col in numbers: csv_cell(v, numbers=n))
    out.columns = [csv_cell(c) for c in frame.columns]
    return out


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
            elif "_kinds" in g and (any(len(k) > 1 for k in g["_kinds"]) or g["_kinds"].nunique() > 1):
                why = (f"a point's records and the {baseline} run's were not all made on one machine "
                       "kind (their segments), so a ratio of their tokens/s is not a speedup")
            else:
                why = f"no {baseline} run with the same sampling and length settings ({', '.join(BASELINE_KEYS[2:])})"
            reasons.setdefault(why, []).append(
                f"{pair} / {task}" if df["pair"].nunique() > 1 else str(task)
            )
        out += [f"{head} {MISSING} on {', '.join(where)}: {why}" for why, where in reasons.items()]
    return out


def notes(df: pd.DataFrame, speedups: bool = True) -> list[str]:
    """Footnotes, one per distinct reason: skipped/failed/pending points, speedups that cannot
    be computed (when shown), stand-in data, unavailable energy. No absolute paths."""
    out = []
    bad = df[df["status"].isin(["skipped", "failed", "pending"])].copy()
    if not bad.empty:
        bad["_why"] = [scrub_paths(r) if isinstance(r, str) and r else "" for r in bad["reason"]]
        for (status, why), g in bad.groupby(["status", "_why"], sort=False):
            out.append(f"{status} ({_where(g, df)})" + (f": {why}" if why else ""))
    if "indexed_status" in df:
        part = df[(df["status"] == "done") & (df["indexed_status"] == "partial")]
        if not part.empty:
            out.append(f"partial ({_where(part, df)}): fewer examples than the point asks for (n "
                       "shows how many); the next run of the sweep completes them in place")
    out += example_notes(df)
    out += segment_notes(df)
    out += speedup_notes(df) if speedups else []
    if "data_substitute" in df:
        subs = sorted({str(t) for t, s in zip(df["task"], df["data_substitute"]) if s is True})
        if subs:
            out.append(f"stand-in data (not the paper's): {', '.join(subs)}")
    if "energy_unavailable" in df and df["energy_unavailable"].eq(True).any():
        out.append(
            f"J/tok {NOT_AVAILABLE}: no energy meter on the machine that ran the point (NVML/RAPL)"
        )
    return out


def example_notes(df: pd.DataFrame) -> list[str]:
    """Per (pair, task) whose points were recorded on different examples: every cell shows the
    examples all of them have, and which points have more recorded."""
    out: list[str] = []
    if "examples_recorded" not in df:
        return out
    done = df[df["status"] == "done"]
    many_pairs = df["pair"].nunique() > 1
    for (pair, task), g in done.groupby(["pair", "task"], sort=False):
        more = g[g["examples_recorded"].astype(float) > g["examples"].astype(float)]
        if more.empty:
            continue
        where = f"{pair} / {task}" if many_pairs else str(task)
        shown = int(g["examples"].min())
        extra = ", ".join(f"{r['label']} {int(r['examples_recorded'])}" for _, r in more.iterrows())
        out.append(f"{where}: every cell shows the {shown} examples all its points have "
                   f"(recorded: {extra}; the claims report pairs two decoders on every example both have)")
    return out


def segment_notes(df: pd.DataFrame) -> list[str]:
    """Points made by several runs (segments), and points whose records predate segment
    provenance (``mtad.run.results.segments``)."""
    out: list[str] = []
    done = df[df["status"] == "done"]
    if "segments" in done:
        for _, r in done.iterrows():
            if isinstance(r.get("segments"), str) and r["segments"]:
                out.append(f"{r['task']} / {r['label']}: {r['segments']}")
    if "segments_known" in done:
        old = done[done["segments_known"].eq(False)]
        if not old.empty:
            every = len(old) == len(done)
            out.append(
                f"records made before segment provenance ({'every point' if every else _where(old, df)}): "
                "which run made each record is unknown (summary.json keeps the last run's provenance; "
                "`mtad-audit` regenerates a sample of them, results/audit/audit.md)")
    return out


def _setting_text(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def settings_line(df: pd.DataFrame) -> str:
    """The settings every point shares (``SETTINGS``), e.g. "T=1, top-k 10, top-p 0.9, ...".

    A column of numbers with missing values is float in pandas (10 -> 10.0): integral values
    print as integers."""
    parts = []
    for key, name in SETTINGS.items():
        values = df[key].dropna().map(_setting_text).unique() if key in df else []
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
    lines = [f"## {md_text(title)}", ""] if title else []
    for task in dict.fromkeys(text.columns.get_level_values(0)):
        metric = (metrics or {}).get(task)
        lines += [f"### {md_text(task)}" + (f" (score: {md_text(metric)})" if metric else ""), ""]
        block = _task_block(text, task).map(md_cell)
        block.index = pd.Index([md_cell(v) for v in block.index], name=block.index.name)
        block.columns = [md_cell(c) for c in block.columns]
        lines += [
            block.to_markdown(
                colalign=("left",) + ("right",) * block.shape[1], disable_numparse=True
            ),
            "",
        ]
    return "\n".join(lines)


def to_latex(text: pd.DataFrame, caption: str | None = None) -> str:
    """The same blocks as one LaTeX table (booktabs), rows = (task, decoder); cells, labels and
    headers escaped (``mtad.core.escape.latex``), ``caption`` taken as LaTeX (escape it)."""
    blocks = {t: _task_block(text, t) for t in dict.fromkeys(text.columns.get_level_values(0))}
    frame = pd.concat(blocks, names=["task", "decoder"]).map(latex)
    frame.index = pd.MultiIndex.from_tuples([tuple(map(latex, i)) for i in frame.index],
                                            names=frame.index.names)
    frame.columns = [latex(c) for c in frame.columns]
    styler = frame.style.hide(axis="index", names=True)
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

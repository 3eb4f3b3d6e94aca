"""Sweep results -> the paper's tables and figures (Markdown, LaTeX, CSV, PNG).

Reads only files under a results folder, through ``mtad.run.results`` (a sweep's
``<root>/<sweep>/`` with ``sweep.json``, a Hydra multirun folder, or one run folder), so it
reruns alone:

    python -m mtad.analysis.render results/sweeps/table2_smoke --out results/table2_smoke [--wandb]

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
- ``ablation_<knob>.png``: perplexity, block efficiency and the perplexity ratio to the
  default (paired over examples) vs each knob that varies among a decoder's points, a row per
  task (log2 axis for gamma and width); the table gets the paired ratios too.

This module loads the points and writes the files; the tables are made by ``mtad.analysis.tables``,
the figures by ``mtad.analysis.figures``. Conventions: a value that is missing (point not run,
skipped, failed, metric absent) shows as "–", never 0; J/token shows "n/a" when the run's
energy meter was unavailable. Speedups
are tokens/s over the baseline run (multinomial, SpD) of the same sweep with the same pair,
task and sampling/length settings (``mtad.core.metrics``). It knows nothing about how the runs
were made; metric definitions live in ``mtad.core.metrics``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mtad.analysis.figures import (  # noqa: F401
    LOG2_KNOBS,
    PARETO_CAPTION,
    pareto_front,
    plot_ablation,
    plot_pareto,
)
from mtad.analysis.names import decoder_name, pair_name, task_name
from mtad.analysis.provenance_marks import (
    MARKS,
    audit_folder,
    diverging_points,
    identical_records,
    mark_cells,
    marks_footnote,
)
from mtad.analysis.tables import (  # noqa: F401  (the public names of the tables, used by the notebook)
    BASELINE_KEYS,
    COLUMNS,
    DECODER_ORDER,
    INTERVALS,
    MISSING,
    NOT_AVAILABLE,
    SETTINGS,
    SPEEDUPS,
    _num,
    _task_order,
    columns,
    csv_frame,
    csv_table,
    format_cell,
    notes,
    scrub_paths,
    settings_line,
    speedup_notes,
    table2,
    to_latex,
    to_markdown,
)
from mtad.core.escape import file_part, latex, md_cell, md_text, unique_file_parts
from mtad.core.io import save_figure, shown_path, write_text_atomic
from mtad.core.metrics import DEFINITIONS, cell_statistics
from mtad.run.results.segments import describe_segments

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


def _interval(v) -> tuple[float, float] | None:
    """``[low, high]`` as floats, None when absent or not finite."""
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        return None
    lo, hi = _num(v[0]), _num(v[1])
    return None if math.isnan(lo) or math.isnan(hi) else (lo, hi)


def _samples(point_dir: Path) -> list[dict] | None:
    """The records of a point's ``samples.jsonl``; None without one."""
    from mtad.core.io import read_jsonl

    path = Path(point_dir) / "samples.jsonl"
    return list(read_jsonl(path)) if path.exists() or path.is_symlink() else None


def score_interval(point_dir: Path, records: list[dict] | None = None) -> tuple[float, float] | None:
    """95% bootstrap interval of the mean score over a point's examples (``samples.jsonl``, or
    ``records``).

    For summaries that carry a standard error only; the same bootstrap as every other interval.
    """
    from mtad.core.stats import bootstrap_ci, present

    records = _samples(point_dir) if records is None else records
    scores = [r["score"] for r in records or () if isinstance(r.get("score"), (int, float))]
    return _interval(bootstrap_ci(present(scores))) if len(scores) > 1 else None


def sample_intervals(point_dir: Path, records: list[dict] | None = None
                     ) -> dict[str, tuple[float, float] | None]:
    """95% bootstrap intervals recomputed from a point's ``samples.jsonl`` (or ``records``),
    each for the estimate the summary gives, resampling examples: tokens/s (total tokens / total
    time: ``mtad.core.metrics.tokens_per_s_interval``; summaries written before it held an
    interval of the mean per-example rate, a different statistic that need not contain the
    estimate) and block efficiency (emitted tokens / steps: ``block_efficiency_interval``; older
    summaries have none). ``{}`` without samples."""
    from mtad.core.metrics import block_efficiency_interval, tokens_per_s_interval

    records = _samples(point_dir) if records is None else records
    if records is None:
        return {}
    out = {}
    for key, fn in (("tokens_per_s_ci", tokens_per_s_interval),
                    ("block_efficiency_ci", block_efficiency_interval)):
        ci = fn(records)
        out[key] = None if any(math.isnan(v) for v in ci) else _interval(ci)
    return out


def example_log_ppl(records: list[dict]) -> dict[str, float]:
    """{example id: log perplexity} (``mtad.core.metrics.example_log_perplexity``: a multi-turn
    example pools its turns) of the examples that have one: what a paired comparison of two
    points over the same examples needs, as in the claims report."""
    from mtad.core.metrics import by_example, example_log_perplexity

    out = {}
    for ex, turns in by_example(records).items():
        value = example_log_perplexity(turns)
        if value is not None and math.isfinite(value):
            out[ex] = value
    return out


def draft_cost(records: list[dict]) -> dict[str, float]:
    """What a point's decoding costs beyond the tokens it emits, from its records and
    independent of the machine's load: ``drafted_per_token`` (the drafted tree's depth per
    token emitted, ``drafted_per_step`` being ``tree.depth``: the draft's sequential passes,
    each over the tree's width) and ``nodes_per_step`` (tree nodes the target verifies per
    step: the width of its pass). NaN without step records."""
    steps = [r for r in records if r.get("drafted_per_step") is not None]
    emitted = sum(sum(r.get("emitted_per_step") or [r.get("new_tokens") or 0]) for r in steps)
    drafted = sum(sum(r["drafted_per_step"]) for r in steps)
    sizes = [n for r in steps for n in (r.get("tree_size_per_step") or [])]
    return {"drafted_per_token": drafted / emitted if emitted else math.nan,
            "nodes_per_step": sum(sizes) / len(sizes) if sizes else math.nan}


def knob_defaults() -> dict[str, Any]:
    """The authors' default of each ablation knob (``conf/config.yaml``: gamma, tau, width)."""
    from omegaconf import OmegaConf

    from mtad.run.config import CONF_DIR

    cfg = OmegaConf.load(CONF_DIR / "config.yaml")
    return {k: cfg.get(k) for k in ("gamma", "tau", "width") if cfg.get(k) is not None}


def paired_vs_default(df: pd.DataFrame, knob: str, default: Any) -> pd.DataFrame:
    """Perplexity of each finished point over that of the point at the knob's ``default`` with
    the same pair, task and decoder, paired over the examples (and turns) both have: the ratio
    of geometric-mean perplexities with a 95% bootstrap interval that resamples examples
    (``mtad.core.stats.perplexity_ratio``). Points of one curve share prompts and seeds, so
    the pairing removes the between-prompt spread that dominates the unpaired intervals."""
    from mtad.core.stats import perplexity_ratio

    cols = ["pair", "task", "decoder", knob, "n", "ratio", "low", "high", "detail",
            "drafted_per_token", "nodes_per_step"]
    rows = []
    done = df[(df["status"] == "done")] if "_log_ppl" in df else df.iloc[0:0]
    for (pair, task, dec), g in done.groupby(["pair", "task", "decoder"], sort=False):
        points = [(_num(r["_identity"].get(knob)), r.get("_log_ppl"), r) for r in g.to_dict("records")]
        points = sorted(((x, lp, r) for x, lp, r in points if isinstance(lp, dict) and not math.isnan(x)),
                        key=lambda t: t[0])
        ref = next((lp for x, lp, _ in points if x == _num(default)), None)
        if ref is None:
            continue
        for x, mine, r in points:
            keys = sorted(set(mine) & set(ref))
            iv = perplexity_ratio([mine[k] for k in keys], [ref[k] for k in keys])
            rows.append([pair, task, dec, x, iv.n, iv.estimate, iv.low, iv.high, iv.detail or "",
                         _num(r.get("drafted_per_token")), _num(r.get("nodes_per_step"))])
    return pd.DataFrame(rows, columns=cols)


def paired_markdown(paired: pd.DataFrame, knob: str, default: Any) -> list[str]:
    """Markdown lines of ``paired_vs_default``: a table per task."""
    if paired.empty:
        return []
    lines = [md_text(f"## Paired: perplexity ÷ perplexity at the default {knob}={default}"), "",
             "Ratio of geometric-mean perplexities over the examples both points have (n pairs), "
             "95% bootstrap interval resampling examples; below 1 = lower perplexity than at the "
             "default. Cost, from the records (load does not change it): draft depth per token "
             "emitted (the draft's sequential passes, each over the tree's width) and tree nodes "
             "the target verifies per step.", ""]
    for task, g in paired.groupby("task", sort=False):
        lines += [f"### {md_text(task)}", "",
                  f"| decoder | {md_cell(knob)} | n pairs | PPL ratio [95% CI] | draft passes / token | nodes / step |",
                  "|:--|--:|--:|--:|--:|--:|"]
        for r in g.itertuples():
            value = f"{getattr(r, knob):g}"
            if value == f"{_num(default):g}":
                cell = "1 (the default)"
            elif math.isnan(r.low):
                cell = md_cell(f"{r.ratio:.3f} ({r.detail})")
            else:
                cell = f"{r.ratio:.3f} [{r.low:.3f}, {r.high:.3f}]"
            cost = " | ".join("–" if math.isnan(v) else f"{v:.2f}"
                              for v in (r.drafted_per_token, r.nodes_per_step))
            lines.append(f"| {md_cell(r.decoder)} | {value} | {r.n} | {cell} | {cost} |")
        lines.append("")
    return lines


def at_limit(summary: dict, records: list[dict], limit: int) -> tuple[dict, list[dict]]:
    """``summary`` and ``records`` of a point restricted to its first ``limit`` examples
    (records with ``index < limit``; an example's turns stay together): the metrics recomputed
    with ``mtad.core.metrics.summarize`` and the score as the mean of the kept examples' scores
    (every task's score is that mean), its interval and standard error from the same bootstrap."""
    from mtad.core.metrics import summarize
    from mtad.core.stats import bootstrap_ci, bootstrap_stderr, present

    kept = [r for r in records if int(r.get("index", 0)) < limit]
    out = dict(summary, metrics={**(summary.get("metrics") or {}), **summarize(kept)}, limit=limit)
    scores = present([r["score"] for r in kept if isinstance(r.get("score"), (int, float))])
    if summary.get("score") and scores:
        out["score"] = dict(summary["score"], value=float(sum(scores) / len(scores)),
                            ci=list(bootstrap_ci(scores)) if len(scores) > 1 else None,
                            stderr=bootstrap_stderr(scores), n=len(scores))
    return out, kept


def point_dirs(sweep_dir: Path, only_current: bool = True) -> list[Path]:
    """Point folders (``mtad.run.results.point_dirs``): a sweep's current points, a multirun's
    jobs, or a single run folder."""
    from mtad.run.results import point_dirs as _point_dirs

    return _point_dirs(sweep_dir, only_current)


def _block_efficiency(metrics: dict) -> float:
    """``mtad.core.metrics.block_efficiency`` from a summary's token and step counts (emitted tokens /
    steps), so summaries written under an older convention render alike; else the stored value."""
    from mtad.core.metrics import block_efficiency

    tokens, steps = metrics.get("new_tokens"), metrics.get("steps")
    if isinstance(tokens, (int, float)) and isinstance(steps, (int, float)) and steps > 0:
        return block_efficiency(tokens, steps)
    return _num(metrics.get("block_efficiency"))


def load_points(sweep_dir: str | Path, only_current: bool = True) -> pd.DataFrame:
    """One row per point: identity (pair, task, decoder, knobs), status and metrics.

    Folders are read through ``mtad.run.results.load_point``; two folders holding the same point
    (legacy duplicates) give one row, the finished one.
    """
    from mtad.run.results import load_point

    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"no sweep folder {sweep_dir}")
    rows = []
    points = [load_point(d) for d in point_dirs(sweep_dir, only_current)]
    policy, listed = _index_points(sweep_dir)
    for pt in points:  # a point not run yet has no folder: its names and knobs come from sweep.json
        entry = listed.get(Path(pt["dir"]).resolve(), IndexEntry())
        pt["indexed_status"], pt["requested"] = entry.status, entry.limit
        pt["choices"] = {**entry.choices, **pt["choices"]}
        pt["config"] = pt["config"] or entry.knobs
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
            "_dir": pt["dir"],  # the point folder (provenance marks)
            "pair": pair_name(choices, ident, summary),
            "task": task_name(choices, ident, summary),
            "decoder": decoder_name(choices, ident, summary) or "?",
            "status": pt["status"],
            "reason": pt["reason"],
            # the index's word: "partial" = fewer examples than the sweep's point asks for
            "indexed_status": pt["indexed_status"],
            **{k: ident.get(k) for k in KNOBS},
            "_identity": _flatten(ident),
        }
        if policy == "requested" and pt["requested"] is not None:
            # what is shown (at_limit below), found or not: not a knob that varies
            row["limit"] = row["_identity"]["limit"] = pt["requested"]
        if summary is not None:
            records = _samples(pt["dir"])
            limit = pt["requested"]
            if (policy == "requested" and records is not None and isinstance(limit, int)
                    and any(int(r.get("index", 0)) >= limit for r in records)):
                summary, records = at_limit(summary, records, limit)  # the examples it asks for
            m = summary.get("metrics") or {}
            row["_log_ppl"] = example_log_ppl(records or [])
            row["_records"] = records
            row.update(draft_cost(records or []))
            score = summary.get("score") or {}
            row.update(
                status="done",
                score_metric=score.get("metric"),
                score_stderr=_num(score.get("stderr")),
                lossless=summary.get("lossless"),
                ms_per_token=_num(m.get("ms_per_token")),
                j_per_token=_num(m.get("j_per_token")),
                acceptance_rate=_num(m.get("acceptance_rate")),
                new_tokens=m.get("new_tokens"),
                energy_source=summary.get("energy_source"),
                energy_unavailable=summary.get("energy_source") is None,
                data_source=summary.get("data_source"),
                data_substitute=bool(summary.get("data_substitute")),
                segments=describe_segments(summary.get("segments")),
                segments_known=summary.get("segments") is not None,
            )
            if records:  # every shown statistic from the records, one definition each
                row.update(_cell(cell_statistics(records)))
                # records that name their segment (a run's own or derived: docs/results.md)
                row["segments_known"] = row["segments_known"] or all(r.get("segment") for r in records)
                row["examples_recorded"] = row["examples"]
            else:  # a summary without records: its own numbers (their definitions may differ)
                cis = sample_intervals(pt["dir"], records)
                row.update(
                    score=_num(score.get("value")),
                    score_ci=_interval(score.get("ci")) or score_interval(pt["dir"], records),
                    perplexity=_num(m.get("perplexity_geomean", m.get("perplexity"))),
                    perplexity_ci=_interval(m.get("perplexity_ci")),
                    tokens_per_s=_num(m.get("tokens_per_s")),
                    tokens_per_s_ci=cis.get("tokens_per_s_ci") or _interval(m.get("tokens_per_s_ci")),
                    block_efficiency=_block_efficiency(m),
                    block_efficiency_ci=cis.get("block_efficiency_ci") or _interval(m.get("block_efficiency_ci")),
                    examples=m.get("examples"), examples_recorded=m.get("examples"),
                )
        elif pt["status"] == "pending" and not pt["reason"]:
            # begun but not finished (running, or interrupted): say how far it got
            examples = {r.get("index", r.get("example_id")) for r in _samples(pt["dir"]) or []}
            if examples:
                asked = f" of {pt['requested']}" if isinstance(pt["requested"], int) else ""
                row["reason"] = (f"begun, {len(examples)}{asked} examples so far and no summary "
                                 "yet (still running, or interrupted): the next run of the sweep "
                                 "resumes it")
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    for col, *_ in COLUMNS:
        if col not in df:
            df[col] = math.nan
    df["label"] = variant_labels(df)
    return add_speedups(same_examples(df))


def _cell(values: dict) -> dict[str, Any]:
    """``mtad.core.metrics.cell_statistics`` as row fields (intervals as tuples, None if NaN)."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        out[k] = _interval(v) if k.endswith("_ci") else v
    return out


def same_examples(df: pd.DataFrame) -> pd.DataFrame:
    """Every finished point of a (pair, task) shown on the same examples: those all of them have
    records of (a point recorded on more keeps ``examples_recorded``, and the notes say so)."""
    from mtad.core.metrics import by_example, cell_statistics

    if "_records" not in df:
        return df
    df = df.copy()
    done = df[(df["status"] == "done") & df["_records"].map(lambda r: isinstance(r, list) and len(r) > 0)]
    for _, g in done.groupby(["pair", "task"], sort=False):
        ids = [set(by_example(r)) for r in g["_records"]]
        common = set.intersection(*ids)
        for i, have in zip(g.index, ids):
            if have == common:
                continue
            kept = [r for r in df.at[i, "_records"] if str(r.get("example_id", r.get("index"))) in common]
            for k, v in _cell(cell_statistics(kept)).items():
                df.at[i, k] = v
            df.at[i, "_log_ppl"] = {k: v for k, v in df.at[i, "_log_ppl"].items() if k in common}
    return df


@dataclass(frozen=True)
class IndexEntry:
    """What a sweep's ``sweep.json`` says of one point folder."""

    choices: dict = field(default_factory=dict)  # config group choices
    knobs: dict = field(default_factory=dict)  # knobs set by its overrides
    status: str | None = None  # the index's status ("partial": fewer examples than asked for)
    limit: int | None = None  # the examples the point asks for


def render_options(sweep_dir: Path) -> dict[str, Any]:
    """The sweep's ``sweep.render`` options for its profile, from ``sweep.json`` ({} without)."""
    from mtad.run.results import INDEX_FILE, read_json

    return dict((read_json(Path(sweep_dir) / INDEX_FILE) or {}).get("render") or {})


def _index_points(sweep_dir: Path) -> tuple[str, dict[Path, IndexEntry]]:
    """(examples policy, {point folder: IndexEntry}) from a sweep's ``sweep.json`` ("all" and
    ``{}`` without one). The policy (``sweep.examples`` of the sweep file,
    ``mtad.run.sweep.plan.EXAMPLES_POLICIES``): "requested" shows a point found in a bigger folder
    at the examples it asks for."""
    import yaml

    from mtad.run.results import INDEX_FILE, read_json

    index = read_json(sweep_dir / INDEX_FILE) or {}
    out = {}
    for p in index.get("points", []):
        if not (p.get("dir") or p.get("hash")):
            continue
        pairs = [o.split("=", 1) for o in p.get("overrides") or [] if "=" in o]
        knobs = {k: yaml.safe_load(v) for k, v in pairs if k in KNOBS and k != "limit"}  # not identity
        limit = p.get("limit")
        out[(sweep_dir / (p.get("dir") or p["hash"])).resolve()] = IndexEntry(
            p.get("choices") or {}, knobs, p.get("status"), int(limit) if limit is not None else None)
    return index.get("examples") or "all", out


#: What the LaTeX tables' statistics are (``mtad.core.metrics``: one definition each).
LATEX_STATISTICS = ("score: mean over examples; PPL: geometric mean over examples of per-example perplexity; "
                    "tok/s: total new tokens / total decoding time; BE: mean over examples of per-example "
                    "block efficiency; [95% CI]: bootstrap over examples")


def latex_caption(title: str, marks: list[str]) -> str:
    """A LaTeX table's caption: its title, the statistics its columns hold, and its provenance
    marks (``mtad.analysis.provenance_marks``), escaped for LaTeX."""
    return latex(f"{title}. {LATEX_STATISTICS}." + (f" {marks_footnote(marks)}" if marks else ""))


def _varying_keys(df: pd.DataFrame) -> list[str]:
    """Identity keys that vary among the points of one (pair, task, decoder), knobs first."""
    varying: set[str] = set()
    for _, g in df.groupby(["pair", "task", "decoder"], dropna=False):
        if len(g) < 2:
            continue
        flat = pd.DataFrame(list(g["_identity"]))
        for col in flat.columns:
            if flat[col].dropna().astype(str).nunique() > 1:  # a pending point lacks most keys
                varying.add(col)
    # decoder.gamma follows gamma (interpolation): name the top-level knob only
    varying = {
        k for k in varying if not (k.startswith("decoder.") and k.split(".", 1)[1] in varying)
    }
    return sorted(varying, key=lambda k: (k not in KNOBS, KNOBS.index(k) if k in KNOBS else 0, k))


def variant_labels(df: pd.DataFrame) -> pd.Series:
    """Row labels: the decoder, plus the settings that vary among its points of one (pair, task)."""
    keys = _varying_keys(df)

    def label(row) -> str:
        parts = [f"{k}={row['_identity'].get(k)}" for k in keys if k in row["_identity"]]
        return f"{row['decoder']} ({', '.join(parts)})" if parts else str(row["decoder"])

    return df.apply(label, axis=1)


def varying_knobs(df: pd.DataFrame) -> list[str]:
    """Identity keys that vary among the points of one (pair, task, decoder) and are knobs of
    the decoder (not ``figures.NOT_KNOBS``: a point at another number of examples): the
    ablation axes, in the order the rows' labels name them. From the identities, never parsed
    back from the labels (a decoder named ``x (a=1)`` names no knob)."""
    from mtad.analysis.figures import NOT_KNOBS

    keys = [k for k in _varying_keys(df) if k not in NOT_KNOBS]
    out: list[str] = []
    for ident in df["_identity"]:
        out += [k for k in keys if k in ident and k not in out]
    return out


def add_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """``speedup_multinomial`` and ``speedup_spd``: tokens/s over the matching baseline run's.

    The baseline must share ``BASELINE_KEYS``; among several, those that also share the
    ablated settings (``varying_knobs``: gamma, draft size, ...) are preferred; the rest are
    averaged. A ratio of tokens/s is a speedup only where both points' records were made on one
    and the same machine kind (``provenance_marks.machine_kinds``, a kind not recorded counting
    as one, as for mark ``k``): otherwise the cell stays empty and a note says why.
    """
    from mtad.analysis.provenance_marks import machine_kinds

    df = df.copy()
    varying = varying_knobs(df) if "label" in df else []
    kinds = [machine_kinds(d) if isinstance(d, (str, Path)) and Path(d).is_dir() else frozenset()
             for d in (df["_dir"] if "_dir" in df else [None] * len(df))]
    df["_kinds"] = kinds
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
            one_kind = len(row["_kinds"]) <= 1 and all(k == row["_kinds"] for k in cand["_kinds"])
            if rate and not math.isnan(rate) and not math.isnan(row["tokens_per_s"]) and one_kind:
                df.at[i, col] = row["tokens_per_s"] / rate
    return df


# ----------------------------------------------------------------------------- all outputs


def render(
    sweep_dir: str | Path, out_dir: str | Path, *, only_current: bool = True, logger=None,
    notes_file: str | Path | None = None,
) -> dict[str, Path]:
    """Write every table and figure of one sweep folder into ``out_dir``; returns the paths.

    ``notes_file``: Markdown appended to ``table2.md`` under "About this table" (what the
    records cannot say: why a column is n/a, how the speed was measured)."""
    sweep_dir, out_dir = Path(sweep_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    df = load_points(sweep_dir, only_current)
    written: dict[str, Path] = {}
    if df.empty:
        write_text_atomic(out_dir / "table2.md", f"No points under {sweep_dir}.\n")
        return {"table2.md": out_dir / "table2.md"}
    name = sweep_dir.name
    options = render_options(sweep_dir)
    speedups = bool(options.get("speedups", True))
    cols_shown = columns(speedups)
    tables = table2(df, cols_shown)
    footnotes = notes(df, speedups)
    knobs = varying_knobs(df)
    what = f"ablation over {', '.join(knobs)}" if knobs else "Table 2"
    metrics = {t: m for t, m in zip(df["task"], df.get("score_metric", [])) if isinstance(m, str)}
    shared = settings_line(df[df["status"] == "done"] if (df["status"] == "done").any() else df)
    md = [
        md_text(f"# {name}: {what}"),
        "",
        f"Rendered by `python -m mtad.analysis.render {shown_path(sweep_dir)} --out {shown_path(out_dir)}`.",
        "n = examples (a multi-turn example counts once, its turns pooled); "
        + "; ".join(DEFINITIONS[k] for k in ("score", "perplexity", "tokens_per_s", "block_efficiency"))
        + "; [a, b] = 95% bootstrap interval over examples; "
        f"{MISSING} = not run / skipped / failed (see the notes); {NOT_AVAILABLE} = no energy meter"
        + ("; ×MN / ×SpD = tokens/s over the multinomial / SpD run of the same pair, task and settings."
           if speedups else
           ". No ×MN / ×SpD columns: this sweep's tokens/s come from a shared machine "
           "(`sweep.render`), so their ratios are not speedups."),
        "",
    ]
    if shared:
        md += [md_text(f"Settings of every point: {shared}."), ""]
    tex, csv_parts, marks_used = [], [], []
    diverging = diverging_points(audit_folder(sweep_dir))
    identical = identical_records(audit_folder(sweep_dir))
    for pair, (text, _) in tables.items():
        shown, used = mark_cells(text, df[df["pair"] == pair], diverging, identical)
        marks_used += [m for m in used if m not in marks_used]
        md.append(
            to_markdown(shown, title=f"{pair}" if not knobs else f"{pair}: {what}", metrics=metrics)
        )
        tex.append(to_latex(shown, caption=latex_caption(f"{name} ({what}): {pair}", used)))
        csv_parts.append(csv_table(df[df["pair"] == pair], text, cols_shown))
    defaults = knob_defaults() if knobs else {}
    paired = {k: paired_vs_default(df, k, defaults[k]) for k in knobs if k in defaults}
    for k, frame in paired.items():
        md += paired_markdown(frame, k, defaults[k])
    footnotes = [*footnotes, *filter(None, [marks_footnote(m for m in MARKS if m in marks_used)])]
    if footnotes:
        md += ["Notes:", "", *[f"- {md_text(n)}" for n in footnotes], ""]
    if notes_file is not None:
        md += ["## About this table", "", Path(notes_file).read_text().strip(), ""]
    for fname, content in (("table2.md", "\n".join(md)), ("table2.tex", "\n".join(tex))):
        write_text_atomic(out_dir / fname, content)
        written[fname] = out_dir / fname
    table_csv = pd.concat(csv_parts, ignore_index=True)
    numbers = [c for c in table_csv.columns if c not in ("pair", "decoder")]  # formatted cells
    write_text_atomic(out_dir / "table2.csv", csv_frame(table_csv, numbers).to_csv(index=False))
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
        "drafted_per_token",
        "nodes_per_step",
        "speedup_multinomial",
        "speedup_spd",
        "examples",
        "new_tokens",
        "data_source",
        "data_substitute",
    ]
    write_text_atomic(out_dir / "points.csv", csv_frame(df.reindex(columns=cols)).to_csv(index=False))
    written["points.csv"] = out_dir / "points.csv"

    written.update(write_figures(df, out_dir, options.get("pareto_x", "tokens_per_s"), knobs,
                                 paired, defaults))

    if logger is not None:
        log_to_tracker(logger, name, df, tables, cols, out_dir, written)
    return written


def write_figures(df: pd.DataFrame, out_dir: Path, pareto_x: str, knobs: Sequence[str],
                  paired: dict, defaults: dict) -> dict[str, Path]:
    """``pareto_<task>.png`` per task (``pareto.png`` with every task when several) and
    ``ablation_<knob>.png`` per varying knob; returns them by file name. Labels are plain text
    (``mtad.analysis.figures``; no TeX here whatever the matplotlib settings say); file names
    from names go through ``mtad.core.escape.unique_file_parts``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: dict[str, Path] = {}
    # a task without a finished point with both axes would be an empty figure or panel
    drawable = df[df["status"] == "done"].dropna(subset=[pareto_x, "perplexity"])
    tasks = [t for t in _task_order(list(df["task"])) if (drawable["task"] == t).any()]
    # where paired comparisons of these points are: the claims report (Table 2), or this
    # table's own paired section (an ablation)
    caption = PARETO_CAPTION if not knobs else "bars: each point's marginal 95% CI; paired comparisons: table2.md"
    with matplotlib.rc_context({"text.usetex": False}):
        files = unique_file_parts(tasks)  # a name is no path: never '/', '..' or a clash
        for task in tasks:
            ax = plot_pareto(df, task, x=pareto_x, caption=caption)
            path = out_dir / f"pareto_{files[task]}.png"
            ax.figure.tight_layout()
            save_figure(ax.figure, path, dpi=120)
            plt.close(ax.figure)
            written[path.name] = path
        if len(tasks) > 1:  # one task: pareto_<task>.png is that figure already
            ncol = min(3, len(tasks))
            nrow = math.ceil(len(tasks) / ncol)
            fig, axes = plt.subplots(nrow, ncol, figsize=(6 * ncol, 4.8 * nrow), squeeze=False)
            for ax, task in zip(axes.flat, tasks):
                plot_pareto(df, task, ax=ax, x=pareto_x, caption=caption)
            for ax in list(axes.flat)[len(tasks) :]:
                ax.axis("off")
            fig.tight_layout()
            save_figure(fig, out_dir / "pareto.png", dpi=120)
            plt.close(fig)
            written["pareto.png"] = out_dir / "pareto.png"
        files = unique_file_parts(knobs)
        for knob in knobs:
            fig = plot_ablation(df, knob, paired.get(knob), defaults.get(knob))
            path = out_dir / f"ablation_{files[knob]}.png"
            save_figure(fig, path, dpi=120)
            plt.close(fig)
            written[path.name] = path
    return written


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
        logger.log_table(f"table2/{file_part(pair)}", flat.reset_index())  # a key, a file name
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
    ap = argparse.ArgumentParser(prog="python -m mtad.analysis.render", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", help="results/sweeps/<sweep>")
    ap.add_argument("--out", help="output folder (default: results/<sweep>)")
    ap.add_argument(
        "--all", action="store_true", help="every point folder, not only those in sweep.json"
    )
    ap.add_argument(
        "--wandb", action="store_true", help="log the tables and the Pareto charts to W&B"
    )
    ap.add_argument("--wandb-project", default="mtad")
    ap.add_argument("--notes", help="a Markdown file appended to table2.md (About this table)")
    args = ap.parse_args(argv)
    sweep_dir = Path(args.sweep_dir)
    out = Path(args.out) if args.out else Path("results") / sweep_dir.name
    logger = None
    if args.wandb:
        from mtad.run.tracking import WandbLogger

        logger = WandbLogger(project=args.wandb_project, group=sweep_dir.name, tags=["render"])
    written = render(sweep_dir, out, only_current=not args.all, logger=logger, notes_file=args.notes)
    print(f"rendered {sweep_dir} -> {out}: {', '.join(sorted(written))}")
    return 0


def cli() -> None:
    """The console script (``[project.scripts]`` in pyproject.toml)."""
    from mtad.run.results import exit_on_bad_results

    exit_on_bad_results(main)


if __name__ == "__main__":
    cli()

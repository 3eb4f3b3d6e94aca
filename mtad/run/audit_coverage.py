"""Which committed points the committed audits cover, and how: one table from every audit file.

``coverage(points, audits)`` reads every ``*.jsonl`` of an audit folder (``results/audit``)
through ``mtad.core.io`` and gives, for each committed point, the audit rows it has and the
widest comparison among them:

- *whole record*: the record regenerated whole and compared field by field (tokens, steps,
  accepted tokens per step, NLL, perplexity, score);
- *prefix K*: the record's steps regenerated up to its K-th token (``--prefix``): tokens and
  accepted tokens per step over those steps, NLL, perplexity and score of the committed
  tokens recomputed whole;
- *tokens only*: rows of the first audits, which compared token ids alone.

Each row's outcome is its first differing field (``identical``, ``identical through the
prefix``, ``tokens`` for a divergence, ``nll_sum``, ...), and its kernel is *as the run*
or ``BF16_IN_FLOAT32`` (``mtad-audit --bf16-linears float32``). The summary counts points by
their widest comparison and rows by (comparison, outcome): that is the grouping it states.
``mtad-audit --coverage FILE.md`` writes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mtad.core.escape import md_cell
from mtad.core.io import read_jsonl, shown_path

#: Comparisons, widest first.
WHOLE, PREFIX, TOKENS = "whole record", "prefix", "tokens only"
ORDER = (WHOLE, PREFIX, TOKENS)


DEFINITIONS = (
    "*whole record*: the record regenerated whole and compared field by field (tokens, steps, accepted tokens "
    "per step, NLL, perplexity, score). *prefix K*: its steps regenerated up to its K-th token (`--prefix K`): "
    "tokens and accepted tokens per step over those steps, the NLL, perplexity and score of the committed tokens "
    "recomputed whole. *tokens only*: rows of the first audits, which compared token ids alone. A point's widest "
    "comparison is the widest any of its rows made. An outcome is `identical`, `identical through the prefix`, "
    "`error`, or the first field that differs (`tokens`: a divergence). *kernel*: `as the run` (the pair's own "
    "matmuls) or `bfloat16 linears in float32` (`mtad-audit --bf16-linears float32`). Records made on another "
    "machine kind cannot be expected to regenerate bit for bit: a difference there is no evidence of a code "
    "change by itself (`results/audit/statistical.md` compares metrics instead).")


def kind(row: Mapping[str, Any]) -> str:
    """The comparison a row made."""
    if row.get("prefix") is not None:
        return PREFIX
    return WHOLE if row.get("fields") else TOKENS


def outcome(row: Mapping[str, Any]) -> str:
    """A row's outcome: ``identical``, ``identical through the prefix``, ``error``, or the first
    field that differs (``tokens`` for a divergence)."""
    result = str(row.get("result", ""))
    if result.startswith("error"):
        return "error"
    if result == "identical":
        return "identical"
    if result.startswith("identical through"):
        return "identical through the prefix"
    if row.get("first_field"):
        return str(row["first_field"])
    return "tokens" if result.startswith("diverged") else result


def kernel(row: Mapping[str, Any]) -> str:
    from mtad.models.kernels import BF16_IN_FLOAT32

    return BF16_IN_FLOAT32 if BF16_IN_FLOAT32 in str(row.get("audited_on", "")) else "as the run"


def replaced(row: dict, base: Path, cache: dict) -> bool:
    """Whether the record an audit row audited has since been replaced (a rerun swapped in): the
    record at the row's point, index and turn now carries another segment than the one the row
    audited. Rows naming no record or no segment count as current, and so does a row whose point
    leads outside ``base`` (nothing outside the checkout is read for it); every file is read
    through ``mtad.core.io`` (a link or a FIFO is refused, a huge line too). ``base``: the checkout
    the row's point is relative to; ``cache``: the points' segments read so far."""
    from mtad.run.results.segments import SEGMENT_FIELD

    if not (row.get("point") and "index" in row and row.get("segment")):
        return False
    folder = (base / str(row["point"])).resolve()
    if not folder.is_relative_to(base.resolve()):  # a stored path never picks what is read
        return False
    if folder not in cache:
        samples = folder / "samples.jsonl"
        cache[folder] = {(int(r.get("index", -1)), int(r.get("turn", 0))): str(r.get(SEGMENT_FIELD))
                         for r in (read_jsonl(samples) if samples.exists() or samples.is_symlink() else [])}
    now = cache[folder].get((int(row["index"]), int(row.get("turn", 0))))
    return now is not None and now != str(row["segment"])


def audit_rows(audits: Path) -> dict[str, list[dict]]:
    """Every row of every ``*.jsonl`` in ``audits`` that still describes a committed record, by
    file name: a row whose record has since been replaced (``replaced``) says nothing about what
    is committed and is left out. Points are paths relative to the checkout holding ``audits``
    (``results/audit``). The one reader of audit rows for what they say about committed records:
    the coverage table and the tables' marks (``mtad.analysis.provenance_marks``) read them here,
    and the statistical table names the points whose audited records were replaced."""
    base, cache = audits.parent.parent, {}
    # every entry read through mtad.core.io: a link or a FIFO named *.jsonl is refused in one line
    return {f.name: [r for r in read_jsonl(f) if not replaced(r, base, cache)] for f in sorted(audits.glob("*.jsonl"))}


def coverage(points: Sequence[str], files: Mapping[str, Iterable[dict]]) -> list[str]:
    """Markdown lines: per point, its audit rows (by file), widest comparison, outcomes and
    kernels; then the counts."""
    by_point: dict[str, list[tuple[str, dict]]] = {p: [] for p in points}
    for name, rows in files.items():
        for r in rows:
            if r.get("point") in by_point:
                by_point[r["point"]].append((name, r))
    lines = ["| point | decoder / task | rows (file) | widest comparison | outcomes | kernel |",
             "|:--|:--|:--|:--|:--|:--|"]
    widest: Counter = Counter()
    per_row: Counter = Counter()
    for p in points:
        got = by_point[p]
        if not got:
            widest["not audited"] += 1
            lines.append(f"| `{md_cell(p)}` | – | 0 | not audited | – | – |")
            continue
        kinds = {kind(r) for _, r in got}
        top = next(k for k in ORDER if k in kinds)
        widest[top] += 1
        for _, r in got:
            per_row[(kind(r), outcome(r))] += 1
        files_n = Counter(name for name, _ in got)
        prefixes = sorted({r["prefix"] for _, r in got if kind(r) == PREFIX})
        shown_top = f"{top} {'/'.join(map(str, prefixes))}" if top == PREFIX else top
        outcomes = Counter(f"{outcome(r)} ({kind(r) if kind(r) != PREFIX else 'prefix'})" for _, r in got)
        first = got[0][1]
        lines.append(
            f"| `{md_cell(p)}` | {md_cell(first.get('decoder', '?'))} / {md_cell(first.get('task', '?'))} | "
            f"{len(got)} ({', '.join(f'{n} {md_cell(f)}' for f, n in sorted(files_n.items()))}) | {shown_top} | "
            f"{', '.join(f'{n} {md_cell(o)}' for o, n in sorted(outcomes.items()))} | "
            f"{', '.join(sorted({kernel(r) for _, r in got}))} |")
    n = len(points)
    audited_wide = widest[WHOLE] + widest[PREFIX]
    summary = [
        f"{audited_wide} of {n} committed points have a whole-record or prefix audit ({widest[WHOLE]} whole "
        f"record at widest, {widest[PREFIX]} prefix), {widest[TOKENS]} only token-only rows, "
        f"{widest['not audited']} none.", "",
        "Audit rows grouped by the comparison made and the row's outcome (its first differing field):", "",
        "| comparison | outcome | rows |", "|:--|:--|--:|",
        *[f"| {k} | {md_cell(o)} | {c} |" for (k, o), c in sorted(per_row.items(), key=lambda kv: (ORDER.index(kv[0][0]), kv[0][1]))],
    ]
    return [*summary, "", *lines]


def render(points: Sequence[Path], audits: Path, command: str) -> str:
    shown = [shown_path(p) for p in points]
    files = audit_rows(audits)
    head = ["# Audit coverage: every committed point and the audits that reached it", "",
            f"Made by `{command}` (`mtad.run.audit_coverage`) from {len(files)} audit files "
            f"({', '.join(f'`{f}`' for f in files)}).", "",
            DEFINITIONS, ""]
    return "\n".join([*head, *coverage(shown, files)]) + "\n"

#!/usr/bin/env python
"""Where the decoders' speed comparisons stand, in one block of ``docs/speed.md``, generated from
committed records: the overhead goals' verdicts (``bench/verdicts.py``'s record) and the offline
pair at plain temperature (``bench/compare_commits.py --bench speed``'s record).

    python bench/speed_summary.py docs/speed.md --verdicts results/bench/verdicts_target_rows_cpu.md \
        --offline results/bench/compare_commits_offline5_lean_loop_humaneval_cpu.md

rewrites the block between ``<!-- speed-summary:begin -->`` and ``<!-- speed-summary:end -->``;
``tests/test_bench.py`` checks that the committed docs hold what the committed records give.
Per decoder and mode: the lowest and highest ratio to SpD over the record's cells and the cells
by verdict, each verdict its cell's own 95% interval against the goal (not adjusted for the
number of cells), with the reason's letter where a cell is not met.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from verdicts import REASONS, SHORT, _cells  # noqa: E402

BEGIN, END = "<!-- speed-summary:begin -->", "<!-- speed-summary:end -->"
LIMIT = 1.5  # the goals' limit: a decoder's harness time per emitted token <= 1.5x SpD's
MODE_NAMES = {"greedy": "greedy", "topk10": "top-k 10", "plain": "plain", "topp0.9": "top-p 0.9"}
_CELL = re.compile(r"^(\d+\.\d+) (met|missed|unres)(?: (\S+))?$")
_IV = re.compile(r"^(\d+\.\d+) \[(\d+\.\d+), (\d+\.\d+)\]$")


def read_verdicts(path: Path) -> tuple[dict[str, dict[str, list[tuple[str, str, str]]]], list[str]]:
    """A ``bench/verdicts.py`` record: mode -> decoder -> [(ratio, verdict, reason letter or "")] over
    its cells, and the record's column headings per mode in order (the cells' settings)."""
    text = path.read_text()
    if not text.startswith("## Every goals cell, its verdict and why"):
        raise SystemExit(f"{path}: not a bench/verdicts.py record (its first line is not that script's heading)")
    out: dict[str, dict[str, list[tuple[str, str, str]]]] = {}
    settings: list[str] = []
    for part in text.split("\n### ")[1:]:
        mode, _, body = part.partition("\n")
        if mode.startswith("Cells by verdict"):
            continue
        lines = [line for line in body.splitlines() if line.startswith("| ")]
        head = _cells(lines[0])
        settings += head[1:]
        for line in lines[2:]:
            c = _cells(line)
            row = out.setdefault(mode, {}).setdefault(c[0], [])
            for cell in c[1:]:
                if cell == "-":
                    continue
                m = _CELL.match(cell)
                if m is None:
                    raise SystemExit(f"{path}: cell {cell!r} of {c[0]} ({mode}) is not 'ratio verdict [reason]'")
                row.append((m[1], m[2], m[3] or ""))
    if not out:
        raise SystemExit(f"{path}: no mode tables")
    return out, settings


def read_offline(path: Path) -> tuple[str, dict[str, tuple[str, str]]]:
    """A ``bench/compare_commits.py --bench speed`` record at plain temperature: the new commit, and
    per decoder its new time outside the models and its new wall time per token, each x SpD with
    its interval."""
    text = path.read_text()
    cmd = next((line for line in text.splitlines() if line.startswith("Command: ")), "")
    if "--bench speed" not in cmd:
        raise SystemExit(f"{path}: not a bench/compare_commits.py --bench speed record")
    if not all(k in cmd.split() for k in ("temperature=1", "top_k=0", "top_p=1.0")):
        raise SystemExit(f"{path}: its command is not at plain temperature (temperature=1 top_k=0 top_p=1.0)")
    new = re.search(r"--new (\S+)", cmd)
    rows = {}
    for line in text.splitlines():
        c = _cells(line)
        if len(c) == 8 and "/" in c[0] and c[1] != "system":
            rows[c[1]] = (c[4], c[7])
    if "spd" not in rows:
        raise SystemExit(f"{path}: no SpD row")
    return (new[1] if new else "?"), rows


def verdict(iv: str) -> str:
    """An interval's verdict against ``LIMIT``: met (wholly below or at it), missed (wholly above), unresolved."""
    m = _IV.match(iv)
    if m is None:
        raise SystemExit(f"{iv!r} is not 'ratio [low, high]'")
    lo, hi = float(m[2]), float(m[3])
    return "met" if hi <= LIMIT else "missed" if lo > LIMIT else "unresolved"


def _cell(entries: list[tuple[str, str, str]]) -> str:
    """``low-high: n met, n X, ...`` over a decoder's cells in one mode."""
    ratios = sorted(float(r) for r, _, _ in entries)
    span = f"{ratios[0]:.2f}" if ratios[0] == ratios[-1] else f"{ratios[0]:.2f}-{ratios[-1]:.2f}"
    tally: dict[str, int] = {}
    for _, v, why in entries:
        key = "met" if v == "met" else (why or v) + ("?" if v == "unres" else "")
        tally[key] = tally.get(key, 0) + 1
    order = ["met"] + [f"{SHORT[r]}{q}" for r in REASONS for q in ("", "?")]
    parts = [f"{tally[k]} {k}" for k in sorted(tally, key=lambda k: order.index(k) if k in order else len(order))]
    return f"{span}: " + ", ".join(parts)


def summary(verdicts: Path, offline: Path, names: tuple[str, str]) -> str:
    cells, settings = read_verdicts(verdicts)
    modes = [m for m in MODE_NAMES if m in cells] + [m for m in cells if m not in MODE_NAMES]
    decoders = list(dict.fromkeys(d for m in modes for d in cells[m]))
    used = {why for m in modes for d in cells[m] for _, v, why in cells[m][d] if v != "met"}
    letters = "; ".join(f"{SHORT[r]} {r}" for r in REASONS if SHORT[r] in used)
    vocabs = sorted({int(s.split("/")[0][1:]) for s in settings})
    drafts = sorted({s.split("/")[1] for s in settings})
    n = {m: sum(len(v) for v in cells[m].values()) for m in modes}
    met = {m: sum(1 for v in cells[m].values() for _, x, _ in v if x == "met") for m in modes}
    commit, rows = read_offline(offline)
    lines = [BEGIN,
             f"<!-- generated from {names[0]} and {names[1]} by `python bench/speed_summary.py docs/speed.md "
             f"--verdicts {names[0]} --offline {names[1]}`; tests/test_bench.py checks it -->",
             "**Where the speed comparisons stand.** The quantity is each decoder's harness time per "
             "emitted token (wall time less the two models' forward passes) as a multiple of SpD's, "
             f"against the goal of {LIMIT}x. Each verdict is its cell's own 95% bootstrap interval: met "
             f"(at or below {LIMIT}x), missed (above), unresolved (`?`: it straddles), not adjusted for the "
             "number of cells.", "",
             "On the tiny pair (`make bench-overhead-tiny`'s models: passes fast enough that the harness's "
             "work per step decides, as with a small draft on a GPU; at temperature 1 where a mode names no "
             f"temperature), from `{verdicts.name}`, which names its goals tables and floors. Per decoder and "
             "mode: the lowest and highest ratio over the mode's cells ("
             + " and ".join(f"{v:,}" for v in vocabs) + " tokens, " + " and ".join(drafts)
             + " drafts), and the cells by verdict, a cell not met by its reason's letter "
             f"({letters}).", "",
             "| decoder | " + " | ".join(MODE_NAMES.get(m, m) for m in modes) + " |",
             "| --- |" + " --- |" * len(modes)]
    for d in decoders:
        lines.append(f"| {d} | " + " | ".join(_cell(cells[m][d]) if d in cells[m] else "-" for m in modes) + " |")
    lines += ["", "Cells met: " + "; ".join(f"{MODE_NAMES.get(m, m)}, {met[m]} of {n[m]}" for m in modes) + ".", "",
              f"On the offline pair at plain temperature (`{offline.name}`, at {commit}: HumanEval, one "
              "interleaved round, the command in its first lines), x SpD, with each interval's verdict:", "",
              "| decoder | harness time per token | wall time per token |", "| --- | --- | --- |"]
    for d, (outside, wall) in rows.items():
        if d != "spd":
            lines.append(f"| {d} | {outside} {verdict(outside)} | {wall} |")
    lines += ["", "Where a tiny-pair cell is H or h, its gap beyond the goal is the harness's own work: the "
              "least work of the method's draws, as measured, is within the goal (H), or no floor was "
              "measured (h). A tokens/s comparison with that decoder on fast passes measures that work too.",
              END]
    return "\n".join(lines)


def rewrite(path: Path, block: str) -> bool:
    """Put ``block`` between the markers of ``path``; True if the file changed."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} block to rewrite")
    head, rest = text.split(BEGIN, 1)
    new = head + block + rest.split(END, 1)[1]
    if new != text:
        path.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("doc", type=Path, help="the file holding the block (docs/speed.md)")
    ap.add_argument("--verdicts", required=True, help="a bench/verdicts.py record")
    ap.add_argument("--offline", required=True, help="a bench/compare_commits.py --bench speed record at plain T")
    args = ap.parse_args(argv)
    for p in (args.verdicts, args.offline):
        if not Path(p).is_file():
            raise SystemExit(f"{p}: no such record")
    block = summary(Path(args.verdicts), Path(args.offline), (args.verdicts, args.offline))
    print(f"{args.doc}: {'rewritten' if rewrite(args.doc, block) else 'unchanged'}")
    return block


if __name__ == "__main__":
    main()

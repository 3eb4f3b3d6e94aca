#!/usr/bin/env python
"""Every cell of the overhead goals table with its verdict and, where the goal is not met, why:
joined by code from committed records.

A cell (vocabulary, draft, mode; decoder) takes its ratio to SpD and its verdict (met, missed,
unresolved: the 95% interval straddles 1.5x) from a goals table (``bench/compare_commits.py``'s
``*_goals_<commit>.md``, or ``bench/overhead.py``'s report). A cell that is not met gets one
reason, the first that holds:

- ``tokens per step``: the goals table takes it apart and finds SpD's tokens per step over the
  decoder's the larger factor (the rule's acceptance with these models, which the goal excuses);
- ``floor misses``: the draw floor (``bench/overhead.py --draw-floor``, plain temperature and
  top-p alone; ``--beam-floor``, greedy beams) says the least draw by the formulations measured,
  timed alone, already costs more than the goal allows: the method's draws, not the harness;
- ``floor misses after a pass``: timed alone the floor is within the goal, but timed right after
  a draft pass, as a run meets its rows, it is not;
- ``floor misses with the target's rows``: the draft's floor after a pass is within the goal, but
  with the target rows the rule normalises beyond SpD's (a record that measured them: its last
  columns, each row's least normalisation right after a target pass) it is not;
- ``harness``: the floor is within the goal every way measured: the rest of the gap is the harness's;
- ``harness (no floor)``: no floor was measured for the cell (top-k 10, where a draw reads 10
  entries; the decoders no floor covers).

With ``--row-ops`` (``bench/row_ops.py``'s record), each harness cell (H, h) says too what a faster
row kernel could do there, from that record's cell: ``g`` the rest alone (every decoder's operations
on vocabulary rows free) is still above the goal, so no row kernel closes it, only less glue; ``k``
a faster row kernel could close it; ``w`` within the goal in that run.

The floors come from their own runs (their prompts and commit, named in their records), the ratios
from the goals tables': a reason says what those records show together, no more.

    python bench/verdicts.py --goals results/bench/X_goals_C.md ... --floor results/bench/draw_floor_in_situ_cpu.md \
        --floor results/bench/draw_floor_topp_in_situ_cpu.md --beam-floor results/bench/beam_floor_cpu.md \
        --out results/bench/verdicts_cpu.md
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REASONS = ("tokens per step", "floor misses", "floor misses after a pass", "floor misses with the target's rows",
           "harness", "harness (no floor)")
SHORT = {"met": "met", "tokens per step": "†", "floor misses": "F", "floor misses after a pass": "P",
         "floor misses with the target's rows": "T", "harness": "H", "harness (no floor)": "h"}


def _rows(text: str, heading: str) -> list[list[str]]:
    """The table rows under the first heading that starts with ``heading``."""
    part = text.split("\n" + heading, 1)
    if len(part) < 2:
        raise SystemExit(f"no section starting {heading!r}: not a goals table")
    body = part[1].split("\n### ", 1)[0]
    return [_cells(line) for line in body.splitlines() if line.startswith("| V")]


def _cells(line: str) -> list[str]:
    """A markdown table row's cells."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


_MODES = re.compile(r"sample = T (\S+) top-k (\d+) top-p (\S+), sample_nok = T (\S+) top-p (\S+) without top-k")


def _modes(text: str, path: Path) -> dict[str, str]:
    """A goals table's modes as the floors name them (greedy, topk10, plain, topp0.9; a
    temperature other than 1 prefixes ``T<t>_``), read from its header's own description."""
    m = _MODES.search(text)
    if m is None:
        raise SystemExit(f"{path}: no 'sample = T .. top-k .. top-p .., sample_nok = ..' in its header: "
                         "not a goals table of bench/overhead.py")
    t, k, p, t_nok, p_nok = float(m[1]), int(m[2]), float(m[3]), float(m[4]), float(m[5])

    def temp(x: float) -> str:
        return "" if x == 1.0 else f"T{x:g}_"

    return {"greedy": "greedy", "sample": f"{temp(t)}topk{k}" + ("" if p >= 1.0 else f"_topp{p:g}"),
            "sample_nok": temp(t_nok) + ("plain" if p_nok >= 1.0 else f"topp{p_nok:g}")}


def _cell(setting: str, modes: dict[str, str]) -> str:
    head, mode = setting.rsplit("/", 1)
    if mode not in modes:
        raise SystemExit(f"unknown mode {mode!r} in {setting!r}")
    return f"{head}/{modes[mode]}"


def read_goals(path: Path) -> dict[tuple[str, str], dict]:
    """(cell ``V/draft/mode``, decoder) -> ratio text, verdict, whether tokens per step is the larger factor."""
    text = path.read_text()
    modes = _modes(text, path)
    cells = {}
    for c in _rows(text, "### goals (overhead per token"):
        if not c[1].endswith("_le_1.5x_spd"):
            continue
        cells[(_cell(c[0], modes), c[1].split("_le_")[0])] = {
            "ratio": c[2].split()[0], "verdict": c[4].split(",")[0].strip(), "tokens": False, "source": path.name}
    for c in _rows(text, "### goals against SpD not met"):
        key = (_cell(c[0], modes), c[1])
        if key in cells:
            cells[key]["tokens"] = c[7] == "tokens per step"
    return cells


def read_floor(path: Path) -> dict[tuple[str, str], tuple[str, str | None, str | None]]:
    """(cell, decoder) -> the floor's verdict timed alone, after a pass, and with the target's rows
    (None where not measured)."""
    out = {}
    for line in path.read_text().splitlines():
        if not line.startswith("| V"):
            continue
        c = _cells(line)
        out[(c[0], c[1])] = (c[10], c[14] if len(c) > 14 else None, c[19] if len(c) > 19 else None)
    return out


ROW_OPS = {"the rest alone misses: no row kernel closes it": "g", "faster row kernels could close it": "k",
           "within the goal": "w"}
ROW_OPS_WORDS = {"g": "the rest alone misses", "k": "row kernels could close it", "w": "within the goal there"}


def read_row_ops(path: Path) -> dict[tuple[str, str], str]:
    """(cell, decoder) -> ``ROW_OPS``'s letter for a ``bench/row_ops.py`` record's verdict."""
    out = {}
    for line in path.read_text().splitlines():
        if not line.startswith("| V"):
            continue
        c = _cells(line)
        if c[1] == "spd":
            continue
        if c[9] not in ROW_OPS:
            raise SystemExit(f"{path}: unknown row-ops verdict {c[9]!r}: not a bench/row_ops.py record")
        out[(c[0], c[1])] = ROW_OPS[c[9]]
    if not out:
        raise SystemExit(f"{path}: no cells: not a bench/row_ops.py record")
    return out


def reason(cell: dict, floor: tuple[str, str | None, str | None] | None) -> str:
    if cell["tokens"]:
        return "tokens per step"
    if floor is None:
        return "harness (no floor)"
    hot, after, target = (*floor, None)[:3]  # (a beam floor's record has no target columns)
    if hot.startswith("floor alone misses"):
        return "floor misses"
    if after is not None and after.startswith("misses after a pass"):
        return "floor misses after a pass"
    if target is not None and target.startswith("misses with the target's rows"):
        return "floor misses with the target's rows"
    return "harness"


def goals_spec(spec: str) -> tuple[Path, set[str] | None]:
    """``PATH`` or ``PATH:MODE,MODE``: a goals table, and the modes to take from it (None: all)."""
    path, _, modes = spec.partition(":")
    return Path(path), set(modes.split(",")) if modes else None


def render(goals: list[tuple[Path, set[str] | None]], floors: list[Path], row_ops: Path | None = None) -> str:
    cells: dict[tuple[str, str], dict] = {}
    for g, only in goals:
        for k, v in read_goals(g).items():
            if only is not None and k[0].rsplit("/", 1)[1] not in only:
                continue
            if k in cells:
                raise SystemExit(f"{k} is in two goals tables ({cells[k]['source']}, {g.name}): give one per mode")
            cells[k] = v
    floor: dict[tuple[str, str], tuple[str, str | None, str | None]] = {}
    for f in floors:
        floor.update(read_floor(f))
    target = any(v[2] is not None for v in floor.values())  # some record measured the target's rows
    reasons = [r for r in REASONS if target or r != "floor misses with the target's rows"]
    kernel = read_row_ops(row_ops) if row_ops else {}
    modes = ["greedy", "topk10", "plain", *sorted({k[0].rsplit("/", 1)[1] for k in cells} - {"greedy", "topk10", "plain"})]
    lines = ["## Every goals cell, its verdict and why (`bench/verdicts.py`)", "",
             " ".join((__doc__ or "").split("\n\n")[1].split()), "",
             "Reasons, in this order: " + "; ".join(f"{SHORT[r]} {r}" for r in reasons) + ".", "",
             "Goals tables: " + ", ".join(f"`{g.name}`" + (f" ({', '.join(sorted(m))})" if m else "")
                                          for g, m in goals) + ". Floors: "
             + ", ".join(f"`{f.name}`" for f in floors) + "."
             + (f" Row operations: `{row_ops.name}` (harness cells: " + "; ".join(
                 f"{k} {w}" for k, w in ROW_OPS_WORDS.items()) + ", - not in it)." if row_ops else "")]
    counts: dict[str, dict[str, int]] = {}
    for mode in modes:
        keys = sorted({k for k in cells if k[0].endswith("/" + mode)}, key=lambda k: (k[0], k[1]))
        if not keys:
            continue
        settings = sorted({k[0] for k in keys}, key=lambda s: (int(s.split("/")[0][1:]), s))
        systems = list(dict.fromkeys(k[1] for k in sorted(keys, key=lambda k: _order(k[1]))))
        lines += ["", f"### {mode}", "", "| decoder | " + " | ".join(settings) + " |",
                  "| --- |" + " ---: |" * len(settings)]
        tally = counts.setdefault(mode, {})
        for s in systems:
            row = []
            for st in settings:
                c = cells.get((st, s))
                if c is None:
                    row.append("-")
                    continue
                why = "met" if c["verdict"] == "met" else reason(c, floor.get((st, s)))
                k = kernel.get((st, s), "-") if row_ops and why.startswith("harness") else ""
                key = "met" if why == "met" else f"{c['verdict']}: {why}" + (
                    f"; {ROW_OPS_WORDS.get(k, 'not in the row-ops record')}" if k else "")
                tally[key] = tally.get(key, 0) + 1
                row.append(f"{c['ratio']} {c['verdict'] if c['verdict'] != 'unresolved' else 'unres'}"
                           + ("" if why == "met" else f" {SHORT[why]}{k}"))
            lines.append(f"| {s} | " + " | ".join(row) + " |")
    lines += ["", "### Cells by verdict and reason", "", "| mode | verdict: reason | cells |", "| --- | --- | ---: |"]
    for mode, tally in counts.items():
        lines += [f"| {mode} | {k} | {n} |" for k, n in sorted(tally.items())]
    return "\n".join(lines) + "\n"


def _order(system: str) -> int:
    order = ("specinfer", "mcss", "spectr", "mcns", "beam_specinfer", "tree_mtad", "mtad", "typical", "bild",
             "bild_sampling")
    return order.index(system) if system in order else len(order)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--goals", action="append", required=True,
                    help="a goals table, PATH or PATH:MODE,... (modes: greedy, topk10, plain, topp<P>); repeat")
    ap.add_argument("--floor", type=Path, action="append", default=[], help="a --draw-floor record (repeat)")
    ap.add_argument("--beam-floor", type=Path, action="append", default=[], help="a --beam-floor record (repeat)")
    ap.add_argument("--row-ops", type=Path, help="a bench/row_ops.py record: what row kernels could do per harness cell")
    ap.add_argument("--out", type=Path, help="write the table here (markdown)")
    args = ap.parse_args(argv)
    goals = [goals_spec(g) for g in args.goals]
    for p in [*(g for g, _ in goals), *args.floor, *args.beam_floor, *([args.row_ops] if args.row_ops else [])]:
        if not p.is_file():
            raise SystemExit(f"{p}: no such record")
    text = render(goals, [*args.floor, *args.beam_floor], args.row_ops)
    if args.out:
        args.out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    sys.exit(0 if main() else 1)

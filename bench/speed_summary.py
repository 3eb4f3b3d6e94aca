#!/usr/bin/env python
"""Where the decoders' speed comparisons stand, in one block of ``docs/speed.md``, generated from
committed records: the overhead goals' verdicts (``bench/verdicts.py``'s record) and the offline
pair at plain temperature (``bench/compare_commits.py --bench speed``'s record).

    python bench/speed_summary.py docs/speed.md --verdicts results/bench/verdicts_target_rows_cpu.md \
        --offline results/bench/compare_commits_offline5_lean_loop_humaneval_cpu.md

rewrites the block between ``<!-- speed-summary:begin -->`` and ``<!-- speed-summary:end -->``;
``tests/test_bench.py`` checks that the committed docs hold what the committed records give.
Per decoder and mode: the lowest and highest ratio to SpD over the record's cells and the cells
by verdict, with the record's reason letter where a cell is not met. The verdicts are Holm-adjusted
over every cell of the record (``adjusted``: each cell's interval made again from the kept runs its
goals table names and checked against the record, its p against the goal from the same bootstrap),
so none is stronger than its adjusted verdict; the offline pair's intervals are shown as recorded,
with no verdict drawn.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verdicts import REASONS, ROW_OPS_WORDS, SHORT, _cells  # noqa: E402

BEGIN, END = "<!-- speed-summary:begin -->", "<!-- speed-summary:end -->"
ALPHA = 0.05  # family-wise error of the adjusted verdicts
LIMIT = 1.5  # the goals' limit: a decoder's harness time per emitted token <= 1.5x SpD's
MODE_NAMES = {"greedy": "greedy", "topk10": "top-k 10", "plain": "plain", "topp0.9": "top-p 0.9"}
_CELL = re.compile(r"^(\d+\.\d+) (met|missed|unres)(?: (\S+))?$")


def read_verdicts(path: Path) -> tuple[dict[str, dict[str, list[tuple[str, str, str, str]]]], list[str]]:
    """A ``bench/verdicts.py`` record: mode -> decoder -> [(setting, ratio, verdict, reason letter or
    "")] over its cells, and every cell's setting (``V32000/equal/plain``), in the record's order."""
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
            for setting, cell in zip(head[1:], c[1:]):
                if cell == "-":
                    continue
                m = _CELL.match(cell)
                if m is None:
                    raise SystemExit(f"{path}: cell {cell!r} of {c[0]} ({mode}) is not 'ratio verdict [reason]'")
                row.append((setting, m[1], m[2], m[3] or ""))
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


def _kept_rows(goals: Path) -> list[dict]:
    """The runs a ``bench/compare_commits.py`` goals table was made from (its header names them:
    ``from `DIR/COMMIT_*.json```, beside it), every round's rows as repeats, as it pooled them."""
    from compare_commits import pooled_rows

    m = re.search(r"its (\d+) run\(s\) of `bench/compare_commits.py`.*?from `([^`/]+)/([0-9a-f]+)_\*\.json`",
                  goals.read_text())
    if m is None:
        raise SystemExit(f"{goals}: names no kept runs (`its N run(s) ... DIR/COMMIT_*.json`): not a "
                         "compare_commits goals table")
    files = [goals.parent / m[2] / f"{m[3]}_{r}.json" for r in range(int(m[1]))]
    if not all(f.is_file() for f in files):
        raise SystemExit(f"{goals}: its kept runs {m[2]}/{m[3]}_*.json are not there")
    return pooled_rows([json.loads(f.read_text()) for f in files])


def adjusted(verdicts: Path, cells: dict) -> dict[tuple[str, str], tuple[str, float, int, float]]:
    """(setting, decoder) -> (Holm-adjusted verdict, adjusted p, prompts, raw p) for every cell of the record.

    Each cell's interval is made again from the kept runs of the goals table the record names,
    as ``bench/overhead.py`` made it (per-prompt harness time per token pooled over repeats; the
    ratio of geometric means to SpD's, ``mtad.core.stats``' paired bootstrap); a cell whose
    estimate or unadjusted verdict differs from the record's is refused. Its two-sided p against
    the goal is twice the smaller one-sided p (``stats.p_value``: below, above the limit); Holm's
    step-down adjusts them over every cell of the record together. A cell keeps its verdict where
    its adjusted p is below 5%, else it is unresolved: never stronger than the record's."""
    import overhead  # noqa: E402  (bench/: the goals tables' own code)
    import verdicts as vmod  # noqa: E402

    from mtad.core import stats

    text = verdicts.read_text()
    listed = re.search(r"^Goals tables: (.*?)\. Floors", text, re.M)
    if listed is None:
        raise SystemExit(f"{verdicts}: no 'Goals tables: ...' line")
    ivs: dict[tuple[str, str], stats.Interval] = {}
    for name, only in re.findall(r"`([^`]+)`(?: \(([^)]*)\))?", listed[1]):
        path = verdicts.parent / name
        modes = vmod._modes(path.read_text(), path)
        rows = _kept_rows(path)
        for setting in dict.fromkeys(r["setting"] for r in rows):
            cell = vmod._cell(setting, modes)
            if only and cell.rsplit("/", 1)[1] not in only.split(", "):
                continue
            sub = [r for r in rows if r["setting"] == setting]
            tok = {s: overhead._per_prompt([r for r in sub if r["system"] == s], "tokens")
                   for s in dict.fromkeys(r["system"] for r in sub)}
            for s, per in tok.items():
                common = sorted(set(per) & set(tok.get("spd", {})))
                if s != "spd" and common:
                    ivs[(cell, s)] = stats.ratio_of_geometric_means([per[p] for p in common],
                                                                   [tok["spd"][p] for p in common])
    keys, ps, said, n = [], [], {}, {}
    for mode in cells.values():
        for d, entries in mode.items():
            for setting, ratio, v, _ in entries:
                iv = ivs.get((setting, d))
                if iv is None:
                    raise SystemExit(f"{verdicts}: {setting} {d} is in no kept run of its goals tables")
                mine = "met" if iv.high <= LIMIT else "missed" if iv.low > LIMIT else "unres"
                if f"{iv.estimate:.2f}" != ratio or mine != v:
                    raise SystemExit(f"{verdicts}: {setting} {d} says {ratio} {v}; its kept runs give "
                                     f"{iv.estimate:.2f} {mine}")
                keys.append((setting, d))
                ps.append(min(1.0, 2 * min(stats.p_value(iv, LIMIT, "below"), stats.p_value(iv, LIMIT, "above"))))
                said[(setting, d)], n[(setting, d)] = v, iv.n
    return {k: ((said[k] if said[k] != "unres" and p < ALPHA else "unres"), p, n[k], raw)
            for k, p, raw in zip(keys, stats.holm(ps), ps)}


def _cell(decoder: str, entries: list[tuple[str, str, str, str]], holm: dict) -> str:
    """``low-high: n met, n X, ...`` over a decoder's cells in one mode, by Holm-adjusted verdict: met,
    or the record's reason letter with ``?`` where unresolved after adjustment (``?`` alone: a cell
    met before it)."""
    ratios = sorted(float(r) for _, r, _, _ in entries)
    span = f"{ratios[0]:.2f}" if ratios[0] == ratios[-1] else f"{ratios[0]:.2f}-{ratios[-1]:.2f}"
    tally: dict[str, int] = {}
    for setting, _, _, why in entries:
        v = holm[(setting, decoder)][0]
        key = "met" if v == "met" else why + ("?" if v == "unres" else "")
        tally[key] = tally.get(key, 0) + 1
    order = ["met", "?"] + [f"{SHORT[r]}{k}{q}" for r in REASONS for k in ("", *ROW_OPS_WORDS, "-") for q in ("", "?")]
    parts = [f"{tally[k]} {k}" for k in sorted(tally, key=lambda k: order.index(k) if k in order else len(order))]
    return f"{span}: " + ", ".join(parts)


def summary(verdicts: Path, offline: Path, names: tuple[str, str]) -> str:
    cells, settings = read_verdicts(verdicts)
    holm = adjusted(verdicts, cells)
    modes = [m for m in MODE_NAMES if m in cells] + [m for m in cells if m not in MODE_NAMES]
    decoders = list(dict.fromkeys(d for m in modes for d in cells[m]))
    used = {why for m in modes for d in cells[m] for _, _, v, why in cells[m][d] if v != "met"}
    letters = "; ".join(f"{SHORT[r]} {r}" for r in REASONS if any(w[:1] == SHORT[r] for w in used))
    row_ops = re.search(r"Row operations: `([^`]+)`", verdicts.read_text())
    if row_ops:  # a harness cell's second letter: what its row operations could do (bench/row_ops.py)
        seen = {w[1:] for w in used if len(w) > 1}
        source = verdicts.parent / row_ops[1]
        if not source.is_file():
            raise SystemExit(f"{verdicts}: its row-ops record {row_ops[1]} is not beside it")
        made = re.search(r"git ([0-9a-f]+)", source.read_text())
        letters += (f"; a harness cell's second letter from `{row_ops[1]}` (other prompts, at "
                    f"{made[1] if made else 'a commit it does not name'}): "
                    + "; ".join(f"{k} {w}" for k, w in [*ROW_OPS_WORDS.items(), ("-", "not in it")] if k in seen))
    vocabs = sorted({int(s.split("/")[0][1:]) for s in settings})
    drafts = sorted({s.split("/")[1] for s in settings})

    def count(m: str, which: int) -> int:  # cells met in mode m: 0 as the record says, 1 after Holm
        return sum(1 for d, es in cells[m].items() for s, _, v, _ in es
                   if (v if which == 0 else holm[(s, d)][0]) == "met")

    n = {m: sum(len(v) for v in cells[m].values()) for m in modes}
    prompts = sorted({x[2] for x in holm.values()})
    decided = [x for x in holm.values() if x[0] != "unres"]
    from mtad.core.stats import N_RESAMPLES

    least = 2 / (1 + N_RESAMPLES)  # a two-sided p with no resample on the goal's other side
    changed = sorted((s, d) for m in modes for d, es in cells[m].items() for s, _, v, _ in es if holm[(s, d)][0] != v)
    commit, rows = read_offline(offline)
    lines = [BEGIN,
             f"<!-- generated from {names[0]} and {names[1]} by `python bench/speed_summary.py docs/speed.md "
             f"--verdicts {names[0]} --offline {names[1]}`; tests/test_bench.py checks it -->",
             "**Where the speed comparisons stand.** The quantity is each decoder's harness time per "
             "emitted token (wall time less the two models' forward passes) as a multiple of SpD's, "
             f"against the goal of {LIMIT}x.", "",
             "On the tiny pair (`make bench-overhead-tiny`'s models: passes fast enough that the harness's "
             "work per step decides, as with a small draft on a GPU; at temperature 1 where a mode names no "
             f"temperature), from `{verdicts.name}` (goals at "
             + ", ".join(sorted(set(re.findall(r"_goals_([0-9a-f]+)\.md", verdicts.read_text()))) or ["?"])
             + "), which names its goals tables and floors. Per decoder and "
             "mode: the lowest and highest ratio over the mode's cells ("
             + " and ".join(f"{v:,}" for v in vocabs) + " tokens, " + " and ".join(drafts)
             + " drafts), and the cells by verdict. A verdict is Holm-adjusted over all "
             f"{len(holm)} cells (family-wise error {ALPHA:.0%}; each cell's interval made again from the "
             "kept runs and checked against the record, its p against the goal from the same bootstrap): "
             "met, or a cell not met by the record's reason "
             f"({letters}), `?` where it is unresolved after adjustment (`?` alone: met before it).", "",
             "| decoder | " + " | ".join(MODE_NAMES.get(m, m) for m in modes) + " |",
             "| --- |" + " --- |" * len(modes)]
    for d in decoders:
        lines.append(f"| {d} | " + " | ".join(_cell(d, cells[m][d], holm) if d in cells[m] else "-"
                                              for m in modes) + " |")
    lines += ["", "Cells met after adjustment (before it, each cell's own 95% interval): "
              + "; ".join(f"{MODE_NAMES.get(m, m)}, {count(m, 1)} of {n[m]} ({count(m, 0)})" for m in modes) + ". "
              + f"Each cell's interval is over its {' or '.join(map(str, prompts))} prompts (the rounds "
              "pooled): "
              f"{sum(abs(x[3] - least) < 1e-12 for x in decided)} of the {len(decided)} decided cells have every resample "
              f"on one side of the goal (p {least:.2g}; the least adjusted p is "
              f"{min(x[1] for x in holm.values()):.2g}). "
              + (f"The adjustment leaves {len(changed)} cell(s) unresolved that the record decides: "
                 + ", ".join(f"{d} at {s} ({dict((x[0], x[2]) for x in cells[s.rsplit('/', 1)[1]][d])[s]})"
                             for s, d in changed) + "." if changed else "The adjustment changes no cell's verdict."),
              "",
              f"On the offline pair at plain temperature (`{offline.name}`, at {commit}: HumanEval, one "
              "interleaved round, the command in its first lines), x SpD, each with its record's 95% "
              "interval (not adjusted; no verdict drawn here):", "",
              "| decoder | harness time per token | wall time per token |", "| --- | --- | --- |"]
    for d, (outside, wall) in rows.items():
        if d != "spd":
            lines.append(f"| {d} | {outside} | {wall} |")
    lines += ["", "Where a tiny-pair cell is H or h, its gap beyond the goal is the harness's own work: the "
              "least work of the method's draws, as measured, is within the goal (H), or no floor was "
              "measured (h)."
              + (" With g, the row-ops run found that cell above the goal even with every decoder's "
                 "operations on vocabulary rows free: only less of the rest (the engine, the decoders' "
                 "Python, small tensors, the runner's masks and caches, numpy's searches) would close it." if row_ops else "")
              + " A tokens/s comparison with that decoder on fast passes measures that work too.", END]
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

"""Rerun committed points with today's code, resumably, and swap the new records in.

    mtad-rerun POINT... [--staging reruns] [--swap] [--status]

A point whose records were made by code that has since changed its draws
(``mtad.run.audit.DRAW_CHANGES``; ``results/audit/rerun_candidates.md`` lists them) is rebuilt
from its folder (``mtad.run.results.described``: the project's ``conf/`` members by name, the
folder's knobs; refused in one line when the rebuilt identity is not the folder's) and run by
``mtad.run.evaluate.run`` into a staging folder, ``STAGING/<the point's path>`` (committed, so
that a rerun longer than one sitting resumes where it stopped, from any later checkout; its
records carry their own segments). The run uses the thread count that made the committed
records (their summary's ``torch_threads``, at most this machine's CPUs). A rerun replaces
committed records, so it runs from a clean checkout (a frozen worktree): uncommitted changes
outside the staging folder are refused in one line (``--allow-dirty`` overrides; the records'
segments then say dirty).

``--swap`` replaces the point's ``samples.jsonl``, ``segments.jsonl``, ``summary.json`` and
``config.json`` by the staged ones, only when the staging folder holds a record for every
(example, turn) the point holds and the same identity; the point's ``point.json`` is kept, and the
staging folder is removed. The replaced files are kept in ``STAGING/replaced/<the point's path>``
(outside ``results/``: no reader takes them for a point), so the old and new records can be
compared by code; the note of the commit that swaps lists every number that changed
(``mtad-render``, ``mtad-claims`` re-rendered).

Other folders that hold the same point (the same identity, e.g. a Table 2 cell's folder of 100
examples whose first 30 came from a claims folder of 30) get the rerun's records too, for the
records they hold that were made before a change of draws (``mtad.run.audit.DRAW_CHANGES``) and
that the rerun made: what a rerun of that folder would make for them (same point, seeds, code
and machine). Their other records stay; their replaced files are kept the same way; their
segments gain the rerun's; their summaries are rewritten from their records. Only with
``--share-with ROOT`` (e.g. ``results``): the folders of the point under ROOT.

``--status`` prints, per point, how many of its records are staged, and stops. ``--compare
FILE.md`` writes, per point, its committed records against the rerun's (staged, or swapped in and
compared with the replaced ones), paired by example over the examples both hold, with the
statistical audit's statistics and criterion (``mtad.run.audit_stats``): whether the rerun's
metrics are consistent with the committed ones, and by how much they moved.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("mtad.rerun")

#: What a swap replaces in the point folder (``point.json`` is the point's own and stays).
SWAPPED = ("samples.jsonl", "segments.jsonl", "summary.json", "config.json")
DEFAULT_STAGING = Path("reruns")


class RerunRefused(Exception):
    """A point that cannot be rerun or swapped as asked; the message says why and what to do."""


def staging_of(point: Path, staging: Path) -> Path:
    """``staging/<point's path relative to the checkout>`` (absolute points keep their last parts)."""
    from mtad.core.io import shown_path

    shown = Path(shown_path(point))
    parts = shown.parts[1:] if shown.is_absolute() else shown.parts
    return staging.joinpath(*[p for p in parts if p not in ("..", ".")])


def replaced_of(point: Path, staging: Path) -> Path:
    """Where a swap keeps the point's replaced files: ``staging/replaced/<point's path>``."""
    return staging_of(point, staging / "replaced")


def _keys(folder: Path) -> set[tuple[str, int]]:
    from mtad.run.results import PointFolder, record_key

    if not (folder / "samples.jsonl").exists():
        return set()
    return {record_key(r) for r in PointFolder(folder).check().records}


def rebuilt_config(point: Path, overrides: list[str] | tuple = ()):
    """The point's config as this checkout runs it; RerunRefused when it is not the same point."""
    from mtad.run.results.described import describe, rebuild, report

    rebuilt = rebuild(describe(point), overrides)
    report(rebuilt, point)
    if rebuilt.identity_differs:
        raise RerunRefused(f"{point}: today's config for it is another point (identity differs: "
                           f"{'; '.join(rebuilt.ignored) or 'a default changed'}); a rerun would not "
                           "replace its records, run it as a new point instead")
    return rebuilt.cfg


def status(point: Path, staging: Path) -> str:
    want, have = _keys(point), _keys(staging_of(point, staging))
    return f"{point}: {len(want & have)} of {len(want)} records staged in {staging_of(point, staging)}"


def rerun(point: Path, staging: Path, overrides: list[str] | tuple = ()) -> Path:
    """Run (or resume) ``point`` into its staging folder; returns the folder."""
    import torch

    from mtad.run.evaluate import run
    from mtad.run.results import PointFolder, read_json
    from mtad.run.results.described import recorded_threads

    cfg = rebuilt_config(point, overrides)
    pf = PointFolder(point)
    summary = read_json(pf.file("summary.json")) or {}
    threads = recorded_threads(summary, point)  # at most this machine's CPUs
    if threads is not None:
        torch.set_num_threads(threads)
    stored = pf.point()
    target = staging_of(point, staging)
    target.mkdir(parents=True, exist_ok=True)
    run(cfg, output_dir=target, overrides=list(stored.get("overrides") or []),
        choices=dict(stored.get("choices") or {}))
    return target


def swap(point: Path, staging: Path) -> list[str]:
    """Replace the point's records by the staged ones (see the module docstring); returns the
    files replaced. RerunRefused when the staging folder is not complete or not the same point."""
    from mtad.core.io import write_json_atomic
    from mtad.run.results import PointFolder, read_json

    target = staging_of(point, staging)
    for folder in (point, target):  # a link, FIFO or device where a file belongs: refused, never followed
        PointFolder(folder).check_entries()
    want, have = _keys(point), _keys(target)
    if not want <= have:
        raise RerunRefused(f"{point}: {len(want - have)} of its {len(want)} records are not staged in "
                           f"{target}; run `mtad-rerun {point}` to finish them, then --swap")
    mine, staged = PointFolder(point).identity_hash(), PointFolder(target).identity_hash()
    if mine is None or mine != staged:
        raise RerunRefused(f"{point}: the staging folder {target} holds point {staged}, not {mine}; "
                           "remove it and rerun")
    if not (target / "summary.json").exists():
        raise RerunRefused(f"{point}: {target} has no summary.json (the rerun did not finish); rerun it")
    aside = replaced_of(point, staging)
    aside.mkdir(parents=True, exist_ok=True)
    for name in SWAPPED:
        if (point / name).is_file():
            shutil.copyfile(point / name, aside / name)
    for name in SWAPPED:
        if name.endswith(".json"):
            data: dict[str, Any] = read_json(target / name) or {}
            # the run wrote the staging path as its output_dir; the records live in the point
            if "output_dir" in data:
                data["output_dir"] = str(point)
            if isinstance(data.get("config"), dict) and "output_dir" in data["config"]:
                data["config"]["output_dir"] = str(point)
            write_json_atomic(point / name, data)
        else:
            shutil.copyfile(target / name, point / (name + ".swap"))
            (point / (name + ".swap")).replace(point / name)
    shutil.rmtree(target)
    return list(SWAPPED)


def share(point: Path, staging: Path, root: Path = Path("results")) -> dict[str, int]:
    """After ``swap(point)``: give every other folder under ``root`` that holds the same point
    the swapped-in records for its records made before a change of draws (module docstring).
    Returns {folder: records replaced}."""
    from mtad.core.io import read_jsonl, rewrite_jsonl, shown_path
    from mtad.run.audit import made_before_a_draw_change
    from mtad.run.results import PointFolder, record_key
    from mtad.run.results.segments import SEGMENT_FIELD, SEGMENTS_FILE, segments
    from mtad.run.results.store import Catalog

    mine = PointFolder(point)
    h = mine.identity_hash()
    new = {record_key(r): r for r in read_jsonl(point / "samples.jsonl")}
    new_segs = segments(mine)
    out = {}
    for other in Catalog([root]).folders(h or ""):
        if other.path.resolve() == point.resolve() or not other.file("samples.jsonl").is_file():
            continue
        other.check_entries()  # as swap: never follow a link or read a FIFO in another folder
        segs = segments(other)
        records = read_jsonl(other.file("samples.jsonl"))
        replaced, used = 0, {}
        rows = []
        for r in records:
            k = record_key(r)
            before = made_before_a_draw_change(segs.get(str(r.get(SEGMENT_FIELD))))
            if before and k in new:
                rows.append(new[k])
                used[str(new[k][SEGMENT_FIELD])] = new_segs[str(new[k][SEGMENT_FIELD])]
                replaced += 1
            else:
                rows.append(r)
        if not replaced:
            continue
        aside = replaced_of(other.path, staging)
        aside.mkdir(parents=True, exist_ok=True)
        for name in ("samples.jsonl", SEGMENTS_FILE):
            if other.file(name).is_file():
                shutil.copyfile(other.file(name), aside / name)
        kept = [s for s in read_jsonl(other.file(SEGMENTS_FILE))] if other.file(SEGMENTS_FILE).is_file() else []
        still = {str(r.get(SEGMENT_FIELD)) for r in rows}
        kept = [s for s in kept if str(s.get(SEGMENT_FIELD)) in still and str(s.get(SEGMENT_FIELD)) not in used]
        rewrite_jsonl(other.file(SEGMENTS_FILE), kept + list(used.values()))
        rewrite_jsonl(other.file("samples.jsonl"), rows)
        refresh_summary(other.path)
        out[shown_path(other.path)] = replaced
    return out


def refresh_summary(folder: Path) -> None:
    """Rewrite ``folder``'s summary from its records (a resume with nothing left to make)."""
    from mtad.run.evaluate import run
    from mtad.run.results import PointFolder, requested_limit

    cfg = rebuilt_config(folder)
    pf = PointFolder(folder)
    if not pf.finished(pf.identity_hash() or "", requested_limit(cfg)):
        log.warning("%s: not finished (records missing); its summary is left as it was, "
                    "run the point to finish it", folder)
        return
    stored = pf.point()
    run(cfg, output_dir=folder, overrides=list(stored.get("overrides") or []),
        choices=dict(stored.get("choices") or {}))


def compared_records(point: Path, staging: Path) -> tuple[list[dict], str]:
    """Audit-style rows (``metrics``: recorded / regenerated, ``fields.tokens``) pairing the
    point's committed records with its rerun's, and which records were compared."""
    from mtad.core.io import read_jsonl
    from mtad.run.audit import record_metrics
    from mtad.run.results import record_key

    stage, replaced = staging_of(point, staging), replaced_of(point, staging)
    if (replaced / "samples.jsonl").is_file():
        old, new, what = replaced / "samples.jsonl", point / "samples.jsonl", "swapped in"
    else:
        old, new, what = point / "samples.jsonl", stage / "samples.jsonl", "staged"
    if not new.is_file():
        return [], "no rerun"
    committed = {record_key(r): r for r in read_jsonl(old)}
    rows = []
    for r in read_jsonl(new):
        c = committed.get(record_key(r))
        if c is None:
            continue
        same = c["output_ids"] == r["output_ids"]
        rows.append({"example_id": r["example_id"], "turn": r["turn"], "fields": {"tokens": "same" if same else "differs"},
                     "metrics": {"recorded": record_metrics(c), "regenerated": record_metrics(r)}})
    return rows, what


def rerun_points(staging: Path) -> list[Path]:
    """The points with a rerun under ``staging``: staged (``staging/<point>``) or swapped in
    (``staging/replaced/<point>``), as paths relative to the checkout, sorted."""
    out = set()
    for samples in staging.rglob("samples.jsonl"):
        rel = samples.parent.relative_to(staging)
        if rel.parts and rel.parts[0] == "replaced":
            rel = Path(*rel.parts[1:])
        out.add(rel)
    return sorted(out)


def render_compare(points: list[Path], staging: Path) -> str:
    """Markdown: each point's committed metrics against its rerun's (``--compare``)."""
    from mtad.core.io import shown_path
    from mtad.run import audit_stats
    from mtad.run.audit_stats import LEVEL, MIN_EXAMPLES, _cell, compare_point

    lines = ["# Reruns: committed records against today's code", "",
             f"Made by `mtad-rerun --compare` (`mtad.run.rerun`). Per point, the committed records "
             "against its rerun's (made by today's code: `mtad-rerun`, staged in `reruns/<point>/` "
             "until swapped in), paired by example over the examples both hold, as the statistical "
             f"audit compares them (`{audit_stats.__name__}`: perplexity as the ratio of geometric means "
             "rerun / committed, block efficiency and score as differences of means, each with a "
             f"percentile bootstrap interval at {LEVEL:.1%}; *consistent* when every interval holds "
             f"no difference; no verdict under {MIN_EXAMPLES} examples). A record's NLL also depends "
             "on the machine kind that ran its teacher-forced pass (`docs/results.md`), so a "
             "perplexity ratio here holds that difference as well as the draws'.", "",
             "| point | rerun | examples | same tokens | perplexity | block efficiency | score | verdict |",
             "|:--|:--|--:|--:|:--|:--|:--|:--|"]
    for p in points:
        rows, what = compared_records(p, staging)
        if not rows:
            lines.append(f"| `{shown_path(p)}` | {what} | 0 | – | – | – | – | – |")
            continue
        c = compare_point(rows)
        m = c["metrics"]
        lines.append(f"| `{shown_path(p)}` | {what} | {c['examples']} | {c['identical']} of {c['records']} | "
                     f"{_cell(m.get('perplexity'))} | {_cell(m.get('block efficiency'))} | {_cell(m.get('score'))} | "
                     f"{c['verdict']} |")
    return "\n".join(lines) + "\n"


def uncommitted(staging: Path) -> list[str]:
    """Tracked files with uncommitted changes, outside the staging folder (a rerun's own)."""
    from mtad.run.provenance import git_info

    info = git_info()
    inside = staging.resolve()
    from mtad.core.io import REPO_ROOT

    out = []
    for c in info.get("changed") or []:
        path = (Path(REPO_ROOT) / c).resolve()
        if inside != path and inside not in path.parents:
            out.append(c)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mtad-rerun", description=__doc__.split("\n\n")[0])
    p.add_argument("points", nargs="+", metavar="POINT", help="committed point folders")
    p.add_argument("--staging", type=Path, default=DEFAULT_STAGING,
                   help=f"where reruns are staged (default {DEFAULT_STAGING}/)")
    p.add_argument("--swap", action="store_true", help="swap completed reruns into their points (runs nothing)")
    p.add_argument("--status", action="store_true", help="print how much of each point is staged, and stop")
    p.add_argument("--compare", type=Path, default=None, metavar="FILE.md",
                   help="write each point's committed metrics against its rerun's, and stop")
    p.add_argument("--share-with", type=Path, default=None, metavar="ROOT",
                   help="--swap: also give the folders of the same point under ROOT (e.g. results) the "
                        "rerun's records for theirs made before a change of draws")
    p.add_argument("--allow-dirty", action="store_true",
                   help="rerun from a checkout with uncommitted changes (its segments say so)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="this machine's setting (e.g. task.data_dir=DIR), repeatable; never a knob of the point")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from mtad.run.config import ConfigError
    from mtad.run.results import BadResultsFile, PointFolder
    from mtad.run.results.targets import UntrustedConfig

    points = [Path(x) for x in args.points]
    for f in points:
        try:
            PointFolder(f).check_entries()  # a link, FIFO or the like in its place: refused first, by name
        except BadResultsFile as e:
            print(f"mtad-rerun: {e}", file=sys.stderr)
            return 2
        if not (f / "samples.jsonl").is_file() or not (f / "point.json").is_file():
            print(f"mtad-rerun: {f} is not a committed point folder (point.json and samples.jsonl)", file=sys.stderr)
            return 2
    if args.status:
        for f in points:
            print(status(f, args.staging))
        return 0
    if args.compare is not None:
        from mtad.core.io import write_text_atomic

        args.compare.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.compare, render_compare(points, args.staging))
        return 0
    try:
        if args.swap:
            for f in points:
                swap(f, args.staging)
                print(f"mtad-rerun: {f}: swapped in the rerun's records ({', '.join(SWAPPED)})")
                if args.share_with is not None:
                    for other, n in share(f, args.staging, args.share_with).items():
                        print(f"mtad-rerun: {other} (the same point): {n} records made before a change "
                              "of draws replaced by the rerun's")
            return 0
        dirty = [] if args.allow_dirty else uncommitted(args.staging)
        if dirty:
            raise RerunRefused(f"uncommitted changes ({', '.join(dirty[:5])}{' ...' if len(dirty) > 5 else ''}): "
                               "a rerun replaces committed records, so run it from a clean checkout "
                               "(git worktree add ../frozen HEAD), or pass --allow-dirty")
        for f in points:  # every point checked before the first record is made
            rebuilt_config(f, args.override)
        for f in points:
            rerun(f, args.staging, args.override)
            print(status(f, args.staging))
    except (RerunRefused, ConfigError, UntrustedConfig, BadResultsFile) as e:
        print(f"mtad-rerun: {e}", file=sys.stderr)
        return 2
    return 0


def cli() -> None:
    from mtad.core import allocator
    from mtad.run.results import exit_on_bad_results

    allocator.tune()  # as a run's own entry point does (mtad.core.allocator)
    exit_on_bad_results(main)


if __name__ == "__main__":
    cli()

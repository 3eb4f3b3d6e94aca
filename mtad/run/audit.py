"""``mtad-audit``: does today's code still make a point's records?

``mtad-audit POINT [POINT ...] [--n 5] [--seed S] [--out audit.jsonl] [--table audit.md]``
draws ``n`` records of each point folder at random (``--seed``: the same draw on every run),
regenerates each one with today's code (the point as its folder describes it, rebuilt from
``conf/`` by ``mtad.run.results.described``: nothing the folder names is imported or resolved,
and its host settings are this invocation's, ``--override KEY=VALUE``; the record's seed
``seed + 1000 * index + turn``, a later turn conditioned on the recorded earlier answers, as the
run did) and reports, per record, ``identical`` or ``diverged at token k`` (the first position
where the regenerated ``output_ids`` differ from the recorded ones) together with the
provenance of the segment that made the record (``mtad.run.results.segments``; records written
before segments were kept say so) and the machine the audit ran on.

Results are appended to ``--out`` one line per record as each finishes, and a rerun skips the
records already there: a long audit can be stopped and resumed. ``--table`` (re)writes the
Markdown table from ``--out`` after every record and names the points given that have no
audited record yet. Bit-identical regeneration needs the same float kernels: bfloat16 records
made on another kind of CPU (AVX-512 BF16 / AMX / AVX2 emulation) or GPU may diverge without
any code change; the table prints both machines so a reader can tell.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

from mtad.core.io import append_jsonl, read_json, read_jsonl, shown_path
from mtad.run.results import PointFolder, identity_hash, record_key
from mtad.run.results.segments import describe_provenance, segment_of

log = logging.getLogger(__name__)


def first_difference(recorded: list[int], now: list[int]) -> int | None:
    """The first token position where the two sequences differ (a shorter one ends there);
    None when they are equal."""
    for k, (a, b) in enumerate(zip(recorded, now)):
        if a != b:
            return k
    return None if len(recorded) == len(now) else min(len(recorded), len(now))


def sample_records(records: list[dict], n: int, seed: int, point: str) -> list[dict]:
    """``n`` records drawn without replacement, the same for the same (seed, point)."""
    rng = random.Random(f"{seed}:{point}")
    keyed = sorted(records, key=lambda r: (int(r["index"]), int(r["turn"])))
    picked = rng.sample(keyed, min(n, len(keyed)))
    return sorted(picked, key=lambda r: (int(r["index"]), int(r["turn"])))


def this_machine() -> dict[str, Any]:
    from mtad.run.provenance import device_info, git_info
    return {"git": git_info(), "device": device_info()}


class _Builder:
    """``mtad.run.evaluate.build`` with the model pair loaded once per model config."""

    def __init__(self):
        self._pairs: dict[str, Any] = {}

    def build(self, cfg):
        from hydra.utils import instantiate
        from omegaconf import OmegaConf

        from mtad.core.engine import Engine
        from mtad.core.stopping import StopSequences
        from mtad.core.warping import Warping
        from mtad.models.pair import load_pair
        from mtad.run.config import validate

        validate(cfg)
        key = json.dumps(OmegaConf.to_container(cfg.model, resolve=True), sort_keys=True)
        if key not in self._pairs:
            self._pairs.clear()  # one pair in memory at a time
            self._pairs[key] = load_pair(cfg.model)
        pair = self._pairs[key]
        task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
        task_cfg.pop("scorer", None)
        task = instantiate(task_cfg)
        warping = Warping(float(cfg.temperature), int(cfg.top_k), float(cfg.top_p))
        stop = StopSequences.from_tokenizer(getattr(task, "stop", ()), pair.tokenizer)
        engine = Engine(pair.target, pair.draft, instantiate(cfg.decoder), warping, pair.vocab_size,
                        pair.eos_token_ids, stop)
        return pair, task, engine


def audit_point(folder: Path, n: int, seed: int, builder: _Builder, done: set, out: Path | None,
                machine: dict, indices: set[int] | None = None, overrides: list[str] | tuple = ()) -> list[dict]:
    """Audit ``n`` sampled records of ``folder`` (those not in ``done``); append each row to
    ``out`` as it finishes; return the rows. ``indices``: these examples' records instead of a
    random draw. ``overrides``: this machine's settings (``key=value``), never the folder's."""
    from mtad.run.results.described import describe, rebuild, report

    pf = PointFolder(folder)
    stored, _ = pf.stored()
    if stored is None:
        raise SystemExit(f"mtad-audit: {folder} is not a point folder (no point.json or config.json)")
    h = identity_hash(stored)
    records = pf.check().records
    by_key = {record_key(r): r for r in records}
    chosen = ([r for r in records if int(r["index"]) in indices] if indices
              else sample_records(records, n, seed, h))
    picked = [r for r in chosen if (str(folder), int(r["index"]), int(r["turn"])) not in done]
    if not picked:
        return []
    rebuilt = rebuild(describe(folder), overrides)  # conf/ by name; refused in one line otherwise
    report(rebuilt, shown_path(folder))
    cfg = rebuilt.cfg
    summary = read_json(pf.file("summary.json")) or {}
    last_run = describe_provenance(summary.get("provenance"))
    pair, task, engine = builder.build(cfg)
    examples = task.load()
    import torch

    # the thread count of the run that made the records (a bfloat16 matmul's reduction order
    # may depend on it); the last run's when the records predate segments
    recorded_threads = (summary.get("provenance") or {}).get("torch_threads")
    if isinstance(recorded_threads, int) and recorded_threads > 0:
        torch.set_num_threads(recorded_threads)
    rows = []
    for r in picked:
        index, turn = int(r["index"]), int(r["turn"])
        row: dict[str, Any] = {
            "point": shown_path(folder), "identity_hash": h, "decoder": summary.get("decoder") or cfg.decoder._target_.split(".")[-1],
            "task": summary.get("task") or cfg.task.get("name"), "index": index, "turn": turn,
            "example_id": r["example_id"], "seed": seed,
            "made_by": describe_provenance(segment_of(pf, r)), "point_last_run": last_run,
            "audited_on": describe_provenance(machine),
            "threads": torch.get_num_threads(), "recorded_threads": recorded_threads,
        }
        t0 = time.perf_counter()
        try:
            ex = examples[index]
            if ex.id != r["example_id"]:
                raise ValueError(f"example {index} is {ex.id} today, the record says {r['example_id']}")
            previous = [by_key[(ex.id, t)]["text"] for t in range(turn)]
            ids = task.render(ex, pair.tokenizer, turn, previous)
            res = engine.generate(ids, int(cfg.max_new_tokens), seed=int(cfg.seed) + 1000 * index + turn)
            k = first_difference(list(r["output_ids"]), res.output_ids)
            row.update(result="identical" if k is None else f"diverged at token {k}",
                       diverged_at=k, recorded_tokens=len(r["output_ids"]), regenerated_tokens=len(res.output_ids))
        except Exception as e:  # noqa: BLE001  (a record that cannot be regenerated is a finding)
            row.update(result=f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200],
                       diverged_at=None)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        if out is not None:
            append_jsonl(out, row)
        log.info("%s %s/%s #%d turn %d: %s (%.0f s)", shown_path(folder), row["decoder"], row["task"],
                 index, turn, row["result"], row["seconds"])
        rows.append(row)
    return rows


def _kind(described: str) -> str:
    """The machine part of ``describe_provenance``'s line (after "on ", before the torch version)."""
    return described.split(" on ", 1)[-1].split(", torch")[0]


def render_table(rows: list[dict], points: list[str] | None = None, command: str | None = None,
                 notes: str | None = None) -> str:
    """The Markdown table of audited records, grouped by point, and the points not audited."""
    lines = ["# Audit: committed records regenerated with today's code", ""]
    if command:
        lines += [f"Made by `{command}` (`mtad.run.audit`).", ""]
    lines += [
        "Each row regenerates one randomly drawn record of a point (its stored config, its seed, "
        "earlier turns as recorded) and compares the token ids: `identical`, or `diverged at token k` "
        "(the first position that differs, 0-based). *made by* is the provenance of the record's "
        "segment (commit, dirty flag, machine); records written before segments were kept say "
        "`unknown (before segment provenance)` and *point's last run* gives the summary's provenance "
        "(the last run that touched the point, not necessarily the one that made the record). "
        "Bit-identical regeneration of bfloat16 records needs the same float kernels: a divergence "
        "on another kind of machine is not by itself a code change.",
        "",
    ]
    machines = sorted({r["audited_on"] for r in rows})
    if machines:
        lines += ["Audited on: " + "; ".join(f"`{m}`" for m in machines), ""]
    by_point: dict[str, list[dict]] = {}
    for r in rows:
        by_point.setdefault(r["point"], []).append(r)
    lines += ["*threads*: torch threads of the audit / of the point's last run (rows without the "
              "first were audited at torch's default on this 2-core machine, 2).", "",
              "| point | decoder | task | record (index/turn) | result | threads | made by | point's last run |",
              "|:--|:--|:--|:--|:--|:--|:--|:--|"]
    for point in sorted(by_point):
        for r in sorted(by_point[point], key=lambda r: (r["index"], r["turn"])):
            threads = f"{r.get('threads', '2?')} / {r.get('recorded_threads') or '?'}"
            lines.append(f"| `{point}` | {r['decoder']} | {r['task']} | {r['index']}/{r['turn']} | "
                         f"{r['result']} | {threads} | {r['made_by']} | {r['point_last_run']} |")
    lines.append("")
    if by_point:
        lines += ["", "Per point: the point's last run (commit, machine) and whether that machine is the "
                  "audit's kind (same CPU model, bf16 kind and torch kernel level).", "",
                  "| point | audited | identical | first divergence | point's last run | same machine kind |",
                  "|:--|--:|--:|:--|:--|:--|"]
        for point in sorted(by_point):
            rs = by_point[point]
            ks = [r["diverged_at"] for r in rs if r.get("diverged_at") is not None]
            same = {_kind(r["point_last_run"]) == _kind(r["audited_on"]) for r in rs}
            lines.append(f"| `{point}` | {len(rs)} | {sum(r['result'] == 'identical' for r in rs)} | "
                         f"{('token ' + str(min(ks))) if ks else '–'} | {rs[0]['point_last_run']} | "
                         f"{'unknown' if 'machine not recorded' in rs[0]['point_last_run'] else ('yes' if same == {True} else 'no')} |")
        lines.append("")
    identical = sum(1 for r in rows if r["result"] == "identical")
    lines.append(f"{identical} of {len(rows)} audited records identical, over {len(by_point)} points.")
    not_repro = sorted(p for p, rs in by_point.items() if any(r["result"] != "identical" for r in rs))
    if not_repro:
        lines += ["", "Points with a record not reproduced: " + ", ".join(f"`{p}`" for p in not_repro) + "."]
    if points is not None:
        missing = [p for p in points if p not in by_point]
        if missing:
            lines += ["", f"Not audited yet ({len(missing)} of {len(points)} points): "
                      + ", ".join(f"`{p}`" for p in missing) + "."]
    if notes:
        lines += ["", "## About this audit", "", notes.strip()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mtad-audit", description=__doc__.split("\n\n")[0])
    p.add_argument("points", nargs="+", metavar="POINT", help="point folders (holding point.json and samples.jsonl)")
    p.add_argument("--n", type=int, default=5, help="records drawn per point (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    p.add_argument("--out", type=Path, default=None, help="JSON lines of audited records (appended; resumes)")
    p.add_argument("--table", type=Path, default=None, help="Markdown table rewritten after every record")
    p.add_argument("--render-only", action="store_true", help="only (re)write --table from --out")
    p.add_argument("--records", default=None, metavar="I,J,...",
                   help="audit these example indices (every turn) instead of a random draw of --n")
    p.add_argument("--notes", type=Path, default=None, help="Markdown appended to --table (About this audit)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="this machine's setting (e.g. task.data_dir=DIR), repeatable; never taken from a folder")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.n < 1:
        print(f"mtad-audit: --n must be at least 1, not {args.n}", file=sys.stderr)
        return 2
    try:
        indices = {int(x) for x in args.records.split(",")} if args.records else None
    except ValueError:
        print(f"mtad-audit: --records takes example indices like 3,17, not {args.records!r}", file=sys.stderr)
        return 2
    folders = [Path(x) for x in args.points]
    for f in folders:
        if not (f / "samples.jsonl").exists():
            print(f"mtad-audit: {f} holds no samples.jsonl; give point folders", file=sys.stderr)
            return 2
    shown = [shown_path(f) for f in folders]
    rows = read_jsonl(args.out) if args.out is not None and args.out.exists() else []
    command = "mtad-audit " + " ".join(
        [f"--n {args.n}", f"--seed {args.seed}"] + ([f"--out {shown_path(args.out)}"] if args.out else [])
        + [f"POINT x{len(folders)}"])

    def write_table():
        if args.table is not None:
            args.table.parent.mkdir(parents=True, exist_ok=True)
            notes = args.notes.read_text() if args.notes is not None and args.notes.exists() else None
            args.table.write_text(render_table([r for r in rows if r["point"] in shown], shown, command, notes))

    if args.render_only:
        write_table()
        return 0
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    done = {(str(Path(r["point"])), r["index"], r["turn"]) for r in rows if r.get("seed") == args.seed}
    done |= {(str(f), i, t) for f in folders for (pt, i, t) in list(done) if pt == shown_path(f)}
    builder, machine = _Builder(), this_machine()
    from mtad.run.config import ConfigError
    from mtad.run.results import BadResultsFile
    from mtad.run.results.described import describe, rebuild
    from mtad.run.results.targets import UntrustedConfig

    for f in folders:  # every folder checked before the first regeneration
        try:
            rebuild(describe(f), args.override)
        except (ConfigError, UntrustedConfig, BadResultsFile) as e:
            print(f"mtad-audit: {e}", file=sys.stderr)
            return 2
    for f in folders:
        for row in audit_point(f, args.n, args.seed, builder, done, args.out, machine, indices, args.override):
            rows.append(row)
            if args.out is None:
                print(json.dumps(row))
            write_table()
    write_table()
    return 0


def cli() -> None:
    from mtad.core import allocator

    allocator.tune()  # as the audited run's own entry point did (mtad.core.allocator)
    sys.exit(main())


if __name__ == "__main__":
    cli()

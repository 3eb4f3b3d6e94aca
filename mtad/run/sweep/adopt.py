"""Adopt points stored under another stop set: ``python -m mtad.run.sweep.adopt <sweep file>...``.

The stop set (``model.eos_token_ids``, ``task.stop``) is part of a point's identity, so a
change to it gives every affected point a new hash. Records need not be regenerated when the
new stop set would not have cut them: the random stream is the same up to the stop, so a
record in which no new stop id or sequence occurs before its end is exactly what the new code
writes. For each point of a sweep whose identity no folder holds, this finds the folder under
the sweep's directory that holds the same point but for its stop set, replays the new stop
set over every record with the engine's own rule (``mtad.core.stopping.Stopping`` built from the
pair's tokenizer) and

- adopts the folder when every record ends where, and as, the new code would end it: a new
  ``point.json`` (the new identity, ``adopted`` saying from which hash and why), the new hash
  in ``summary.json``, the stop set written into the stored configs; records untouched;
- leaves it as it is otherwise (the point is then regenerated into ``<sweep>/<new hash>/``),
  naming the records that would have stopped earlier.

``--check`` reports and writes nothing. Only the stop set may differ: any other difference
is another point. Folders are changed under their lock.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from mtad.core.io import refuse_link
from mtad.core.stopping import Stopping, StopSequences
from mtad.run.results import (
    CONFIG_FILE,
    FORMAT,
    POINT_FILE,
    SUMMARY_FILE,
    BadResultsFile,
    PointFolder,
    identity,
    identity_hash,
    now_utc,
    read_json,
    read_summary,
    record_key,
    write_json_atomic,
)
from mtad.run.results.described import describe as describe_folder
from mtad.run.results.identity import STOP_KEYS, stop_set, without_stop
from mtad.run.results.store import is_point_folder
from mtad.run.results.targets import UntrustedConfig
from mtad.run.sweep.plan import Point, Sweep, load

log = logging.getLogger(__name__)

ADOPTED, REGENERATE, CURRENT, NONE = "adopted", "regenerate", "current", "none"


@dataclass
class Outcome:
    point: Point
    status: str  # ADOPTED, REGENERATE, CURRENT (a folder holds the new hash), NONE (no folder)
    folder: Path | None = None
    old_hash: str | None = None
    records: int = 0
    cut: list[str] = field(default_factory=list)  # "example/turn: why" of records the new set would cut


def record_problem(record: dict, stopping: Stopping) -> str | None:
    """Why the new stop set would not write ``record`` as it is; None when it would."""
    ids = [int(t) for t in record.get("output_ids") or []]
    hit = stopping.first(ids)
    reason = record.get("stop_reason")
    if hit is None:
        return None if reason == "length" else f"ended on {reason!r}, the new stop set does not end it there"
    if hit.index == len(ids) - 1 and hit.reason == reason:
        return None
    return f"{hit.reason} at token {hit.index + 1} of {len(ids)} (recorded: {reason})"


def stopping_for(point: Point, cache: dict) -> Stopping:
    """The stop rule the engine uses for ``point``: the pair's EOS ids and the task's sequences."""
    from mtad.models.pair import load_tokenizer

    key = json.dumps(OmegaConf.to_container(point.cfg.model, resolve=True), sort_keys=True, default=str)
    if key not in cache:
        cache[key] = load_tokenizer(point.cfg.model)
    tok = cache[key]
    stops = list(OmegaConf.select(point.cfg, "task.stop") or [])
    return Stopping(tok.eos_token_ids, StopSequences.from_tokenizer(stops, tok.tokenizer))


def _earlier(sweep: Sweep, ident: dict, new_hash: str) -> list[PointFolder]:
    """Folders under the sweep's directory holding ``ident`` but for its stop set."""
    want = without_stop(ident)
    out = []
    for d in sorted(sweep.dir.iterdir()) if sweep.dir.is_dir() else ():
        if not d.is_dir() or d.name.startswith(".") or not is_point_folder(d):
            continue
        refuse_link(d)  # a linked folder would lead the adoption's writes out of the sweep
        stored, kind = PointFolder(d).stored()
        if kind == "current" and identity_hash(stored) != new_hash and without_stop(stored) == want:
            try:
                describe_folder(d)  # its stored config is data (mtad.run.results.described), or it is not adopted
            except (UntrustedConfig, BadResultsFile) as e:
                log.warning("not adopted: %s", e)
                continue
            out.append(PointFolder(d))
    return out


def _with_stop(config: dict | None, ident: dict) -> dict | None:
    """A stored resolved config with the new stop set written in (keys the identity holds)."""
    if not isinstance(config, dict):
        return config
    config = json.loads(json.dumps(config))
    for section, key in STOP_KEYS:
        if isinstance(config.get(section), dict):
            value = (ident.get(section) or {}).get(key)
            if value is None:
                config[section].pop(key, None)
            else:
                config[section][key] = value
    return config


def _adopt(folder: PointFolder, point: Point, ident: dict, new_hash: str, old_hash: str, n: int) -> None:
    old = read_json(folder.file(POINT_FILE)) or {}
    write_json_atomic(folder.file(POINT_FILE), {
        "format": FORMAT,
        "identity_hash": new_hash,
        "identity": ident,
        "overrides": list(point.overrides),
        "choices": dict(point.choices),
        "created_utc": old.get("created_utc"),
        **({"seeded": old["seeded"]} if "seeded" in old else {}),
        "adopted": {"from_hash": old_hash, "because": "stop set", "stop": stop_set(ident),
                    "records_checked": n, "time_utc": now_utc()},
    })
    summary = read_summary(folder.file(SUMMARY_FILE))
    if summary is not None:
        summary["identity_hash"] = new_hash
        summary["config"] = _with_stop(summary.get("config"), ident)
        write_json_atomic(folder.file(SUMMARY_FILE), summary)
    config = read_json(folder.file(CONFIG_FILE))
    if config is not None:
        write_json_atomic(folder.file(CONFIG_FILE), _with_stop(config, ident))


def adopt(sweep: Sweep, check: bool = False) -> list[Outcome]:
    """Adopt (or, with ``check``, only judge) the earlier folders of ``sweep``'s points."""
    store, cache, outcomes = sweep.store(), {}, []
    for p in sweep.known():
        folder = sweep.folder(p, store)
        if folder.identity_hash() == p.hash:
            outcomes.append(Outcome(p, CURRENT, folder.path))
            continue
        ident = identity(p.cfg)
        earlier = _earlier(sweep, ident, p.hash)
        if not earlier:
            outcomes.append(Outcome(p, NONE))
            continue
        # several: the one with most records (as Store.folder does for duplicates)
        src = max(earlier, key=lambda f: len(f.check().records))
        with src.lock():
            checked = src.check()
            stopping = stopping_for(p, cache)
            cut = [f"{'/'.join(map(str, record_key(r)))}: {why}" for r in checked.records
                   if (why := record_problem(r, stopping)) is not None]
            if not checked.clean:
                cut.append(f"samples.jsonl: {checked.describe()}")
            out = Outcome(p, REGENERATE if cut else ADOPTED, src.path, src.identity_hash(),
                          len(checked.records), cut)
            if not cut and not check:
                _adopt(src, p, ident, p.hash, out.old_hash, len(checked.records))
        outcomes.append(out)
    if not check and any(o.status == ADOPTED for o in outcomes):
        from mtad.run.sweep.execute import write_index

        write_index(sweep)
    return outcomes


def describe(o: Outcome) -> str:
    label = f"{o.point.choices.get('decoder', '?')}/{o.point.choices.get('task', '?')}"
    if o.status == CURRENT:
        return f"  {o.point.hash}  current     {label}  [in {o.folder.name}/]"
    if o.status == NONE:
        return f"  {o.point.hash}  no records  {label}"
    head = f"  {o.point.hash}  {o.status:<11} {label}  [from {o.old_hash} in {o.folder.name}/, {o.records} records"
    if o.status == ADOPTED:
        return head + "]"
    return head + f"; {len(o.cut)} would end earlier, e.g. {o.cut[0]}]"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mtad.run.sweep.adopt", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_files", nargs="+", help="experiments/<sweep>.yaml")
    ap.add_argument("--root", help="results root (default: each file's sweep.root)")
    ap.add_argument("--check", action="store_true", help="report only; write nothing")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    for path in args.sweep_files:
        sweep = load(path, root=args.root)
        outcomes = adopt(sweep, check=args.check)
        print(f"sweep {sweep.name} ({Path(path).name}) -> {sweep.dir}")
        for o in outcomes:
            print(describe(o))
        counts = {s: sum(o.status == s for o in outcomes) for s in (ADOPTED, REGENERATE, CURRENT, NONE)}
        print("  " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


def cli() -> None:
    """The console script (``[project.scripts]`` in pyproject.toml)."""
    from mtad.run.results import exit_on_bad_results

    exit_on_bad_results(main)


if __name__ == "__main__":
    cli()

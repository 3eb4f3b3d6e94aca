"""Segments for committed records made before segments were kept, derived from the repository's
history.

``python -m mtad.run.results.derive_segments [ROOT ...] [--check]`` (``ROOT``: ``results`` by
default) gives every record of every ``samples.jsonl`` under ``ROOT`` that has no ``segment``
field a *derived* segment, and writes it to the folder's ``segments.jsonl``:

- **which commit added the record.** Every line ever added to a ``samples.jsonl`` under
  ``results/`` is read from ``git log -p`` (oldest first). A record is recognised by its
  *generation*: example id, turn, output ids and its timings (wall, prefill, target forward),
  which two generations never share; so a record copied into another folder, or rewritten
  later (rescored, a path in its text made portable), still points to the commit that first
  added it, and the folder it was added in (``added_as``). When a later commit gave the line
  its present content, ``rewritten_in`` names it (the ``segment`` field itself left out of the
  comparison).
- **what made it.** The provenance of the ``summary.json`` committed beside that line in that
  commit (``git show COMMIT:FOLDER/summary.json``): the commit and dirty flag of the run that
  wrote the summary, its package versions, its machine, torch threads and seed. That summary
  was written by the last run before the commit, which made the added records unless several
  runs added records between two commits; nothing in the files tells them apart. A field the
  summary did not record is ``"unknown"``, never filled in.

A derived segment holds ``derived`` (how it was derived, ``added_in``, ``added_utc``,
``added_as``, ``provenance_from``, ``rewritten_in``) and the provenance fields a run's segment
holds (``mtad.run.results.segments``). Records of one folder added by the same commit in the
same folder, and rewritten by the same commits, share a segment.

Adding ``"segment": ID`` as the record's last field is the only change made to a record: every
line, with that field taken out, is byte for byte what it was (checked before anything is
written). Records that already carry a segment are left alone. ``--check`` writes nothing: it
derives again from the history and exits 1 when a record has no segment, a segment names no
line of its folder's ``segments.jsonl``, or a committed derived segment differs from what the
history gives.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from mtad.core.io import REPO_ROOT, git, loads
from mtad.run.results.segments import SEGMENT_FIELD, SEGMENTS_FILE, describe_provenance

SAMPLES = "samples.jsonl"
UNKNOWN = "unknown"
#: How a derived segment was derived (its ``derived.how``).
HOW = ("the commit that first added this record's generation to a samples.jsonl under results/ "
       "(git log -p), and the provenance of the summary.json committed beside it in that commit")
#: The fields of a record that identify one generation: two runs never share its timings.
GENERATION = ("example_id", "turn", "output_ids", "wall_time", "prefill_time", "target_forward_time")
#: Provenance fields a segment holds, as ``summary.json``'s ``provenance`` names them.
PROVENANCE_FIELDS = ("time_utc", "git", "packages", "device", "torch_threads", "seed")


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    """Git in ``root``, starting no program its config names (``mtad.core.io.git``; the diffing
    commands below add ``--no-ext-diff --no-textconv``)."""
    return git(root, *args)


def without_segment(line: str) -> str:
    """A record's line with a trailing ``"segment": ...`` field (as ``with_segment`` adds it)
    taken out; other lines unchanged."""
    body = line.rstrip("\n")
    head, sep, tail = body.rpartition(f', "{SEGMENT_FIELD}": ')
    if sep and tail.endswith("}") and tail[:-1].startswith('"') and tail[:-1].endswith('"') and '"' not in tail[1:-2]:
        return head + "}"
    return body


def with_segment(line: str, segment: str) -> str:
    """``line`` (one JSON object) with ``"segment": segment`` appended as its last field."""
    body = line.rstrip("\n")
    if not body.endswith("}") or body == "{}":
        raise ValueError(f"not a record line: {body[:60]!r}")
    return body[:-1] + f", {json.dumps(SEGMENT_FIELD)}: {json.dumps(segment)}}}"


def generation_key(line: str) -> str:
    """A digest of the generation a record line holds (``GENERATION``); the whole line's when
    it is not a record."""
    try:
        rec = json.loads(line)
    except ValueError:
        rec = None
    if isinstance(rec, dict) and all(k in rec for k in GENERATION):
        body = json.dumps([rec[k] for k in GENERATION])
    else:
        body = without_segment(line)
    return hashlib.sha256(body.encode()).hexdigest()


def _digest(line: str) -> str:
    return hashlib.sha256(without_segment(line).encode()).hexdigest()


@dataclass
class Added:
    """Where a line first appeared: the commit, its date, the file."""
    commit: str
    utc: str
    path: str


@dataclass
class History:
    """Every line added to a ``samples.jsonl`` under the repository's ``results/``, by generation
    (``first``) and by exact content without a segment (``exact``), and how many lines each file
    held after each commit (``lines``)."""
    first: dict[str, Added] = field(default_factory=dict)
    exact: dict[str, Added] = field(default_factory=dict)
    lines: dict[tuple[str, str], int] = field(default_factory=dict)


def read_history(root: Path = REPO_ROOT) -> History:
    """``git log -p`` over every ``samples.jsonl`` under ``results/``, oldest commit first."""
    out = _git(root, "log", "--reverse", "--topo-order", "--format=@@COMMIT %H %cI", "-p", "-U0",
               "--no-renames", "--no-color", "--no-ext-diff", "--no-textconv", "--", ":(glob)results/**/" + SAMPLES)
    if out.returncode != 0:
        raise SystemExit(f"derive_segments: git log failed in {root}: {out.stderr.strip()[:200]}")
    hist = History()
    counts: Counter = Counter()
    commit = utc = path = None
    for raw in out.stdout.split("\n"):
        if raw.startswith("@@COMMIT "):
            _, commit, utc = raw.split(" ", 2)
        elif raw.startswith("diff --git "):
            path = raw.split(" b/", 1)[1]
        elif raw.startswith("+++ ") or raw.startswith("--- "):
            if raw == "+++ /dev/null":
                counts[path] = 0
        elif raw.startswith("+") and path and path.endswith(SAMPLES):
            line = raw[1:]
            hist.first.setdefault(generation_key(line), Added(commit, utc, path))
            hist.exact.setdefault(_digest(line), Added(commit, utc, path))
            counts[path] += 1
            hist.lines[(commit, path)] = counts[path]
        elif raw.startswith("-") and path and path.endswith(SAMPLES):
            counts[path] -= 1
            hist.lines[(commit, path)] = counts[path]
    return hist


def provenance_then(root: Path, added: Added, cache: dict) -> tuple[dict[str, Any], str | None]:
    """The provenance fields of the summary committed beside ``added`` (``"unknown"`` for each
    one it does not hold) and where they were read."""
    folder = str(PurePosixPath(added.path).parent)
    key = (added.commit, folder)
    if key not in cache:
        where = f"{added.commit}:{folder}/summary.json"
        shown = _git(root, "show", "--no-textconv", where)
        summary = None
        if shown.returncode == 0:
            try:
                summary = loads(shown.stdout)
            except ValueError:
                summary = None
        prov = summary.get("provenance") if isinstance(summary, dict) else None
        if not isinstance(prov, dict):
            cache[key] = ({k: UNKNOWN for k in PROVENANCE_FIELDS}, None)
        else:
            fields = {k: prov[k] if prov.get(k) is not None else UNKNOWN for k in PROVENANCE_FIELDS}
            if fields["torch_threads"] == UNKNOWN and isinstance(prov.get("device"), dict) \
                    and prov["device"].get("torch_threads") is not None:
                fields["torch_threads"] = prov["device"]["torch_threads"]
            cache[key] = (fields, f"{added.commit[:12]}:{folder}/summary.json")
    return cache[key]


def next_summary(root: Path, added: Added, cache: dict) -> str | None:
    """When the commit that added a record holds no summary beside it (a run committed before it
    finished): the next summary of that folder, described (``mtad.run.results.segments``). It is
    the last run before that later commit, not necessarily the one that made the record, so it
    is a hint, never the segment's provenance."""
    folder = str(PurePosixPath(added.path).parent)
    key = ("next", added.commit, folder)
    if key not in cache:
        later = _git(root, "log", "--reverse", "--ancestry-path", "--format=%H", f"{added.commit}..HEAD",
                     "--", f"{folder}/summary.json").stdout.split()
        cache[key] = None
        for c in later:
            prov, source = provenance_then(root, Added(c, "", added.path), cache)
            if source is not None:
                cache[key] = f"{source}: {describe_provenance(prov)}"
                break
    return cache[key]


def derived_segment(root: Path, added: Added, rewritten: list[str], hist: History, cache: dict) -> dict[str, Any]:
    """A derived segment's line (its id included)."""
    prov, source = provenance_then(root, added, cache)
    derived = {
        "how": HOW, "added_in": added.commit, "added_utc": added.utc, "added_as": added.path,
        "lines_in_file_then": hist.lines.get((added.commit, added.path)),
        "provenance_from": source if source else UNKNOWN, "rewritten_in": rewritten,
    }
    if source is None and added.commit != UNKNOWN:
        derived["next_summary"] = next_summary(root, added, cache)
    body = {"derived": derived, **prov}
    seg = "d" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:9]
    return {SEGMENT_FIELD: seg, **body}


def samples_files(roots: Iterable[Path]) -> list[Path]:
    """Every ``samples.jsonl`` under ``roots`` that git does not ignore (``mtad.core.io.not_git_ignored``:
    a local run's output under ``results/runs/`` is no committed record), sorted."""
    from mtad.core.io import not_git_ignored

    return sorted(not_git_ignored([p for r in roots for p in Path(r).rglob(SAMPLES) if p.is_file()]))


@dataclass
class Plan:
    """What the derivation gives one ``samples.jsonl``: its new lines, and the segments they name
    that its ``segments.jsonl`` lacks."""
    path: Path
    lines: list[str]
    new_lines: list[str]
    segments: list[dict]
    recorded: int = 0
    derived: int = 0


def _relative(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def plan_file(path: Path, root: Path, hist: History, cache: dict) -> Plan:
    lines = path.read_text(encoding="utf-8").splitlines()
    existing = _segment_lines(path.parent)
    new_lines, needed, plan = [], {}, Plan(path, lines, [], [])
    rel = _relative(path, root)
    for line in lines:
        rec = json.loads(line)
        own = existing.get(str(rec.get(SEGMENT_FIELD)))
        if own is not None and "derived" not in own:
            new_lines.append(line)  # a run's own segment: recorded provenance
            plan.recorded += 1
            continue
        added = hist.first.get(generation_key(line))
        now = hist.exact.get(_digest(line))
        if added is None:  # not in the history (not committed yet): nothing to derive from
            added = Added(UNKNOWN, UNKNOWN, rel)
        # the commit that gave the line today's content, when not the one that added it
        rewritten = [now.commit] if now is not None and now.commit != added.commit else []
        seg = derived_segment(root, added, rewritten, hist, cache)
        needed[seg[SEGMENT_FIELD]] = seg
        new_lines.append(with_segment(without_segment(line), seg[SEGMENT_FIELD]))
        plan.derived += 1
    plan.new_lines = new_lines
    plan.segments = [s for k, s in sorted(needed.items(), key=lambda kv: (kv[1]["derived"]["added_utc"], kv[0]))
                     if k not in existing]
    return plan


def _segment_lines(folder: Path) -> dict[str, dict]:
    p = folder / SEGMENTS_FILE
    if not p.exists():
        return {}
    return {str(s[SEGMENT_FIELD]): s for s in map(json.loads, p.read_text(encoding="utf-8").splitlines())
            if SEGMENT_FIELD in s}


def unchanged_but_segment(old: str, new: str) -> bool:
    """Whether ``new`` is ``old`` plus a trailing segment field and nothing else (bytes and JSON)."""
    if without_segment(new) != without_segment(old):
        return False
    a, b = json.loads(old), json.loads(new)
    a.pop(SEGMENT_FIELD, None)
    b.pop(SEGMENT_FIELD, None)
    return a == b


def check_plans(plans: list[Plan]) -> list[str]:
    """Problems: a record that would change in more than its segment, a committed derived
    segment that the history no longer gives, a segment naming no line of its folder's file."""
    problems = []
    for p in plans:
        known = _segment_lines(p.path.parent)
        for i, (old, new) in enumerate(zip(p.lines, p.new_lines)):
            if not unchanged_but_segment(old, new):
                problems.append(f"{p.path} line {i + 1}: the derivation would change more than its segment")
            seg = json.loads(old).get(SEGMENT_FIELD)
            if seg is None:
                problems.append(f"{p.path} line {i + 1}: no segment")
            elif str(seg) not in known:
                problems.append(f"{p.path} line {i + 1}: segment {seg} is no line of {SEGMENTS_FILE}")
            elif old != new:
                problems.append(f"{p.path} line {i + 1}: segment {seg} is not what the history gives "
                                f"({json.loads(new)[SEGMENT_FIELD]})")
    return problems


def write_plan(p: Plan) -> None:
    for old, new in zip(p.lines, p.new_lines):
        if not unchanged_but_segment(old, new):
            raise SystemExit(f"derive_segments: {p.path}: refusing a change beyond the segment field")
    if p.segments:
        with open(p.path.parent / SEGMENTS_FILE, "a", encoding="utf-8") as f:
            for s in p.segments:
                f.write(json.dumps(s) + "\n")
    if p.new_lines != p.lines:
        tmp = p.path.with_name(p.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in p.new_lines), encoding="utf-8")
        tmp.replace(p.path)


def provenance_counts(roots: Iterable[Path]) -> dict[str, int]:
    """Records under ``roots`` by where their provenance comes from: ``recorded`` (a run's own
    segment), ``derived`` (a derived segment whose machine, versions and commit the summary of
    the time recorded), ``derived_partly_unknown`` (derived, some field unknown: usually the
    machine), ``unknown`` (no segment, or a derived one with nothing known), ``records``."""
    c: Counter = Counter()
    for path in samples_files(roots):
        known = _segment_lines(path.parent)
        for line in path.read_text(encoding="utf-8").splitlines():
            c["records"] += 1
            seg = known.get(str(json.loads(line).get(SEGMENT_FIELD)))
            if seg is None:
                c["unknown"] += 1
            elif "derived" not in seg:
                c["recorded"] += 1
            elif all(seg.get(k) == UNKNOWN for k in PROVENANCE_FIELDS):
                c["unknown"] += 1
            elif machine_unknown(seg) or any(seg.get(k) == UNKNOWN for k in PROVENANCE_FIELDS):
                c["derived_partly_unknown"] += 1
            else:
                c["derived"] += 1
    return {k: c.get(k, 0) for k in ("records", "recorded", "derived", "derived_partly_unknown", "unknown")}


def machine_unknown(seg: Mapping[str, Any]) -> bool:
    """Whether a segment names no CPU model and no GPU."""
    device = seg.get("device")
    if not isinstance(device, Mapping):
        return True
    return not device.get("cuda_devices") and not isinstance(device.get("cpu_info"), Mapping)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mtad.run.results.derive_segments",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="*", type=Path, default=[Path("results")],
                    help="folders searched for samples.jsonl (default: results)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 on a missing or stale segment")
    ap.add_argument("--repo", type=Path, default=REPO_ROOT,
                    help="the git checkout (default: the one this code is in; git is never started in a folder "
                         "because it is the working directory)")
    args = ap.parse_args(argv)
    root = args.repo
    for r in args.roots:
        if not r.is_dir():
            print(f"derive_segments: {r} is not a folder; give the results folders to derive", file=sys.stderr)
            return 2
    hist = read_history(root)
    cache: dict = {}
    plans = [plan_file(p, root, hist, cache) for p in samples_files(args.roots)]
    if args.check:
        problems = check_plans(plans)
        for line in problems[:20]:
            print(line, file=sys.stderr)
        if problems:
            print(f"derive_segments: {len(problems)} problems; run python -m mtad.run.results.derive_segments",
                  file=sys.stderr)
            return 1
        print(json.dumps(provenance_counts(args.roots)))
        return 0
    for p in plans:
        write_plan(p)
    print(json.dumps({"files": len(plans), **provenance_counts(args.roots)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

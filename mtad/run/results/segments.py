"""Segments: which run made which records of a point.

A point is filled by one or more runs (a sweep resumed after a stop, a point completed to more
examples later). Each run that generates records begins a *segment*: one line of
``segments.jsonl`` in the point folder with the provenance of that run (``mtad.run.provenance``:
commit and dirty flag, package versions, CPU / GPU model, torch threads, time), and every record
it writes carries the segment's id in its ``segment`` field. ``summary.json`` keeps only the last
run's provenance; the segments keep every run's.

Records committed before segments were kept carry a *derived* segment
(``mtad.run.results.derive_segments``): the commit that added the record and the provenance the
summary committed beside it recorded, ``"unknown"`` for what nothing recorded; its line holds
``derived`` (how, from where). A record without a ``segment`` field (an uncommitted record of an
old run) reads ``unknown (before segment provenance)`` here.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from mtad.core.io import append_jsonl, read_jsonl

SEGMENTS_FILE = "segments.jsonl"
SEGMENT_FIELD = "segment"
UNKNOWN_SEGMENT = "unknown (before segment provenance)"


def begin_segment(folder, prov: Mapping[str, Any]) -> str:
    """Append a segment with provenance ``prov`` to ``folder`` (a ``PointFolder``, under its
    lock) and return its id (a short hash of the line: unique per run, as the line holds the time)."""
    body = json.dumps(dict(prov), sort_keys=True, default=str)
    seg = hashlib.sha256(body.encode()).hexdigest()[:10]
    append_jsonl(folder.file(SEGMENTS_FILE), {SEGMENT_FIELD: seg, **dict(prov)})
    return seg


def segments(folder) -> dict[str, dict]:
    """The folder's segments by id ({} when it has none)."""
    path = folder.file(SEGMENTS_FILE)
    if not path.exists():
        return {}
    return {str(s[SEGMENT_FIELD]): s for s in read_jsonl(path) if SEGMENT_FIELD in s}


def segment_of(folder, record: Mapping[str, Any], known: Mapping[str, dict] | None = None) -> dict | None:
    """The provenance of the segment that made ``record``; None when the record predates
    segments (or names a segment the folder does not hold)."""
    seg = record.get(SEGMENT_FIELD)
    if seg is None:
        return None
    return (known if known is not None else segments(folder)).get(str(seg))


def _part(prov: Mapping[str, Any] | None, key: str) -> Mapping[str, Any]:
    """A provenance's ``key`` mapping; {} when absent or ``"unknown"`` (a derived segment)."""
    value = (prov or {}).get(key)
    return value if isinstance(value, Mapping) else {}


def is_derived(prov: Mapping[str, Any] | None) -> bool:
    """Whether a segment was derived from the repository's history (not recorded by its run)."""
    return isinstance((prov or {}).get("derived"), Mapping)


def machine(prov: Mapping[str, Any] | None) -> str:
    """The machine of a provenance: CPU model with its bfloat16 kind, or the GPU names."""
    device = _part(prov, "device")
    gpus = device.get("cuda_devices")
    if gpus:
        return ", ".join(sorted(set(gpus)))
    info = device.get("cpu_info")
    if not isinstance(info, Mapping):
        return "machine not recorded"
    bf16 = "native bf16" if info.get("native_bf16") else "no native bf16"
    note = f"; {device['kernel_note']}" if device.get("kernel_note") else ""  # e.g. mtad-audit --bf16-linears
    return f"{info.get('model') or 'CPU'} ({bf16}, {info.get('torch_capability') or '?'}{note})"


def commit(prov: Mapping[str, Any] | None) -> str:
    git = _part(prov, "git")
    if not git.get("commit"):
        return "commit unknown"
    return git["commit"][:8] + (" (dirty)" if git.get("dirty") else "")


def describe_provenance(prov: Mapping[str, Any] | None) -> str:
    """One line: ``1234abcd (dirty) on AMD EPYC (native bf16, AVX512), torch 2.13.0``; a derived
    segment's begins ``derived:``."""
    if prov is None:
        return UNKNOWN_SEGMENT
    torch = _part(prov, "packages").get("torch")
    line = f"{commit(prov)} on {machine(prov)}" + (f", torch {torch}" if torch else "")
    return f"derived: {line}" if is_derived(prov) else line


def segments_summary(folder, records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """For ``summary.json``: how many segments made ``records``, each with its record count,
    commit and machine, and how many records predate segments."""
    known = segments(folder)
    counts = Counter(str(r[SEGMENT_FIELD]) if r.get(SEGMENT_FIELD) is not None else None for r in records)
    parts = [{"segment": s, "records": c, "made_by": describe_provenance(known.get(s))}
             for s, c in sorted(counts.items(), key=lambda kv: (kv[0] is None, kv[0] or "")) if s is not None]
    return {"count": len(parts) + (1 if counts.get(None) else 0), "segments": parts,
            "records_before_segments": counts.get(None, 0)}


def describe_segments(info: Mapping[str, Any] | None) -> str | None:
    """A sentence for notes when a point was made by more than one segment (or partly before
    segments were kept); None for a point of one known segment."""
    if not info:
        return None
    parts = [f"{p['records']} by {p['made_by']}" for p in info.get("segments", [])]
    before = info.get("records_before_segments", 0)
    if before:
        parts.append(f"{before} {UNKNOWN_SEGMENT}")
    if info.get("count", 0) <= 1:
        return None
    return f"made in {info['count']} segments: " + "; ".join(parts)

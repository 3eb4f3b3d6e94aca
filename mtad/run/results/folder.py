"""One point's results folder: its lock, its identity, its status, its self-check.

Files (see docs/results.md): ``point.json`` (format, identity and its hash, how it was
asked for), ``config.json`` (the resolved config of the last run), ``samples.jsonl`` (one
record per (example, turn)), ``summary.json`` (aggregates over the requested examples),
``skipped.json`` / ``error.json`` (why a point has no results), ``.lock``; a run also keeps
``segments.jsonl``, ``run.log`` and ``.hydra/``. Each of these is a regular file (``.hydra`` a
real folder) or absent: a folder holding a link, FIFO, device or socket under one of these
names is refused in one line before anything is read or written there (``check_entries``, run
by ``lock`` and ``refuse_another``), and every file is read and written through
``mtad.core.io``, which never follows a link.

Folders written before the format had a version (``point.json`` without ``format``: the old
sweep layout) are read too: their identity is computed from the stored resolved config with
decoder version ``LEGACY_DECODER_VERSION``; ``claim`` adopts them (writes a new
``point.json``, keeps every record).

A record's fields and their check are the record schema's (``mtad.core.records``, beside the
engine that makes them); this module applies it to ``samples.jsonl``. It knows nothing about
decoders, tasks or metrics; ``mtad.run.evaluate`` fills it.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mtad.core.io import (
    BadResultsFile,
    append_jsonl,
    check_entry,
    portable_text,
    read_json,
    rewrite_jsonl,
    scan_jsonl,
    write_json_atomic,
)
from mtad.core.records import (  # noqa: F401  (the record schema, importable here as before)
    INT_RANGE,
    OPTIONAL_FIELDS,
    RECORD_FIELDS,
    ListOf,
    record_key,
    record_problem,
    value_ok,
)
from mtad.run.results.identity import (
    LEGACY_DECODER_VERSION,
    differences,
    identity,
    identity_hash,
    requested_limit,
)
from mtad.run.results.segments import SEGMENTS_FILE
from mtad.run.results.targets import data_only, trusted_config

log = logging.getLogger(__name__)

FORMAT = 2
POINT_FILE, CONFIG_FILE, SAMPLES_FILE, SUMMARY_FILE = (
    "point.json",
    "config.json",
    "samples.jsonl",
    "summary.json",
)
SKIPPED_FILE, ERROR_FILE, LOCK_FILE, INDEX_FILE = "skipped.json", "error.json", ".lock", "sweep.json"
RUN_LOG, HYDRA_DIR = "run.log", ".hydra"
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
#: Every name the project reads or writes in a point folder (``HYDRA_DIR``: a folder).
FOLDER_FILES = (POINT_FILE, CONFIG_FILE, SAMPLES_FILE, SUMMARY_FILE, SKIPPED_FILE, ERROR_FILE,
                LOCK_FILE, SEGMENTS_FILE, RUN_LOG)

# Point statuses.
DONE, CACHED, PARTIAL, PENDING = "done", "cached", "partial", "pending"
SKIPPED, FAILED, UNKNOWN, BUSY = "skipped", "failed", "unknown", "busy"


class IdentityMismatch(ValueError):
    """A folder holds results of another point; the message names the differing keys."""


class NotAPointFile(IdentityMismatch):
    """``point.json`` is neither a point file of this format nor one of the old sweep layout."""


class FolderBusy(RuntimeError):
    """Another live process holds the folder's lock."""


class FolderNotWritable(RuntimeError):
    """The folder cannot be created or written (read-only folder or file system)."""


_STR, _OPT_STR, _DICT, _OPT_DICT = (str,), (str, type(None)), (dict,), (dict, type(None))
_OPT_INT, _OPT_BOOL = (int, type(None)), (bool, type(None))
#: The fields of ``summary.json`` (``write_summary`` and ``mtad.run.evaluate``) that readers use,
#: with their types, checked when present (``read_summary``); dotted names are inside a block.
SUMMARY_FIELDS: dict[str, tuple[type, ...]] = {
    "format": (int,), "identity_hash": _STR, "limit": _OPT_INT, "records": (int,),
    "decoder": _OPT_STR, "decoder_version": _OPT_STR, "decoder_config": _OPT_DICT,
    "lossless": _OPT_BOOL, "task": _OPT_STR, "data_source": _OPT_STR, "data_substitute": _OPT_BOOL,
    "data_skipped": _OPT_DICT, "model": _OPT_DICT, "sampling": _OPT_DICT, "energy_source": _OPT_STR,
    "energy_unavailable_reason": _OPT_STR, "energy_devices": (list, type(None)), "metrics": _DICT,
    "metrics.examples": _OPT_INT, "config": _DICT, "provenance": _OPT_DICT, "score": _OPT_DICT,
    "score.metric": _STR, "score.version": _STR, "score.value": (int, float, type(None)),
    "score.n": _OPT_INT,
}
#: The fields of ``point.json`` (``claim``), checked when present (``PointFolder.point``).
POINT_FIELDS: dict[str, tuple[type, ...]] = {
    "format": (int,), "identity_hash": _STR, "identity": _DICT, "overrides": ListOf((str,)),
    "choices": _DICT, "created_utc": _STR, "adopted": _OPT_DICT, "hash": _STR,
}


def field_problems(data: Mapping[str, Any], fields: Mapping[str, tuple[type, ...]]) -> list[str]:
    """``name = value`` of each field of ``data`` (dotted: inside a block) that is present and
    not of its type in ``fields`` (a float may be NaN: an undefined statistic)."""
    out = []
    for name, types in fields.items():
        block, _, key = name.rpartition(".")
        holder = data.get(block) if block else data
        if isinstance(holder, Mapping) and key in holder and not value_ok(holder[key], types, finite=False):
            out.append(f"{name} = {json.dumps(holder[key], default=str)[:60]}")
    return out


def read_summary(path: str | Path) -> dict | None:
    """``summary.json`` at ``path``: None when missing or unreadable (the point is then
    re-summarised), BadResultsFile (one line naming the file and fields) when its fields have
    the wrong types (``SUMMARY_FIELDS``)."""
    summary = read_json(path)
    if summary is not None:
        bad = field_problems(summary, SUMMARY_FIELDS)
        if bad:
            raise BadResultsFile(
                f"{path} holds fields of the wrong type ({'; '.join(bad[:3])}); move the file away "
                "(its point is then summarised again from its records)")
    return summary


def _hash_of(ident: Any) -> str | None:
    try:
        return identity_hash(ident)
    except (TypeError, ValueError):
        return None


def covers(have: int | None, want: int | None) -> bool:
    """Whether a summary of ``have`` examples (None: all) covers a request for ``want``."""
    return have is None or (want is not None and have >= want)


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat()


@dataclass
class Check:
    """The self-check of ``samples.jsonl``: usable records (first of duplicates) and problems."""

    records: list[dict] = field(default_factory=list)
    bad_lines: list[int] = field(default_factory=list)
    incomplete: dict[int, str] = field(default_factory=dict)  # line -> what the record lacks
    duplicates: int = 0
    torn_tail: bool = False

    @property
    def clean(self) -> bool:
        return not self.bad_lines and not self.incomplete and not self.duplicates and not self.torn_tail

    def describe(self) -> str:
        parts = []
        if self.torn_tail:
            parts.append("a torn last line")
        other = [n for n in self.bad_lines if not (self.torn_tail and n == self.bad_lines[-1])]
        if other:
            parts.append(f"unreadable lines {other}")
        if self.incomplete:
            parts.append("incomplete records (" + "; ".join(
                f"line {n}: {why}" for n, why in self.incomplete.items()) + ")")
        if self.duplicates:
            parts.append(f"{self.duplicates} duplicate records")
        return ", ".join(parts)


class PointFolder:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def file(self, name: str) -> Path:
        return self.path / name

    def check_entries(self) -> None:
        """UnsafeResultsFile (one line naming it) when the folder itself is a link or anything but
        a real folder (a run resumed into it would write through the link), or when one of the
        names this project reads or writes here (``FOLDER_FILES``, ``.hydra/`` and its files) is a
        link, FIFO, device, socket or folder where a regular file belongs (``.hydra``: anything
        but a real folder)."""
        check_entry(self.path, folder=True)
        for name in FOLDER_FILES:
            check_entry(self.file(name))
        check_entry(self.file(HYDRA_DIR), folder=True)
        for name in HYDRA_FILES:
            check_entry(self.file(HYDRA_DIR) / name)

    # ------------------------------------------------------------------ lock

    @contextmanager
    def lock(self, wait: bool = False) -> Iterator[None]:
        """Hold the folder's lock: one writer per folder.

        A kernel lock (``fcntl.flock`` through ``filelock.FileLock``): the kernel releases it
        when the holder dies, however it dies, so a dead process never leaves a stale lock. The
        lock is re-entrant within a process (a sweep point's lock covers its evaluate run).
        A folder that cannot be written (read-only folder or file system) is refused with
        FolderNotWritable before anything is written.
        """
        from filelock import FileLock, Timeout

        try:
            self.path.mkdir(parents=True, exist_ok=True)
            lock = FileLock(
                self.file(LOCK_FILE),
                is_singleton=True,  # one instance per path and process (arguments must not differ)
                fallback_to_soft=False,  # a soft lock would outlive a killed process
                preserve_lock_file=True,  # unlinking a flock file races with a waiting process
            )
            self.check_entries()  # before the lock file is opened: no link is written through
            lock.acquire(timeout=-1 if wait else 0)
        except Timeout:
            raise FolderBusy(
                f"{self.path} is being written by another process (lock {self.file(LOCK_FILE)}); "
                "wait for it (sweeps: --wait, run.py: wait_lock=true) or choose another folder"
            ) from None
        except OSError as e:
            raise self._not_writable(e) from None
        try:
            try:  # the lock file may be writable in a folder that is not
                tempfile.TemporaryFile(dir=self.path).close()
            except OSError as e:
                raise self._not_writable(e) from None
            yield
        finally:
            lock.release()

    def _not_writable(self, e: OSError) -> FolderNotWritable:
        return FolderNotWritable(
            f"{self.path} is not writable ({e.strerror or e}); make it writable or choose another "
            "folder (run.py: hydra.run.dir=<new folder>)"
        )

    # ------------------------------------------------------------------ identity

    def point(self) -> dict:
        """``point.json``: {} when there is none; NotAPointFile when it is neither a point file
        of this format (``format``, ``identity``, ``identity_hash``) nor one of the old sweep
        layout (no ``format``; ``hash`` and the whole config as ``identity``)."""
        path = self.file(POINT_FILE)
        if not path.exists():
            return {}
        point = read_json(path)
        if point is not None and isinstance(point.get("identity"), dict) \
                and not field_problems(point, POINT_FIELDS):
            if point.get("format") == FORMAT and isinstance(point.get("identity_hash"), str):
                if _hash_of(point["identity"]) == point["identity_hash"]:  # a folder cannot claim
                    return point  # a point its identity does not describe
                raise NotAPointFile(
                    f"{path} names identity_hash {point['identity_hash'][:20]!r}, which is not the hash of "
                    "the identity it stores; move the folder away or choose another folder "
                    "(run.py: hydra.run.dir=<new folder>)")
            if "format" not in point and isinstance(point.get("hash"), str):
                return point
        raise NotAPointFile(
            f"{path} is not a point file (neither results format {FORMAT} nor the old sweep "
            "layout, docs/results.md); move the folder away or choose another folder "
            "(run.py: hydra.run.dir=<new folder>)"
        )

    def stored(self) -> tuple[dict | None, str | None]:
        """(identity, "current" | "legacy") of what this folder holds; (None, None) if nothing.

        NotAPointFile when ``point.json`` is not a point file."""
        point = self.point()
        if point.get("format"):
            return point["identity"], "current"
        summary = read_summary(self.file(SUMMARY_FILE)) or {}
        for cfg in (read_json(self.file(CONFIG_FILE)), summary.get("config")):
            if isinstance(cfg, dict):
                try:
                    trusted_config(cfg, self.path)  # data only: code and interpolations refused
                    data_only(cfg, self.path)
                    return identity(cfg, LEGACY_DECODER_VERSION), "legacy"
                except (KeyError, TypeError, ValueError):  # UntrustedConfig: a ValueError
                    continue
        return None, None

    def identity_hash(self) -> str | None:
        """The hash of the point this folder holds; None when it holds none or its
        ``point.json`` is not a point file (``claim`` refuses such a folder)."""
        try:
            point = self.point()
            if point.get("format"):
                return str(point["identity_hash"])
            ident, _ = self.stored()
        except NotAPointFile:
            return None
        return identity_hash(ident) if ident is not None else None

    def claim(
        self,
        ident: Mapping[str, Any],
        overrides: Sequence[str] = (),
        choices: Mapping[str, str] | None = None,
    ) -> None:
        """Make this folder hold ``ident``'s results; refuse a folder that holds another point's.

        An empty folder gets a ``point.json``; a legacy folder of the same point is adopted
        (new ``point.json``, records kept). Call under ``lock``.
        """
        stored, kind = self.refuse_another(ident)
        h = identity_hash(ident)
        old = self.point()
        if kind == "current" and old.get("identity_hash") == h:
            return
        point: dict[str, Any] = {
            "format": FORMAT,
            "identity_hash": h,
            "identity": dict(ident),
            "overrides": list(overrides),
            "choices": dict(choices or {}),
            "created_utc": now_utc(),
        }
        if kind == "legacy":
            point["adopted"] = {"from_format": 1, "hash": old.get("hash"), "time_utc": now_utc()}
            log.info("adopted %s (written before the results format had a version)", self.path)
        write_json_atomic(self.file(POINT_FILE), point)

    def refuse_another(self, ident: Mapping[str, Any]) -> tuple[dict | None, str | None]:
        """Raise IdentityMismatch when this folder holds another point than ``ident`` (or
        records of an unknown one, or a ``point.json`` that is not a point file); reads only.
        Returns ``stored()``. UnsafeResultsFile when the folder holds a link or special file
        (``check_entries``)."""
        self.check_entries()
        stored, kind = self.stored()
        h = identity_hash(ident)
        if stored is None and self.file(SAMPLES_FILE).exists():
            raise IdentityMismatch(
                f"{self.path} holds {SAMPLES_FILE} but no {POINT_FILE} or {CONFIG_FILE}: what "
                "produced them is unknown; move it away or choose another folder"
            )
        if stored is not None and identity_hash(stored) != h:
            diff = differences(stored, ident)
            raise IdentityMismatch(
                f"{self.path} holds the results of another point (stored -> requested: "
                f"{'; '.join(diff)}); choose another folder (run.py: hydra.run.dir=<new folder>) "
                "or move this one away"
            )
        return stored, kind

    # ------------------------------------------------------------------ records

    def check(self, repair: bool = False) -> Check:
        """Self-check ``samples.jsonl``: every line parses and holds a record (``RECORD_FIELDS``),
        (example, turn) keys are unique.

        With ``repair`` a damaged file is rewritten without the torn, unreadable and incomplete
        lines and the later duplicates (their examples are then recomputed), with a one-line
        notice.
        """
        scan = scan_jsonl(self.file(SAMPLES_FILE))
        check = Check(bad_lines=list(scan.bad_lines), torn_tail=scan.torn_tail)
        seen: set[tuple[str, int]] = set()
        for number, r in zip(scan.lines, scan.records):
            problem = record_problem(r)
            if problem is not None:
                check.incomplete[number] = problem
                continue
            key = record_key(r)
            if key in seen:
                check.duplicates += 1
                continue
            seen.add(key)
            check.records.append(r)
        if repair and not check.clean:
            log.warning(
                "repaired %s: dropped %s; %d records kept, the rest is recomputed",
                self.file(SAMPLES_FILE),
                check.describe(),
                len(check.records),
            )
            rewrite_jsonl(self.file(SAMPLES_FILE), check.records)
        return check

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one record to ``samples.jsonl``; a record without ``RECORD_FIELDS`` is refused
        (a resume would drop it)."""
        problem = record_problem(record)
        if problem is not None:
            raise ValueError(f"not a {SAMPLES_FILE} record ({problem}); see RECORD_FIELDS")
        append_jsonl(self.file(SAMPLES_FILE), dict(record))

    def write_summary(self, summary: Mapping[str, Any], ident_hash: str, limit: int | None,
                      records: int) -> None:
        write_json_atomic(
            self.file(SUMMARY_FILE),
            {"format": FORMAT, "identity_hash": ident_hash, "limit": limit, "records": records,
             **summary},
        )

    def write_reason(self, name: str, ident_hash: str | None, reason: str, **extra: Any) -> None:
        """``skipped.json`` / ``error.json``: why this point has no results (machine paths in
        the reason written relative to the checkout, or to ``~``: these files are committed)."""
        write_json_atomic(
            self.file(name),
            {"identity_hash": ident_hash, "reason": portable_text(reason), "time_utc": now_utc(), **extra},
        )

    # ------------------------------------------------------------------ status

    def finished(self, ident_hash: str, limit: int | None) -> bool:
        """True when ``summary.json`` covers the requested examples of this point and
        ``samples.jsonl`` passes the self-check with as many records as the summary counts.

        A summary of more examples covers fewer (``covers``): examples are a prefix of a fixed
        list, each with its own seed, so the first 30 of a 100-example point are the 30-example
        point; such a folder is read as it is, never re-summarised at the smaller limit.
        """
        summary = read_summary(self.file(SUMMARY_FILE))
        if summary is None:
            return False
        if summary.get("format"):
            same = summary.get("identity_hash") == ident_hash
            have, count = summary.get("limit"), summary.get("records")
        else:  # legacy summary: identity, limit and count from its stored config and metrics
            cfg = summary.get("config")
            try:
                same = identity_hash(identity(cfg, LEGACY_DECODER_VERSION)) == ident_hash
                have = requested_limit(cfg)
            except (KeyError, TypeError, ValueError):
                return False
            count = (summary.get("metrics") or {}).get("examples")
        if not same or not covers(have, limit):
            return False
        check = self.check()
        if not check.clean:
            return False
        covered = [r for r in check.records if have is None or int(r.get("index", 0)) < have]
        return len(covered) == count

    def summary_limit(self) -> int | None:
        """The number of examples ``summary.json`` was written for (None: all, or no summary)."""
        summary = read_summary(self.file(SUMMARY_FILE)) or {}
        if summary.get("format"):
            return summary.get("limit")
        try:
            return requested_limit(summary["config"])
        except (KeyError, TypeError, ValueError):
            return None

    def status(self, ident_hash: str, limit: int | None) -> tuple[str, str | None]:
        """(status, detail) from the files only (no lock taken)."""
        if self.finished(ident_hash, limit):
            return DONE, None
        for name, status in ((SKIPPED_FILE, SKIPPED), (ERROR_FILE, FAILED)):
            if self.file(name).exists():
                return status, (read_json(self.file(name)) or {}).get("reason")
        check = self.check()
        if check.records or not check.clean:
            detail = f"{len(check.records)} records"
            return PARTIAL, detail + (f"; {check.describe()}" if not check.clean else "")
        return PENDING, None

"""A folder of points (a sweep, a multirun, or one run): find a point's folder, list points.

Points live in ``<store>/<identity hash>/``. A legacy folder (old sweep layout, named by the
old whole-config hash) holding the same identity is found by scanning and used in place, so
finished legacy points count as cached and partial ones resume where they stopped.

Identity is global: a ``Catalog`` knows every point folder under the results tree (another
sweep's, a study's), so a store asked for a point that another folder already holds returns
that folder, read in place when it covers the requested examples and resumed in place (under
its own lock) when it does not. Records are never copied or merged across folders.
``sweep.json`` lists the points of the current sweep definition, with their folders.

No link is followed below a folder the user names (``mtad.core.io``): a point folder found by
walking a store, a catalog root or a sweep's index that is a link is refused in one line
(``UnsafeResultsFile``), so neither a reader nor a writer is led out of the results tree.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mtad.core.io import UnsafeResultsFile, read_json, refuse_link, scan_jsonl
from mtad.run.results.described import describe
from mtad.run.results.folder import (
    CONFIG_FILE,
    INDEX_FILE,
    POINT_FILE,
    SAMPLES_FILE,
    SUMMARY_FILE,
    IdentityMismatch,
    PointFolder,
    read_summary,
)

log = logging.getLogger(__name__)


def is_point_folder(path: Path) -> bool:
    return any((path / name).exists() for name in (POINT_FILE, SUMMARY_FILE, CONFIG_FILE))


class Store:
    """The points under ``root`` (one level of folders), found by identity hash."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._by_hash: dict[str, list[Path]] | None = None

    def _scan(self) -> dict[str, list[Path]]:
        if self._by_hash is None:
            self._by_hash = {}
            if self.root.is_dir():
                for d in sorted(self.root.iterdir()):
                    if d.name.startswith("."):
                        continue
                    if d.is_dir():
                        refuse_link(d)
                    if d.is_dir() and is_point_folder(d):
                        h = PointFolder(d).identity_hash()
                        if h is not None:
                            self._by_hash.setdefault(h, []).append(d)
        return self._by_hash

    def own(self, ident_hash: str) -> PointFolder | None:
        """The folder under ``root`` holding the point: ``<root>/<hash>``, else a legacy folder
        with that identity (the one with most records); None when there is none."""
        own = self.root / ident_hash
        refuse_link(own)
        if own.is_dir() and is_point_folder(own):
            return PointFolder(own)
        found = self._scan().get(ident_hash, [])
        if not found:
            return None
        return PointFolder(max(found, key=lambda d: (d.joinpath(SUMMARY_FILE).exists(),
                                                     len(scan_jsonl(d / SAMPLES_FILE).records))))

    def folder(self, ident_hash: str, limit: int | None = None,
               catalog: Catalog | None = None) -> PointFolder:
        """The folder of a point: ``<root>/<hash>`` unless an existing folder holds it.

        Candidates: this store's own folder (``own``) and, with ``catalog``, every folder
        elsewhere holding the same identity hash. The one that covers ``limit`` examples wins
        (``PointFolder.finished``), then the one with most clean records, then this store's
        own; a new ``<root>/<hash>`` when none holds the point. Records are never merged.
        """
        own = self.own(ident_hash)
        candidates = [own] if own is not None else []
        if catalog is not None:
            mine = own.path.resolve() if own is not None else None
            candidates += [f for f in catalog.folders(ident_hash) if f.path.resolve() != mine]
        if not candidates:
            return PointFolder(self.root / ident_hash)

        def rank(f: PointFolder) -> tuple[bool, int, bool]:
            return f.finished(ident_hash, limit), len(f.check().records), f is own

        return max(candidates, key=rank)


class Catalog:
    """Every point folder under ``roots`` (up to ``depth`` levels down), by identity hash.

    Folders are read through ``mtad.run.results.described``: one whose stored config is not
    data (code, interpolations) is left out with a warning. The results tree's one index of points: ``results/claims/<sweep>/<hash>/``,
    ``results/sweeps/<sweep>/<hash>/``, a run folder. Dot folders are skipped; a folder whose
    ``point.json`` is not a point file is left out (``claim`` would refuse it). Read once.
    """

    def __init__(self, roots, depth: int = 4):
        self.roots = [Path(r) for r in roots]
        self.depth = depth
        self._by_hash: dict[str, list[Path]] | None = None

    def _scan(self) -> dict[str, list[Path]]:
        if self._by_hash is None:
            self._by_hash = {}
            seen: set[Path] = set()
            for root in self.roots:
                for d in _walk(root, self.depth):
                    if d.resolve() in seen:
                        continue
                    seen.add(d.resolve())
                    h = None
                    try:
                        h = PointFolder(d).identity_hash()
                        if h is not None:
                            describe(d)  # a folder whose stored config is not data is no one's point
                    except UnsafeResultsFile:
                        raise
                    except (IdentityMismatch, OSError, ValueError) as e:  # UntrustedConfig, BadResultsFile
                        if h is not None:
                            log.warning("left out of the search for points: %s", e)
                        h = None
                    if h is not None:
                        self._by_hash.setdefault(h, []).append(d)
        return self._by_hash

    def folders(self, ident_hash: str) -> list[PointFolder]:
        return [PointFolder(d) for d in self._scan().get(ident_hash, [])]


def point_dirs(root: str | Path, only_current: bool = True) -> list[Path]:
    """Point folders under ``root``: the folder itself when it is one (a single run), the
    points listed in ``sweep.json`` (with ``only_current``), else every point folder up to two
    levels down (sweep points, Hydra multirun jobs ``<dir>/<n>/``)."""
    root = Path(root)
    if is_point_folder(root):
        return [root]
    index = read_json(root / INDEX_FILE)
    if only_current and index is not None:
        listed = [root / str(p.get("dir") or p["hash"]) for p in index.get("points", [])
                  if p.get("dir") or p.get("hash")]
        for d in listed:
            refuse_link(d)
        return listed
    return sorted(_walk(root, depth=2))


def _walk(root: Path, depth: int) -> Iterator[Path]:
    """Point folders under ``root`` up to ``depth`` levels down; UnsafeResultsFile at a linked
    folder (never followed)."""
    for d in root.iterdir() if root.is_dir() else ():
        if d.name.startswith(".") or not d.is_dir():
            continue
        refuse_link(d)
        if is_point_folder(d):
            yield d
        elif depth > 1:
            yield from _walk(d, depth - 1)


def load_point(path: str | Path) -> dict[str, Any]:
    """What a reader needs of one point folder: its files' contents and its status.

    Read through ``mtad.run.results.described`` (the one loader of stored configs: nothing in
    them is imported or resolved). ``config`` is the stored resolved config without the top-level knobs that are not fields of
    its decoder (a multinomial run shows no gamma), so labels and baselines see only what
    changed the tokens.
    """
    from mtad.run.results.described import describe
    from mtad.run.results.folder import ERROR_FILE, SKIPPED_FILE

    path = Path(path)
    folder = PointFolder(path)
    summary = read_summary(path / SUMMARY_FILE)
    described = describe(path)  # data only: code, interpolations refused in one line
    config = described.config
    status, reason = "pending", None
    if summary is not None:
        status = "done"
    else:
        for name, s in ((SKIPPED_FILE, "skipped"), (ERROR_FILE, "failed")):
            info = read_json(path / name)
            if info is not None:
                status, reason = s, info.get("reason")
                break
    return {
        "dir": path,
        "identity_hash": folder.identity_hash(),
        "choices": described.choices,
        "config": used_config(config),
        "summary": summary,
        "status": status,
        "reason": reason,
    }


def used_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without the run-only keys and without the knobs that are not decoder fields."""
    from mtad.run.config import KNOBS

    drop = {"output_dir", "logger", "resume", "sweep", "hydra", "warmup", "wait_lock"}
    decoder = config.get("decoder") or {}
    used = {k for k in KNOBS if k in decoder}
    return {k: v for k, v in config.items() if k not in drop and (k not in KNOBS or k in used)}

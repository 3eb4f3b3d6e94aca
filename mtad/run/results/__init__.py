"""The results store: the one owner of the results folder format (docs/results.md).

- ``mtad.core.io``: atomic JSON / JSON-lines files, torn-line detection;
- ``mtad.core.records``: what a ``samples.jsonl`` record holds (``RECORD_FIELDS``) and its check;
- ``mtad.run.results.identity``: a point's identity (what changes the generated tokens) and hash;
- ``mtad.run.results.folder``: one point's folder: lock, claim (refuse another point's folder,
  adopt a legacy one), self-check and repair of ``samples.jsonl``, status;
- ``mtad.run.results.described``: the one loader of stored configs: a folder as a description
  of what was run, rebuilt from ``conf/`` with the reader's own host settings (docs/trust.md);
  ``mtad.run.results.targets``: the checks that keep a stored config data;
- ``mtad.run.results.store``: a folder of points: find a point (legacy folders included, and
  with a ``Catalog`` any folder under the results tree holding it), list the points of a
  sweep, multirun or single run for readers.

``mtad.run.evaluate`` writes through it, ``mtad.run.sweep`` plans and resumes through it,
``mtad.analysis.render`` reads through it.
"""

from mtad.core.io import (
    BadResultsFile,
    append_jsonl,
    read_json,
    read_jsonl,
    rewrite_jsonl,
    scan_jsonl,
    shown_path,
    write_json_atomic,
)
from mtad.core.records import OPTIONAL_FIELDS, RECORD_FIELDS, record_key, record_problem
from mtad.run.results.folder import (
    BUSY,
    CACHED,
    CONFIG_FILE,
    DONE,
    ERROR_FILE,
    FAILED,
    FORMAT,
    INDEX_FILE,
    LOCK_FILE,
    PARTIAL,
    PENDING,
    POINT_FILE,
    SAMPLES_FILE,
    SKIPPED,
    SKIPPED_FILE,
    SUMMARY_FILE,
    UNKNOWN,
    Check,
    FolderBusy,
    FolderNotWritable,
    IdentityMismatch,
    NotAPointFile,
    PointFolder,
    now_utc,
    read_summary,
)
from mtad.run.results.identity import (
    HASH_LEN,
    LEGACY_DECODER_VERSION,
    decoder_version,
    differences,
    identity,
    identity_hash,
    requested_limit,
)
from mtad.run.results.store import (
    Catalog,
    Store,
    is_point_folder,
    load_point,
    point_dirs,
    used_config,
)

__all__ = [
    "exit_on_bad_results",
    "BUSY", "CACHED", "CONFIG_FILE", "DONE", "ERROR_FILE", "FAILED", "FORMAT", "INDEX_FILE",
    "LOCK_FILE", "PARTIAL", "PENDING", "POINT_FILE", "SAMPLES_FILE", "SKIPPED", "SKIPPED_FILE",
    "SUMMARY_FILE", "UNKNOWN", "RECORD_FIELDS", "OPTIONAL_FIELDS", "Check", "FolderBusy", "FolderNotWritable",
    "IdentityMismatch", "NotAPointFile", "PointFolder", "now_utc", "record_key", "record_problem", "read_summary", "BadResultsFile", "HASH_LEN", "LEGACY_DECODER_VERSION", "decoder_version",
    "differences", "identity", "identity_hash", "requested_limit", "append_jsonl", "read_json",
    "read_jsonl", "rewrite_jsonl", "scan_jsonl", "shown_path", "write_json_atomic", "Catalog", "Store", "is_point_folder",
    "load_point", "point_dirs", "used_config",
]


def exit_on_bad_results(main) -> None:
    """Run a console script's ``main`` (returns an exit code); a results file that cannot be
    used (``BadResultsFile``, a stored config naming code outside the allow-list, a ``point.json``
    that is not a point file or whose identity is not the one its hash names: ``IdentityMismatch``)
    ends it in one line with exit 2."""
    import sys

    from mtad.run.results.folder import IdentityMismatch
    from mtad.run.results.targets import UntrustedConfig

    try:
        code = main()
    except (BadResultsFile, UntrustedConfig, IdentityMismatch) as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    raise SystemExit(code)

"""Spider execution accuracy: run predicted and gold SQL on the example's SQLite database.

A prediction is correct when both queries run and return the same *set of rows*,
where each row is compared as the sorted list of its values turned into strings
(column order and row order and duplicate rows are ignored).

Predicted SQL is untrusted. It runs on a connection that

* opens the database read-only (``file:...?mode=ro`` URI);
* has an authorizer that allows only reading (SELECT, table reads, functions,
  recursive CTEs) and denies everything else (writes, DDL, ATTACH, PRAGMA,
  transactions, VACUUM, ...);
* allows no attached databases and limits string/blob length;
* is interrupted by a progress handler after ``timeout_s`` seconds;
* reads at most ``max_rows`` rows (more counts as a failure).

Any error, denial, timeout or overflow scores 0 and changes nothing on disk.
"""

from __future__ import annotations

import re
import sqlite3
import time
import urllib.parse
from pathlib import Path

from eval.base import Scorer

_FENCE = re.compile(r"```[ \t]*(?:sql|sqlite|SQL)?[ \t]*\n?(.*?)(?:```|\Z)", re.S)

_ALLOWED_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}


class SQLExecutionError(RuntimeError):
    pass


def extract_sql(completion: str) -> str:
    """The first SQL statement of a completion: code-fence content, cut at the first ``;``."""
    text = completion or ""
    if "```" in text:
        m = _FENCE.search(text)
        if m:
            text = m.group(1)
    text = text.strip()
    text = re.sub(r"^(?:SQL|SQLite|Answer)\s*:\s*", "", text, flags=re.I)
    return text.split(";", 1)[0].strip()


def _authorizer(action, arg1, arg2, dbname, source):
    if action not in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def connect_readonly(db_path: str | Path) -> sqlite3.Connection:
    path = Path(db_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no SQLite database at {path}")
    uri = "file:" + urllib.parse.quote(str(path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=1.0, check_same_thread=False)
    conn.text_factory = lambda b: b.decode("utf-8", errors="replace")
    if hasattr(conn, "setlimit"):  # Python >= 3.11
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 10_000_000)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 100_000)
    conn.set_authorizer(_authorizer)
    return conn


def execute_readonly(
    db_path: str | Path, sql: str, timeout_s: float = 5.0, max_rows: int = 10_000
) -> list[tuple]:
    """Rows of one read-only query; raises SQLExecutionError on any failure or limit."""
    if not sql or not sql.strip():
        raise SQLExecutionError("empty query")
    conn = connect_readonly(db_path)
    deadline = time.monotonic() + float(timeout_s)
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
    try:
        cur = conn.execute(sql)
        rows: list[tuple] = []
        while True:
            chunk = cur.fetchmany(500)
            if not chunk:
                break
            rows.extend(chunk)
            if len(rows) > max_rows:
                raise SQLExecutionError(f"more than {max_rows} rows")
        return rows
    except SQLExecutionError:
        raise
    except (sqlite3.Error, ValueError, OverflowError, MemoryError, UnicodeError) as e:
        if time.monotonic() > deadline:
            raise SQLExecutionError(f"timed out after {timeout_s}s") from e
        raise SQLExecutionError(f"{type(e).__name__}: {e}") from e
    finally:
        conn.close()


def normalize_rows(rows) -> frozenset:
    """Rows as a set, each row the sorted tuple of its values as strings."""
    return frozenset(tuple(sorted(str(v) for v in row)) for row in rows)


class SpiderExecutionScorer(Scorer):
    """``example.reference`` holds ``query`` (gold SQL) and ``db_path`` (the SQLite file)."""

    name = "spider_exec_acc"
    version = "1"
    higher_is_better = True
    aggregation = "mean"

    def __init__(self, timeout_s: float = 5.0, max_rows: int = 10_000):
        self.timeout_s = float(timeout_s)
        self.max_rows = int(max_rows)
        self._gold: dict[tuple[str, str], frozenset | None] = {}
        self.last_error: str | None = None

    def gold_rows(self, reference) -> frozenset | None:
        key = (str(reference["db_path"]), reference["query"])
        if key not in self._gold:
            try:
                rows = execute_readonly(key[0], key[1], self.timeout_s * 4, self.max_rows * 10)
                self._gold[key] = normalize_rows(rows)
            except (SQLExecutionError, FileNotFoundError):
                self._gold[key] = None
        return self._gold[key]

    def score(self, example, completion: str) -> float | None:
        ref = example.reference
        gold = self.gold_rows(ref)
        if gold is None:
            self.last_error = "gold query failed"
            return None  # not scoreable; left out of the aggregate
        sql = extract_sql(completion)
        try:
            pred = normalize_rows(execute_readonly(ref["db_path"], sql, self.timeout_s, self.max_rows))
        except (SQLExecutionError, FileNotFoundError) as e:
            self.last_error = str(e)
            return 0.0
        self.last_error = None
        return 1.0 if pred == gold else 0.0

"""Read-only SQL on a SQLite file, in a child process that is killed when a query outlives its time.

``execute_readonly(db_path, sql, timeout_s, max_rows, max_bytes)`` returns a query's rows or
raises :class:`SQLExecutionError`; it ends within ``timeout_s`` plus ``GRACE_S`` seconds
whatever the query calls. The query runs in a persistent child interpreter (this module run
``serve``), one query at a time, on a connection that

* opens the database read-only (``file:...?mode=ro`` URI);
* has an authorizer that allows only reading (SELECT, table reads, functions, recursive CTEs)
  and denies everything else (writes, DDL, ATTACH, PRAGMA, transactions, VACUUM, ...);
* allows no attached databases and limits string/blob length (``MAX_VALUE_BYTES``) and the
  number of columns (``MAX_COLUMNS``);
* is interrupted by a progress handler after ``timeout_s`` seconds;
* keeps its temporary tables and sorts in memory, under SQLite's heap limit
  (``SQLITE_HEAP_LIMIT``, for the whole child), so it writes no temporary files;
* reads at most ``max_rows`` rows and ``max_bytes`` bytes of values, counted row by row as
  they arrive (more counts as a failure).

Why a child. SQLite calls the progress handler between virtual-machine instructions, never
inside one, so a single function call runs to its end: ``printf('%.*c', 2147483647, 'x')``
loops over its two billion characters even though the length limit refuses the string it
builds (15 s a call with SQLite 3.40; a query may hold ``MAX_COLUMNS`` of them). The limits
keep such calls rare and most timeouts end in the handler, with the child kept; a query
whose reply has not come ``GRACE_S`` seconds after its deadline has its child killed
(SIGKILL) and replaced, the next one starting at once in the background. The child's replies
are plain JSON (bytes as hex, read back with ``json.loads``: nothing is unpickled), at most
``MAX_REPLY_BYTES`` long. The child's own memory is bounded by the heap limit and an
address-space limit (``CHILD_ADDRESS_SPACE``); it dies with the process that started it.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

# Bounds of a query.
#
# Time. The child is killed ``GRACE_S`` after the query's deadline. Inside it, the inputs of
# every instruction are kept small so that the progress handler ends most queries first:
# strings and blobs are at most ``MAX_VALUE_BYTES`` (``SQLITE_LIMIT_LENGTH``), where the worst
# known quadratic call, ``instr`` of 10,000 bytes by 5,000, takes about 1.4 ms; the handler runs
# every ``PROGRESS_INSTRUCTIONS`` instructions. The Spider databases' longest stored value has
# 60 bytes; the 972 dev gold queries' longest result value 50.
#
# Memory. SQLite's heap limit is one value for the whole child (``sqlite3_hard_heap_limit64``);
# temporary tables and sorts are kept in that heap instead of temporary files. The 972 dev gold
# queries whose database is shipped (wta_1's 62 are not) give the same results under an 8 MiB
# limit. A row holds at most ``MAX_COLUMNS`` values of at most ``MAX_VALUE_BYTES`` (the widest
# Spider table has 26 columns, the widest gold result 19), and result values are counted as rows
# arrive up to ``MAX_RESULT_BYTES`` (the largest gold result holds 15,676 bytes of values, 1,860
# rows of world_1).
SQLITE_HEAP_LIMIT = 32 * 1024 * 1024
MAX_VALUE_BYTES = 10_000
MAX_COLUMNS = 100
MAX_RESULT_BYTES = 1024 * 1024
PROGRESS_INSTRUCTIONS = 100
#: Seconds past a query's deadline before its child is killed (the handler's own timeout
#: normally answers first).
GRACE_S = 0.5
#: Seconds a new child may take to start (import and answer "ready").
BOOT_TIMEOUT_S = 30.0
#: Longest reply line read from the child (JSON of at most ``MAX_RESULT_BYTES`` of values).
MAX_REPLY_BYTES = 64 * 1024 * 1024
#: The child's address-space limit (RLIMIT_AS), a guard should a bound above fail.
CHILD_ADDRESS_SPACE = 1 << 30
NO_SETLIMIT = ("the Spider scorer bounds every query with SQLite's limits, which Python sets from 3.11 "
               "(sqlite3.Connection.setlimit); run it with Python >= 3.11")

_ALLOWED_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}


class SQLExecutionError(RuntimeError):
    pass


# ------------------------------------------------------------------ one query, in this process
def _authorizer(action, arg1, arg2, dbname, source):
    if action not in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def connect_readonly(db_path: str | Path) -> sqlite3.Connection:
    """A read-only, authorized, limited connection (sets the process's SQLite heap limit)."""
    path = Path(db_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no SQLite database at {path}")
    uri = "file:" + urllib.parse.quote(str(path)) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=1.0, check_same_thread=False)
    conn.text_factory = lambda b: b.decode("utf-8", errors="replace")
    conn.execute(f"PRAGMA hard_heap_limit = {SQLITE_HEAP_LIMIT}")
    conn.execute("PRAGMA temp_store = MEMORY")
    if not hasattr(conn, "setlimit"):
        conn.close()
        raise RuntimeError(NO_SETLIMIT)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 100_000)
    conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, MAX_COLUMNS)
    conn.set_authorizer(_authorizer)
    return conn


def _value_bytes(v) -> int:
    return len(v) if isinstance(v, (str, bytes)) else 8


def run_query(db_path: str | Path, sql: str, timeout_s: float, max_rows: int, max_bytes: int,
              conn: sqlite3.Connection | None = None) -> list[tuple]:
    """Rows of one read-only query in this process (the child's work; no kill here), on
    ``conn`` (a ``connect_readonly`` connection to ``db_path``, left open) or a new connection."""
    own = conn is None
    conn = connect_readonly(db_path) if own else conn
    deadline = time.monotonic() + float(timeout_s)
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, PROGRESS_INSTRUCTIONS)
    try:
        rows: list[tuple] = []
        size = 0
        for row in conn.execute(sql):  # one row at a time: a row can be large
            rows.append(row)
            size += sum(map(_value_bytes, row))
            if len(rows) > max_rows:
                raise SQLExecutionError(f"more than {max_rows} rows")
            if size > max_bytes:
                raise SQLExecutionError(f"result larger than {max_bytes} bytes")
        return rows
    except SQLExecutionError:
        raise
    except MemoryError as e:
        raise SQLExecutionError(f"out of memory: SQLite's heap limit is {SQLITE_HEAP_LIMIT} bytes") from e
    except (sqlite3.Error, ValueError, OverflowError, UnicodeError) as e:
        if time.monotonic() > deadline:
            raise SQLExecutionError(f"timed out after {timeout_s}s") from e
        raise SQLExecutionError(f"{type(e).__name__}: {e}") from e
    finally:
        if own:
            conn.close()


# ------------------------------------------------------------------ the wire: one JSON line each way
def _encode_value(v):
    return {"b": v.hex()} if isinstance(v, bytes) else v


def _decode_value(v):
    return bytes.fromhex(v["b"]) if isinstance(v, dict) else v


def _reply(rows: list[tuple] | None = None, error: str | None = None, missing: bool = False) -> bytes:
    body = {"error": error, "missing": missing} if error is not None else {
        "rows": [[_encode_value(v) for v in r] for r in rows or ()]}
    return json.dumps(body).encode() + b"\n"


# ------------------------------------------------------------------ the child
def _limit_child() -> None:
    """Die with the parent (Linux), and cap the address space."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = CHILD_ADDRESS_SPACE if hard == resource.RLIM_INFINITY else min(hard, CHILD_ADDRESS_SPACE)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, ValueError, OSError):
        pass


def serve(inp=None, out=None) -> None:
    """The child's loop: a request line in (JSON: db, sql, timeout, max_rows, max_bytes), a
    reply line out, until the input ends. The last database's connection stays open for the
    next query on it (opening one costs ten times a small query); any failure closes it."""
    inp = inp or sys.stdin.buffer
    out = out or sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the reply channel
    _limit_child()
    out.write(json.dumps({"ready": os.getpid()}).encode() + b"\n")
    out.flush()
    last: tuple[str, sqlite3.Connection] | None = None
    for line in inp:
        try:
            req = json.loads(line)
            if last is None or last[0] != req["db"]:
                if last is not None:
                    last, old = None, last[1]
                    old.close()
                last = (req["db"], connect_readonly(req["db"]))
            try:
                rows = run_query(req["db"], req["sql"], req["timeout"], req["max_rows"],
                                 req["max_bytes"], conn=last[1])
            except BaseException:
                last, old = None, last[1]
                old.close()
                raise
            reply = _reply(rows)
        except SQLExecutionError as e:
            reply = _reply(error=str(e))
        except FileNotFoundError as e:
            reply = _reply(error=str(e), missing=True)
        except MemoryError:
            reply = _reply(error=f"out of memory: the query process's limit is {CHILD_ADDRESS_SPACE} bytes")
        except Exception as e:  # any other failure is the query's, reported in one line
            reply = _reply(error=f"{type(e).__name__}: {e}")
        out.write(reply)
        out.flush()


# ------------------------------------------------------------------ the parent's handle
class _Gone(Exception):
    """The child ended or its reply was refused: it has been killed and replaced."""


class QueryProcess:
    """A child interpreter that runs queries one at a time (thread-safe); killed and replaced
    (the new one starting at once) when a query passes its deadline plus ``GRACE_S``."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner = os.getpid()
        self._ready = False
        self._buf = b""

    def _start(self) -> None:
        root = str(Path(__file__).resolve().parents[1])  # where this `eval` package lives
        code = f"import sys; sys.path.insert(0, {root!r}); from eval.sql_exec import serve; serve()"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, close_fds=True)
        self._owner, self._ready, self._buf = os.getpid(), False, b""

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.kill()
        except OSError:
            pass
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def _line(self, deadline: float) -> bytes | None:
        """The child's next reply line; None past ``deadline``; ``_Gone`` when it ended or
        wrote more than ``MAX_REPLY_BYTES``."""
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            if len(self._buf) > MAX_REPLY_BYTES:
                raise _Gone(f"result larger than {MAX_REPLY_BYTES} bytes as sent")
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise _Gone(f"the query process ended (exit {self._proc.wait()})")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def _ensure_ready(self) -> None:
        if self._proc is not None and self._owner != os.getpid():
            self._proc = None  # a forked copy of the parent: that child is the parent's
        if self._proc is not None and self._proc.poll() is not None:
            self._kill()  # ended between queries (killed from outside): a new one
        if self._proc is None:
            self._start()
        if not self._ready:
            try:
                line = self._line(time.monotonic() + BOOT_TIMEOUT_S)
            except _Gone as e:
                line, why = None, str(e)
            else:
                why = f"no answer in {BOOT_TIMEOUT_S:g} s"
            if line is None or "ready" not in json.loads(line):
                self._kill()
                raise SQLExecutionError(f"the query process did not start ({why})")
            self._ready = True

    def run(self, db_path: str, sql: str, timeout_s: float, max_rows: int, max_bytes: int) -> list[tuple]:
        with self._lock:
            self._ensure_ready()
            request = json.dumps({"db": db_path, "sql": sql, "timeout": float(timeout_s),
                                  "max_rows": int(max_rows), "max_bytes": int(max_bytes)})
            try:
                self._proc.stdin.write(request.encode() + b"\n")
                self._proc.stdin.flush()
                line = self._line(time.monotonic() + float(timeout_s) + GRACE_S)
            except (_Gone, OSError) as e:
                self._kill()
                raise SQLExecutionError(str(e)) from e
            if line is None:  # inside one long instruction: kill it, start the next child now
                self._kill()
                self._start()
                raise SQLExecutionError(f"timed out after {timeout_s}s")
        reply = json.loads(line)
        if "error" in reply:
            if reply.get("missing"):
                raise FileNotFoundError(reply["error"])
            raise SQLExecutionError(reply["error"])
        return [tuple(_decode_value(v) for v in row) for row in reply["rows"]]

    def close(self) -> None:
        with self._lock:
            if self._owner == os.getpid():
                self._kill()
            self._proc = None


_PROCESS = QueryProcess()
atexit.register(_PROCESS.close)


def execute_readonly(
    db_path: str | Path, sql: str, timeout_s: float = 5.0, max_rows: int = 10_000,
    max_bytes: int = MAX_RESULT_BYTES,
) -> list[tuple]:
    """Rows of one read-only query; raises SQLExecutionError on any failure or limit, and
    FileNotFoundError without a database at ``db_path``.

    Limits: ``timeout_s`` seconds (the query's child is killed ``GRACE_S`` after), ``max_rows``
    rows, ``max_bytes`` bytes of values (text and blobs by length, other values 8 each),
    ``SQLITE_HEAP_LIMIT`` bytes of SQLite memory.
    """
    if not sql or not sql.strip():
        raise SQLExecutionError("empty query")
    path = Path(db_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no SQLite database at {path}")
    return _PROCESS.run(str(path), sql, timeout_s, max_rows, max_bytes)

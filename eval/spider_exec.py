"""Spider execution accuracy: run predicted and gold SQL on the example's SQLite database.

Version 2 (the default) follows the official test-suite evaluation
(taoyds/test-suite-sql-eval, ``exec_eval.py``: ``eval_exec_match`` and ``result_eq``):

* both queries get the ``postprocess`` cleanup (``> =`` -> ``>=``, ``< =`` -> ``<=``,
  ``! =`` -> ``!=``) and ``YEAR(CURDATE())`` -> ``2020``;
* every ``DISTINCT`` keyword is removed from both queries (also inside
  ``count(DISTINCT x)``, as upstream does) unless ``keep_distinct=True``;
* results are compared as bags of rows (duplicates count); row order counts only
  when the gold query has ``ORDER BY`` (anywhere, subqueries included);
* columns match up to a permutation: the prediction is right when some reordering
  of its columns makes the two bags (or lists, under ``ORDER BY``) of rows equal;
* values compare as Python values: ``6 == 6.0``, ``None != 'None'``, ``6 != '6'``;
* two empty results are equal whatever their columns.

Where this module differs from upstream, and why:

* Upstream's ``quick_rej`` sorts the values of a row by ``str(x) + str(type(x))`` before
  comparing, so an int and an equal float can sort apart and reject a right answer
  (rows ``(6, 6.5)`` and ``(6.0, 6.5)``). Here integral floats are turned into ints
  first and rows are sorted by a key that agrees with Python's ``==``.
* Upstream prunes column permutations of wide results (more than 3 columns) with 20
  rows drawn at random; that pruning never removes a right permutation, so only the
  run time depends on chance. Here candidates are pruned deterministically: a
  prediction column may stand for a gold column only when their value multisets (value
  sequences under ``ORDER BY``) agree, identical prediction columns are tried once, and
  each partial assignment must already give equal bags on the columns assigned so far.
  The search stops after ``MAX_PERMUTATION_CHECKS`` partial checks and then counts the
  prediction as wrong (with ``last_error`` saying so); no Spider result comes near it.
* The text rewrites (``> =``, ``DISTINCT``, the ``ORDER BY`` test, ``YEAR(CURDATE())``)
  apply to SQL code only, never inside string literals, quoted identifiers or comments;
  upstream replaces substrings (and tests ``'order by' in sql.lower()``, which misses
  ``ORDER  BY`` with two spaces).
* Only the example's own database is used (the test suite's distilled extra databases
  are not shipped); upstream runs every ``*.sqlite`` of the database's folder, which in
  Spider's own layout is this one file.
* The prediction is the first complete SQL statement of the answer (the first Markdown
  code block when there is one): text up to the first ``;`` that is SQL code, not
  inside a literal, quoted identifier or comment. Nothing after it runs.
* A gold query that fails makes the example unscoreable (``None``, left out of the
  aggregate); upstream asserts. The time limit is ``timeout_s`` (upstream: 60 s).

Version 1 (``version="1"``, kept to compare old numbers) compares the *sets* of rows,
each row the sorted tuple of its values as strings, and cuts the answer at its first
``;`` wherever it is.

Predicted SQL is untrusted. It runs on a connection that

* opens the database read-only (``file:...?mode=ro`` URI);
* has an authorizer that allows only reading (SELECT, table reads, functions,
  recursive CTEs) and denies everything else (writes, DDL, ATTACH, PRAGMA,
  transactions, VACUUM, ...);
* allows no attached databases and limits string/blob length (``MAX_VALUE_BYTES``) and the
  number of columns (``MAX_COLUMNS``);
* is interrupted by a progress handler after ``timeout_s`` seconds;
* keeps its temporary tables and sorts in memory, under SQLite's heap limit
  (``SQLITE_HEAP_LIMIT``, for the whole process), so it writes no temporary files;
* reads at most ``max_rows`` rows and ``MAX_RESULT_BYTES`` bytes of values, counted
  row by row as they arrive (more counts as a failure).

Any error, denial, timeout or overflow scores 0 and changes nothing on disk.
"""

from __future__ import annotations

import re
import sqlite3
import time
import urllib.parse
from collections import Counter
from pathlib import Path

from eval.base import Scorer

_FENCE = re.compile(r"```[ \t]*(?:sql|sqlite|SQL)?[ \t]*\n?(.*?)(?:```|\Z)", re.S)

# SQLite's lexical classes that matter here; an unterminated literal or comment runs to the end.
_TOKEN = re.compile(
    r"""(?P<literal>'(?:[^']|'')*'?|"(?:[^"]|"")*"?|`(?:[^`]|``)*`?|\[[^\]]*\]?)
      |(?P<comment>--[^\n]*|/\*.*?(?:\*/|\Z))
      |(?P<word>[^\W\d]\w*)
      |(?P<space>\s+)
      |(?P<other>.)""",
    re.S | re.X,
)

MAX_PERMUTATION_CHECKS = 10_000
# Bounds of a query, which runs in the scorer's own process (next to the loaded models).
#
# Time. The progress handler stops a query at its deadline, but SQLite calls it only between
# virtual-machine instructions, never inside one: a single function call (``instr`` or
# ``replace`` of a long string by a long pattern is quadratic in the length) or a single sort
# runs to its end. So the inputs of every instruction are kept small: strings and blobs are at
# most ``MAX_VALUE_BYTES`` (``SQLITE_LIMIT_LENGTH``), where the worst known call, ``instr`` of
# 10,000 bytes by 5,000, takes about 1.4 ms; the handler runs every
# ``PROGRESS_INSTRUCTIONS`` instructions, so a deadline is missed by at most about a hundred
# such calls; a sort holds at most what fits in the heap (below). The Spider databases' longest
# stored value has 60 bytes; the 972 dev gold queries' longest result value 50.
#
# Memory. SQLite's heap limit is one value for the whole process (``sqlite3_hard_heap_limit64``;
# the pragma only ever lowers it); temporary tables and sorts are kept in that heap instead of
# temporary files. The 972 dev gold queries whose database is shipped (wta_1's 62 are not) give
# the same results under an 8 MiB limit. A row holds at most ``MAX_COLUMNS`` values of at most
# ``MAX_VALUE_BYTES`` (1 MB; the widest Spider table has 26 columns, the widest gold result
# 19), and result values are counted as rows arrive up to ``MAX_RESULT_BYTES`` (the largest gold
# result holds 15,676 bytes of values, 1,860 rows of world_1). So a query grows the process by
# at most the heap limit plus about two of those bounds.
SQLITE_HEAP_LIMIT = 32 * 1024 * 1024
MAX_VALUE_BYTES = 10_000
MAX_COLUMNS = 100
MAX_RESULT_BYTES = 1024 * 1024
PROGRESS_INSTRUCTIONS = 100
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


class ComparisonTooLarge(RuntimeError):
    """The column-permutation search passed ``MAX_PERMUTATION_CHECKS``."""


# ------------------------------------------------------------------ SQL text
def sql_tokens(sql: str) -> list[tuple[str, str]]:
    """``(kind, text)`` pieces of ``sql``; kinds: literal, comment, word, space, other."""
    return [(m.lastgroup, m.group()) for m in _TOKEN.finditer(sql)]


def _strip_answer(completion: str) -> str:
    text = completion or ""
    if "```" in text:
        m = _FENCE.search(text)
        if m:
            text = m.group(1)
    text = text.strip()
    return re.sub(r"^(?:SQL|SQLite|Answer)\s*:\s*", "", text, flags=re.I)


def first_statement(text: str) -> str:
    """``text`` up to its first ``;`` that is SQL code (not in a literal or comment)."""
    out = []
    for kind, piece in sql_tokens(text):
        if kind == "other" and piece == ";":
            break
        out.append(piece)
    return "".join(out).strip()


def extract_sql(completion: str) -> str:
    """The first complete SQL statement of an answer (code-fence content first)."""
    return first_statement(_strip_answer(completion))


def extract_sql_v1(completion: str) -> str:
    """Version 1: code-fence content cut at the first ``;`` character, wherever it is."""
    return _strip_answer(completion).split(";", 1)[0].strip()


def _rewrite_code(sql: str, rewrite) -> str:
    """Apply ``rewrite`` to the stretches of ``sql`` outside literals and comments."""
    out, code = [], []
    for kind, piece in sql_tokens(sql):
        if kind in ("literal", "comment"):
            out.append(rewrite("".join(code)))
            code = []
            out.append(piece)
        else:
            code.append(piece)
    out.append(rewrite("".join(code)))
    return "".join(out)


_CUR_YEAR = re.compile(r"YEAR\s*\(\s*CURDATE\s*\(\s*\)\s*\)\s*", re.I)


def postprocess(sql: str) -> str:
    """Upstream's cleanup: ``> =`` -> ``>=`` (and ``<``, ``!``), ``YEAR(CURDATE())`` -> 2020."""
    def fix(code: str) -> str:
        code = code.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")
        return _CUR_YEAR.sub("2020", code)

    return _rewrite_code(sql, fix)


def remove_distinct(sql: str) -> str:
    """``sql`` without its ``DISTINCT`` keywords (never touching literals or identifiers)."""
    return "".join(p for k, p in sql_tokens(sql) if not (k == "word" and p.lower() == "distinct"))


def has_order_by(sql: str) -> bool:
    """Whether ``sql`` has an ``ORDER BY`` clause anywhere (subqueries included)."""
    words = [p.lower() for k, p in sql_tokens(sql) if k not in ("space", "comment")]
    return any(a == "order" and b == "by" for a, b in zip(words, words[1:]))


# ------------------------------------------------------------------ execution
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


def execute_readonly(
    db_path: str | Path, sql: str, timeout_s: float = 5.0, max_rows: int = 10_000,
    max_bytes: int = MAX_RESULT_BYTES,
) -> list[tuple]:
    """Rows of one read-only query; raises SQLExecutionError on any failure or limit.

    Limits: ``timeout_s`` seconds, ``max_rows`` rows, ``max_bytes`` bytes of values (text
    and blobs by length, other values 8 each), ``SQLITE_HEAP_LIMIT`` bytes of SQLite memory.
    """
    if not sql or not sql.strip():
        raise SQLExecutionError("empty query")
    conn = connect_readonly(db_path)
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
        conn.close()


# ------------------------------------------------------------------ comparison
def _canon(v):
    """A value whose ``==`` and hash agree with Python's: integral floats become ints."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _sort_key(v):
    """A total order over SQLite values consistent with ``==`` (numbers by value)."""
    if v is None:
        return (0, 0)
    if isinstance(v, (int, float)):
        return (1, v)
    if isinstance(v, str):
        return (2, v)
    return (3, bytes(v))


def _row_bag(row: tuple) -> tuple:
    return tuple(sorted(row, key=_sort_key))


def _project(rows: list[tuple], cols: list[int], order_matters: bool):
    proj = [tuple(r[c] for c in cols) for r in rows]
    return proj if order_matters else Counter(proj)


def result_eq(gold: list[tuple], pred: list[tuple], order_matters: bool) -> bool:
    """Whether some column permutation of ``pred`` equals ``gold`` as bags of rows
    (as lists of rows when ``order_matters``); see the module docstring."""
    if not gold and not pred:
        return True
    if len(gold) != len(pred):
        return False
    n = len(gold[0])
    if len(pred[0]) != n:
        return False
    g = [tuple(_canon(v) for v in r) for r in gold]
    p = [tuple(_canon(v) for v in r) for r in pred]
    # quick reject: the rows' values, each row taken as a bag, must already agree
    gb, pb = [_row_bag(r) for r in g], [_row_bag(r) for r in p]
    if (gb != pb) if order_matters else (Counter(gb) != Counter(pb)):
        return False

    def signature(rows, c):
        col = [r[c] for r in rows]
        return col if order_matters else Counter(col)

    g_sig = [signature(g, c) for c in range(n)]
    p_sig = [signature(p, c) for c in range(n)]
    candidates = [[j for j in range(n) if p_sig[j] == g_sig[i]] for i in range(n)]
    p_cols = [tuple(r[c] for r in p) for c in range(n)]
    twin_of = [p_cols.index(p_cols[j]) for j in range(n)]  # first identical column
    checks = 0

    def extend(assigned: list[int]) -> bool:
        nonlocal checks
        i = len(assigned)
        if i == n:
            return True
        for j in candidates[i]:
            if j in assigned:
                continue
            # identical prediction columns are interchangeable: take the first unused one
            if any(twin_of[k] == twin_of[j] and k not in assigned for k in range(j)):
                continue
            checks += 1
            if checks > MAX_PERMUTATION_CHECKS:
                raise ComparisonTooLarge(f"more than {MAX_PERMUTATION_CHECKS} column assignments")
            cols = assigned + [j]
            if _project(p, cols, order_matters) == _project(g, list(range(i + 1)), order_matters):
                if extend(cols):
                    return True
        return False

    return extend([])


def normalize_rows(rows) -> frozenset:
    """Version 1: rows as a set, each row the sorted tuple of its values as strings."""
    return frozenset(tuple(sorted(str(v) for v in row)) for row in rows)


# ------------------------------------------------------------------ scorer
class SpiderExecutionScorer(Scorer):
    """``example.reference`` holds ``query`` (gold SQL) and ``db_path`` (the SQLite file).

    ``version``: "2" (default, the official test-suite semantics) or "1" (the
    earlier set-of-stringified-rows comparison, for comparing old numbers).
    """

    name = "spider_exec_acc"
    version = "2"
    versions = ("1", "2")
    higher_is_better = True
    aggregation = "mean"

    def __init__(self, timeout_s: float = 5.0, max_rows: int = 10_000, keep_distinct: bool = False,
                 version: str | None = None):
        version = str(version or type(self).version)
        if version not in self.versions:
            raise ValueError(f"SpiderExecutionScorer version must be one of {self.versions}, got {version!r}")
        self.preflight()
        self.version = version
        self.timeout_s = float(timeout_s)
        self.max_rows = int(max_rows)
        self.keep_distinct = bool(keep_distinct)
        self._gold: dict[tuple[str, str], list | frozenset | None] = {}
        self.last_error: str | None = None

    @classmethod
    def preflight(cls, **_) -> None:
        """RuntimeError where SQLite's limits cannot be set (Python < 3.11)."""
        if not hasattr(sqlite3.Connection, "setlimit"):
            raise RuntimeError(NO_SETLIMIT)

    def prepare(self, sql: str) -> str:
        """Version 2's rewrites of a query before it runs (both gold and prediction)."""
        sql = postprocess(sql)
        return sql if self.keep_distinct else remove_distinct(sql)

    def gold_rows(self, reference):
        sql = reference["query"] if self.version == "1" else self.prepare(reference["query"])
        key = (str(reference["db_path"]), sql)
        if key not in self._gold:
            try:
                rows = execute_readonly(key[0], key[1], self.timeout_s * 4, self.max_rows * 10)
                self._gold[key] = normalize_rows(rows) if self.version == "1" else rows
            except (SQLExecutionError, FileNotFoundError):
                self._gold[key] = None
        return self._gold[key]

    def score(self, example, completion: str) -> float | None:
        ref = example.reference
        gold = self.gold_rows(ref)
        if gold is None:
            self.last_error = "gold query failed"
            return None  # not scoreable; left out of the aggregate
        if self.version == "1":
            sql = extract_sql_v1(completion)
        else:
            sql = self.prepare(extract_sql(completion))
        try:
            pred = execute_readonly(ref["db_path"], sql, self.timeout_s, self.max_rows)
        except (SQLExecutionError, FileNotFoundError) as e:
            self.last_error = str(e)
            return 0.0
        self.last_error = None
        if self.version == "1":
            return 1.0 if normalize_rows(pred) == gold else 0.0
        order_matters = has_order_by(self.prepare(ref["query"]))
        try:
            return 1.0 if result_eq(gold, pred, order_matters) else 0.0
        except ComparisonTooLarge as e:
            self.last_error = str(e)
            return 0.0

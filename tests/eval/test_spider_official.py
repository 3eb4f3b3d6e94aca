"""Spider execution accuracy against the official test-suite semantics, on the real dev databases.

Each row of ``CASES`` is labelled with the rule it checks and gives the expected
score of version 2 (the official semantics) and of version 1 (the earlier
set-of-stringified-rows comparison, kept for comparison).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

import eval.spider_exec as spider_exec
from eval.spider_exec import (
    ComparisonTooLarge,
    SpiderExecutionScorer,
    first_statement,
    has_order_by,
    postprocess,
    remove_distinct,
    result_eq,
)
from mtad.tasks.base import Example
from mtad.tasks.common import data_root
from mtad.tasks.spider import SpiderTask

SPIDER = data_root() / "spider"


def _db(db_id: str) -> str:
    path = SPIDER / "database" / db_id / f"{db_id}.sqlite"
    if not path.is_file():
        pytest.fail(f"Spider database {db_id} not in {SPIDER}: the repository ships it under data/spider")
    return str(path)


CS = "concert_singer"
# fmt: off
# (label, db, gold, prediction, scorer kwargs, expected v2, expected v1)
CASES = [
    ("identical", CS, "SELECT name FROM singer", "SELECT name FROM singer", {}, 1, 1),
    ("order_by_reversed_rows_fail", CS, "SELECT name FROM singer ORDER BY age DESC",
     "SELECT name FROM singer ORDER BY age ASC", {}, 0, 1),
    ("order_by_same_order_other_expression", CS, "SELECT name FROM singer ORDER BY age DESC",
     "SELECT name FROM singer ORDER BY -age", {}, 1, 1),
    ("no_order_by_any_row_order", CS, "SELECT name FROM singer",
     "SELECT name FROM singer ORDER BY name DESC", {}, 1, 1),
    ("bag_extra_duplicate_fails", CS, "SELECT name FROM singer",
     "SELECT name FROM singer UNION ALL SELECT name FROM singer WHERE singer_id = 1", {}, 0, 1),
    ("bag_duplicates_collapsed_fail", CS, "SELECT country FROM singer",
     "SELECT country FROM singer GROUP BY country", {}, 0, 1),
    ("distinct_removed_from_both", CS, "SELECT DISTINCT country FROM singer WHERE age > 20",
     "SELECT country FROM singer WHERE age > 20", {}, 1, 1),
    ("keep_distinct_counts_duplicates", CS, "SELECT DISTINCT country FROM singer WHERE age > 20",
     "SELECT country FROM singer WHERE age > 20", {"keep_distinct": True}, 0, 1),
    ("distinct_removed_inside_count", CS, "SELECT count(DISTINCT country) FROM singer",
     "SELECT count(*) FROM singer", {}, 1, 0),
    ("keep_distinct_inside_count", CS, "SELECT count(DISTINCT country) FROM singer",
     "SELECT count(*) FROM singer", {"keep_distinct": True}, 0, 0),
    ("columns_permuted", CS, "SELECT name, age FROM singer", "SELECT age, name FROM singer", {}, 1, 1),
    ("value_swapped_between_columns_fails", CS, "SELECT name, country FROM singer",
     "SELECT CASE WHEN singer_id = 1 THEN country ELSE name END, "
     "CASE WHEN singer_id = 1 THEN name ELSE country END FROM singer", {}, 0, 1),
    ("null_is_not_string_None", CS, "SELECT max(age) FROM singer WHERE age > 100", "SELECT 'None'",
     {}, 0, 1),
    ("null_equals_null", CS, "SELECT max(age) FROM singer WHERE age > 100",
     "SELECT min(age) FROM singer WHERE age > 100", {}, 1, 1),
    ("int_is_not_text", CS, "SELECT count(*) FROM singer", "SELECT '6'", {}, 0, 1),
    ("int_equals_float", CS, "SELECT count(*) FROM singer", "SELECT count(*) * 1.0 FROM singer",
     {}, 1, 0),
    ("float_differs", CS, "SELECT avg(age) FROM singer", "SELECT avg(age) + 0.5 FROM singer", {}, 0, 0),
    ("semicolon_in_literal_does_not_split", CS, "SELECT name FROM singer WHERE song_name = 'You'",
     "SELECT name FROM singer WHERE song_name = 'You' OR song_name = 'a;b'", {}, 1, 0),
    ("semicolon_in_comment_does_not_split", CS, "SELECT name FROM singer WHERE age > 40",
     "SELECT name FROM singer -- the older; ones\nWHERE age > 40", {}, 1, 0),
    ("only_first_statement_runs", CS, "SELECT count(*) FROM singer",
     "SELECT count(*) FROM singer; SELECT 1", {}, 1, 1),
    ("spaced_operator_cleanup", CS, "SELECT name FROM singer WHERE age >= 41",
     "SELECT name FROM singer WHERE age > = 41", {}, 1, 0),
    ("order_by_in_gold_subquery_makes_order_count", CS,
     "SELECT name FROM singer WHERE singer_id IN (SELECT singer_id FROM singer ORDER BY age LIMIT 3)",
     "SELECT name FROM singer WHERE singer_id IN (SELECT singer_id FROM singer ORDER BY age LIMIT 3) "
     "ORDER BY name DESC", {}, 0, 1),
    ("order_by_with_two_spaces_still_orders", CS, "SELECT name FROM singer ORDER  BY age",
     "SELECT name FROM singer ORDER BY age DESC", {}, 0, 1),
    ("column_count_differs", CS, "SELECT name FROM singer", "SELECT name, age FROM singer", {}, 0, 0),
    ("both_empty_whatever_columns", CS, "SELECT name FROM singer WHERE age > 100",
     "SELECT name, age FROM singer WHERE age > 200", {}, 1, 1),
    ("row_count_differs", CS, "SELECT name FROM singer WHERE age > 40",
     "SELECT name FROM singer WHERE age > 30", {}, 0, 0),
    ("order_by_with_permuted_columns", CS, "SELECT name, age FROM singer ORDER BY age",
     "SELECT age, name FROM singer ORDER BY age", {}, 1, 1),
    ("prediction_error", CS, "SELECT name FROM singer", "SELECT nam FROM singer", {}, 0, 0),
    ("code_fence_and_prose", CS, "SELECT count(*) FROM singer",
     "Here:\n```sql\nSELECT count(*) FROM singer;\n```\nThis counts them; done.", {}, 1, 1),
    ("current_year_rewrite", CS, "SELECT count(*) FROM concert WHERE year < 2020",
     "SELECT count(*) FROM concert WHERE year < YEAR(CURDATE())", {}, 1, 0),
    ("wide_result_columns_permuted", CS, "SELECT * FROM stadium",
     "SELECT average, lowest, highest, capacity, name, location, stadium_id FROM stadium", {}, 1, 1),
    ("wide_result_value_swapped_fails", CS, "SELECT * FROM stadium",
     "SELECT stadium_id, location, name, capacity, "
     "CASE WHEN stadium_id = 1 THEN lowest ELSE highest END, "
     "CASE WHEN stadium_id = 1 THEN highest ELSE lowest END, average FROM stadium", {}, 0, 1),
    ("other_database", "pets_1", "SELECT count(DISTINCT pettype) FROM pets",
     "SELECT count(*) FROM (SELECT pettype FROM pets GROUP BY pettype)", {"keep_distinct": True}, 1, 1),
]
# fmt: on


def _example(db_id: str, gold: str) -> Example:
    return Example("case", ["q"], reference={"query": gold, "db_path": _db(db_id), "db_id": db_id})


@pytest.mark.parametrize("label,db,gold,pred,kwargs,v2,v1", CASES, ids=[c[0] for c in CASES])
def test_official_semantics_table(label, db, gold, pred, kwargs, v2, v1):
    ex = _example(db, gold)
    scorer = SpiderExecutionScorer(**kwargs)
    assert scorer.version == "2"
    assert scorer.score(ex, pred) == v2, scorer.last_error
    legacy = SpiderExecutionScorer(version="1", **kwargs)
    assert legacy.score(ex, pred) == v1, legacy.last_error


def test_table_covers_both_outcomes_and_disagreements():
    assert len(CASES) >= 25 and len({c[0] for c in CASES}) == len(CASES)
    assert {c[5] for c in CASES} == {0, 1}
    assert sum(c[5] != c[6] for c in CASES) >= 10  # the rules where version 1 was wrong


def test_only_the_first_statement_runs_and_the_database_is_unchanged(tmp_path):
    src = _db(CS)
    db = tmp_path / "concert_singer.sqlite"
    db.write_bytes(open(src, "rb").read())
    db.chmod(0o666)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    ex = Example("x", ["q"], reference={"query": "SELECT count(*) FROM singer", "db_path": str(db)})
    scorer = SpiderExecutionScorer()
    assert scorer.score(ex, "SELECT count(*) FROM singer; DELETE FROM singer;") == 1.0
    assert scorer.score(ex, "SELECT count(*) FROM singer WHERE name = ';'; DROP TABLE singer") == 0.0
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["concert_singer.sqlite"]


SPLIT_TEXTS = [
    "SELECT 1; SELECT 2",
    "SELECT 'a;b' FROM t; x",
    "SELECT \"col;x\" FROM t WHERE a = 'it''s; fine'; DROP TABLE t",
    "SELECT [we;ird] FROM t; more",
    "SELECT `x;y` FROM t;",
    "SELECT 1 -- a; comment\n, 2; tail",
    "SELECT 1 /* a; block */ + 2; tail",
    "SELECT 1",
    "SELECT 'unterminated; literal",
]


@pytest.mark.parametrize("text", SPLIT_TEXTS)
def test_statement_split_agrees_with_sqlite_tokenizer(text):
    """The cut is where SQLite's own tokenizer first sees a complete statement."""
    head = first_statement(text)
    assert text.startswith(head)
    complete = [i for i in range(1, len(text) + 1) if sqlite3.complete_statement(text[:i])]
    if complete:
        assert text[: complete[0]].rstrip().rstrip(";").strip() == head
    else:
        assert head == text.strip()


def test_text_rewrites_leave_literals_and_identifiers_alone():
    assert remove_distinct("SELECT DISTINCT a, count(distinct b) FROM t") == "SELECT  a, count( b) FROM t"
    sql = "SELECT \"distinct\", 'distinct' FROM t WHERE x = 'order by' AND y > = '> ='"
    assert remove_distinct(sql) == sql
    assert postprocess(sql) == sql.replace("y > = ", "y >= ")
    assert not has_order_by("SELECT a FROM t WHERE b = 'order by'")
    assert not has_order_by("SELECT a FROM t -- order by b")
    assert has_order_by("SELECT a FROM t ORDER\n  BY a") and has_order_by("select a from t order by a")
    assert not has_order_by("SELECT a FROM t GROUP BY a")


def test_result_eq_values_compare_as_python_values():
    # upstream's string-keyed row sort puts 6 and 6.0 in different places and rejects this
    assert result_eq([(6, 6.5)], [(6.0, 6.5)], order_matters=False)
    assert result_eq([(6, 6.5)], [(6.5, 6.0)], order_matters=True)
    assert not result_eq([(None,)], [("None",)], order_matters=False)
    assert not result_eq([(6,)], [("6",)], order_matters=False)
    assert not result_eq([(1,), (1,), (2,)], [(1,), (2,), (2,)], order_matters=False)
    assert result_eq([(1, "a"), (2, "b")], [("b", 2), ("a", 1)], order_matters=False)
    assert not result_eq([(1, "a"), (2, "b")], [("b", 2), ("a", 1)], order_matters=True)


def test_result_eq_wide_results_are_searched_deterministically(monkeypatch):
    # every column holds the same values, so only the rows tell the right mapping apart
    gold = [(1, 2, 3, 4, 5), (2, 3, 4, 5, 1), (3, 4, 5, 1, 2), (4, 5, 1, 2, 3), (5, 1, 2, 3, 4)]
    perm = (3, 0, 4, 1, 2)
    pred = [tuple(row[i] for i in perm) for row in gold]
    assert result_eq(gold, pred, order_matters=True)
    assert result_eq(gold, pred[::-1], order_matters=False)
    broken = [pred[0][:3] + pred[0][3:][::-1]] + pred[1:]
    assert not result_eq(gold, broken, order_matters=False)
    monkeypatch.setattr(spider_exec, "MAX_PERMUTATION_CHECKS", 2)
    with pytest.raises(ComparisonTooLarge):
        result_eq(gold, pred, order_matters=True)


def test_record_fields_name_the_scorer_and_version():
    assert SpiderExecutionScorer().record_fields(1.0) == {
        "score": 1.0, "scorer": "spider_exec_acc", "scorer_version": "2"}
    assert SpiderExecutionScorer(version="1").record_fields(0.0)["scorer_version"] == "1"
    assert SpiderExecutionScorer(version="1").aggregate([1.0, 0.0])["version"] == "1"
    with pytest.raises(ValueError, match="version"):
        SpiderExecutionScorer(version="3")


@pytest.mark.slow
def test_every_gold_query_matches_itself():
    """Each of the 972 gold queries scores 1 against itself, and the scorer's bounds (length,
    columns, heap, result size) leave its rows exactly those of an unbounded connection."""
    dev = json.loads((SPIDER / "dev.json").read_text())
    scorer = SpiderExecutionScorer()
    failed, changed, scored = [], [], 0
    for i, row in enumerate(dev):
        path = SPIDER / "database" / row["db_id"] / f"{row['db_id']}.sqlite"
        if not path.is_file():
            continue
        ex = Example(str(i), ["q"], reference={"query": row["query"], "db_path": str(path)})
        scored += 1
        if scorer.score(ex, row["query"]) != 1.0:
            failed.append((i, row["query"], scorer.last_error))
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        conn.text_factory = lambda b: b.decode("utf-8", errors="replace")
        try:
            unbounded = conn.execute(scorer.prepare(row["query"])).fetchall()
        finally:
            conn.close()
        if spider_exec.execute_readonly(path, scorer.prepare(row["query"]), 20.0, 100_000) != unbounded:
            changed.append((i, row["query"]))
    assert failed == [] and changed == []
    assert scored == len(SpiderTask(limit=None).load())  # every dev question with its database


def _committed_spider_records():
    root = Path(__file__).resolve().parents[2] / "results"
    for path in sorted(root.rglob("samples.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("scorer") == SpiderExecutionScorer.name:
                yield path, record


@pytest.mark.slow
def test_committed_spider_verdicts_hold():
    """Every committed Spider record, scored again from its text, gets the score it holds."""
    by_id = {ex.id: ex for ex in SpiderTask(limit=None).load()}
    scorers = {v: SpiderExecutionScorer(version=v) for v in SpiderExecutionScorer.versions}
    seen, changed = 0, []
    for path, record in _committed_spider_records():
        ex = by_id[record["example_id"]]
        score = scorers[record["scorer_version"]].score(ex, record["text"])
        seen += 1
        if score != record["score"]:
            changed.append((str(path), record["example_id"], record["score"], score))
    assert seen > 0 and changed == []

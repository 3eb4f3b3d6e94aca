"""MT-Bench: 80 two-turn questions through the tokenizer's chat template.

Turn 2 is rendered from both user turns and the model's own answer to turn 1
(``render(example, tokenizer, turn=1, previous=[answer_1])``). Offline, the quality
measure is the target model's perplexity of the answers (computed by the runner),
so there is no scorer by default. Setting ``judge.url`` and ``judge.model`` (an
OpenAI-compatible chat-completions endpoint) makes the task's scorer an
:class:`eval.mt_bench_judge.MTBenchJudgeScorer`; it is never contacted otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtad.tasks.base import Example, Task, TaskUnavailable
from mtad.tasks.common import data_root, source_label, take


@dataclass(kw_only=True, eq=False)
class MTBenchTask(Task):
    name: str = "mt_bench"
    max_prompt_tokens: int = 2048
    data_dir: str | None = None
    question_file: str = "mt_bench/question.jsonl"
    judge: dict | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.judge = dict(self.judge or {})
        if self.scorer is None and self.judge.get("url") and self.judge.get("model"):
            from eval.mt_bench_judge import MTBenchJudgeScorer

            self.scorer = MTBenchJudgeScorer(**self.judge)

    def load(self) -> list[Example]:
        from datasets import load_dataset

        path = data_root(self.data_dir) / self.question_file
        if not path.is_file():
            raise TaskUnavailable(
                f"MT-Bench questions not found at {path}; the repository ships "
                "data/mt_bench/question.jsonl (FastChat fastchat/llm_judge/data/mt_bench/"
                "question.jsonl), or set the task's data_dir"
            )
        ds = load_dataset("json", data_files=str(path), split="train")
        has_ref = "reference" in ds.column_names
        examples = []
        for row in ds:
            examples.append(
                Example(
                    id=f"mt_bench-{row['question_id']}",
                    turns=list(row["turns"]),
                    reference=(row["reference"] if has_ref else None),
                    meta={"question_id": row["question_id"], "category": row["category"]},
                )
            )
        self.source = source_label(path)
        self.substitute = False
        self.skipped = {}
        return take(examples, self.limit)

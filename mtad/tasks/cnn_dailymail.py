"""CNN/DailyMail summarisation, scored by Rouge-L against the highlights.

Hub ``abisee/cnn_dailymail`` 3.0.0 test split, first 100 articles, when the Hub is
reachable (``use_hub: auto``; never when ``HF_HUB_OFFLINE=1``), as the paper did.
Offline: the 80 CNN/DailyMail test articles shipped in ``data/cnn_dailymail/``
(the Spec-Bench summarisation subset), flagged ``substitute`` because they are not
the paper's first 100.

Prompt: ``"Summarize: " + article`` (through the chat template when the tokenizer
has one), with the *article* cut to ``article_tokens`` tokens so the instruction
is never truncated.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mtad.tasks.base import Example, Task, TaskUnavailable
from mtad.tasks.common import data_root, source_label, take, truncate_to_tokens, want_hub

log = logging.getLogger(__name__)

HUB_ID = "abisee/cnn_dailymail"
HUB_CONFIG = "3.0.0"
LOCAL_FILE = "cnn_dailymail/specbench_cnndm_test80.jsonl"


@dataclass(kw_only=True, eq=False)
class CNNDailyMailTask(Task):
    name: str = "cnn_dailymail"
    limit: int | None = 100
    max_prompt_tokens: int = 1024
    data_dir: str | None = None
    use_hub: bool | str = "auto"
    hub_timeout_s: float = 3.0
    local_file: str = LOCAL_FILE
    article_tokens: int | None = 512
    instruction: str = "Summarize: "

    def _examples(self, rows, prefix: str) -> list[Example]:
        return [
            Example(
                id=f"{prefix}-{row.get('id') or row.get('question_id') or i}",
                turns=[self.instruction + row["article"]],
                reference=row["highlights"],
                meta={"article": row["article"]},
            )
            for i, row in enumerate(rows)
        ]

    def _load_hub(self) -> list[Example]:
        from datasets import load_dataset

        ds = load_dataset(HUB_ID, HUB_CONFIG, split="test")
        if self.limit is not None:
            ds = ds.select(range(min(self.limit, len(ds))))
        self.source, self.substitute = f"hub:{HUB_ID}:{HUB_CONFIG}/test", False
        return self._examples(ds, "cnn_dailymail")

    def _load_local(self) -> list[Example]:
        from datasets import load_dataset

        path = data_root(self.data_dir) / self.local_file
        if not path.is_file():
            raise TaskUnavailable(
                f"CNN/DailyMail: the Hub ({HUB_ID}) is not used or not reachable and the "
                f"offline copy {path} is missing (see data/SOURCES.md)"
            )
        ds = load_dataset("json", data_files=str(path), split="train")
        self.source = (
            f"{source_label(path)} (80 CNN/DailyMail 3.0.0 test articles, Spec-Bench subset; "
            f"the paper used the first 100 of hub:{HUB_ID})"
        )
        self.substitute = True
        return take(self._examples(ds, "cnn_dailymail"), self.limit)

    def load(self) -> list[Example]:
        self.skipped = {}
        if want_hub(self.use_hub, self.hub_timeout_s):
            try:
                return self._load_hub()
            except Exception as e:
                if self.use_hub is True:
                    raise TaskUnavailable(f"cannot load {HUB_ID} from the Hub: {e}") from e
                log.warning("loading %s from the Hub failed (%s); using the offline copy", HUB_ID, e)
        return self._load_local()

    def message(self, example: Example, tokenizer) -> str:
        """The user message with the article cut to ``article_tokens`` tokens."""
        article = truncate_to_tokens(tokenizer, example.meta["article"], self.article_tokens)
        return self.instruction + article

    def render(self, example: Example, tokenizer, turn: int = 0, previous=None) -> list[int]:
        cut = Example(id=example.id, turns=[self.message(example, tokenizer)],
                      reference=example.reference, meta=example.meta)
        return super().render(cut, tokenizer, turn, previous)

"""ChatGPT-Prompts: open-ended user prompts (no reference; quality = perplexity).

The paper used the Hub data set ``MohamedRashad/ChatGPT-prompts`` (train split,
``human_prompt`` column, first 100). It is used when the Hub is reachable
(``use_hub: auto``; never when ``HF_HUB_OFFLINE=1``). Otherwise the task falls back
to a labelled stand-in shipped in ``data/``: the ``awesome-chatgpt-prompts`` CSV
(``prompt`` column); then ``task.substitute`` is True and ``task.source`` says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mtad.tasks.base import Example, Task, TaskUnavailable
from mtad.tasks.common import data_root, source_label, take, want_hub

log = logging.getLogger(__name__)

HUB_ID = "MohamedRashad/ChatGPT-prompts"
LOCAL_FILE = "chatgpt_prompts_substitute/awesome_chatgpt_prompts_dc1e2b48.csv"


@dataclass(kw_only=True, eq=False)
class ChatGPTPromptsTask(Task):
    name: str = "chatgpt_prompts"
    limit: int | None = 100
    data_dir: str | None = None
    use_hub: bool | str = "auto"
    hub_timeout_s: float = 3.0
    local_file: str = LOCAL_FILE

    def _load_hub(self) -> list[Example]:
        from datasets import load_dataset

        ds = load_dataset(HUB_ID, split="train")
        if self.limit is not None:
            ds = ds.select(range(min(self.limit, len(ds))))
        has_resp = "chatgpt_response" in ds.column_names
        examples = [
            Example(
                id=f"chatgpt_prompts-{i}",
                turns=[row["human_prompt"]],
                reference=row["chatgpt_response"] if has_resp else None,
            )
            for i, row in enumerate(ds)
        ]
        self.source, self.substitute = f"hub:{HUB_ID}", False
        return examples

    def _load_local(self) -> list[Example]:
        from datasets import load_dataset

        path = data_root(self.data_dir) / self.local_file
        if not path.is_file():
            raise TaskUnavailable(
                f"ChatGPT-Prompts: the Hub ({HUB_ID}) is not used or not reachable and the "
                f"offline stand-in {path} is missing (see data/SOURCES.md)"
            )
        ds = load_dataset("csv", data_files=str(path), split="train")
        examples = [
            Example(id=f"chatgpt_prompts-{i}", turns=[row["prompt"]], meta={"act": row["act"]})
            for i, row in enumerate(ds)
        ]
        self.source = f"{source_label(path)} (stand-in for hub:{HUB_ID})"
        self.substitute = True
        return take(examples, self.limit)

    def load(self) -> list[Example]:
        self.skipped = {}
        if want_hub(self.use_hub, self.hub_timeout_s):
            try:
                return self._load_hub()
            except Exception as e:
                if self.use_hub is True:
                    raise TaskUnavailable(f"cannot load {HUB_ID} from the Hub: {e}") from e
                log.warning("loading %s from the Hub failed (%s); using the offline stand-in",
                            HUB_ID, e)
        return self._load_local()

"""The task interface.

A task knows where its examples come from and how to turn one into prompt token
ids; it knows nothing about decoders. Multi-turn tasks (MT-Bench) render turn t
from the example and the model's earlier answers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


class TaskUnavailable(RuntimeError):
    """The task's data cannot be had here; the message says what is missing and how to get it."""


@dataclass
class Example:
    id: str
    turns: list[str]  # user messages (one for single-turn tasks)
    reference: Any = None  # whatever the scorer needs (gold SQL, test code, summary, ...)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True, eq=False)
class Task(ABC):
    """The settings every task takes, declared once; a task (a subclass, itself decorated
    ``@dataclass(kw_only=True, eq=False)``) declares only its own fields and the defaults it
    changes (at least ``name``), and implements ``load``; override ``render`` for custom prompts.
    Its config's keys (``conf/task/*.yaml``) are its fields: an unknown key is refused."""

    name: str = "task"  # a falsy value keeps the class's default
    limit: int | None = None
    max_prompt_tokens: int = 512
    chat: bool = True
    #: the task's scorer (an ``eval.base.Scorer``) or None (perplexity only).
    scorer: Any = None
    #: stop sequences: generation ends once the generated text holds one (mtad.core.stopping)
    stop: tuple[str, ...] = ()
    #: which data source was used by the last ``load`` (e.g. "local:data/spider", "hub:...").
    source: str = field(default="unknown", init=False)
    #: True when the data is a labelled stand-in for the paper's data.
    substitute: bool = field(default=False, init=False)
    #: examples left out by the last ``load`` and why, e.g. {"missing_db": {"wta_1": 62}}.
    skipped: dict[str, Any] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.stop = tuple(str(s) for s in self.stop or ())
        if not self.name:
            self.name = type(self).__dataclass_fields__["name"].default

    def info(self) -> dict[str, Any]:
        """Provenance of the last ``load``, for run records."""
        return {
            "name": self.name,
            "source": self.source,
            "substitute": self.substitute,
            "skipped": self.skipped,
            "limit": self.limit,
            "max_prompt_tokens": self.max_prompt_tokens,
            "chat": self.chat,
            "stop": list(self.stop),
            "scorer": getattr(self.scorer, "name", None),
        }

    @abstractmethod
    def load(self) -> list[Example]:
        """Examples, first ``self.limit`` of them; raise TaskUnavailable when data is missing."""

    def num_turns(self, example: Example) -> int:
        return len(example.turns)

    def user_message(self, example: Example, turn: int) -> str:
        return example.turns[turn]

    def render(self, example: Example, tokenizer, turn: int = 0, previous: list[str] | None = None) -> list[int]:
        """Prompt token ids for ``turn``, given the model's answers to earlier turns.

        With ``chat`` and a tokenizer that has a chat template, the template is used;
        otherwise turns are joined as plain text.
        """
        previous = previous or []
        if self.chat and getattr(tokenizer, "chat_template", None):
            messages = []
            for t in range(turn + 1):
                messages.append({"role": "user", "content": self.user_message(example, t)})
                if t < turn:
                    messages.append({"role": "assistant", "content": previous[t]})
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            ids = list(ids)
        else:
            text = ""
            for t in range(turn + 1):
                text += self.user_message(example, t)
                if t < turn:
                    text += previous[t]
            ids = tokenizer(text)["input_ids"]
        return ids[-self.max_prompt_tokens :] if self.max_prompt_tokens else ids

"""ChatAlpaca multi-turn conversations (``chatalpaca-10k.json``, GitHub cascip/ChatAlpaca).

Every assistant turn of a conversation is one example: its input is all earlier
turns (user and assistant, from the data set), its reference the data set's
assistant answer. With a chat template the earlier turns are chat messages;
without one they are joined by newlines, each followed by ``\\n`` (as the paper's
script did).

No copy ships with the repository. The file is looked for at the ``path`` config
field, then ``<data_dir>/chatalpaca/chatalpaca-10k.json``, then the download cache
(``chatalpaca/`` in the project's cache folder, ``mtad.core.io.cache_dir``); if absent and
``download`` is on and GitHub answers (never when offline, e.g. ``HF_HUB_OFFLINE=1``
or ``MTAD_OFFLINE=1``), it is downloaded into the cache. Otherwise ``load`` raises
``TaskUnavailable`` saying how to get it.

File format: JSON lines ``{"id": ..., "conversations": [{"from": "human"|"gpt",
"value": ...}, ...]}``; ``{"role", "content"}`` messages are accepted too.
"""

from __future__ import annotations

import os
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mtad.core.io import cache_dir
from mtad.tasks.base import Example, Task, TaskUnavailable
from mtad.tasks.common import data_root, source_label, url_reachable

FILE_NAME = "chatalpaca-10k.json"
URL = "https://raw.githubusercontent.com/cascip/ChatAlpaca/main/data/chatalpaca-10k.json"
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
          "system": "system"}


def _messages(row: dict) -> list[dict]:
    turns = row.get("conversations") or row.get("messages") or []
    out = []
    for t in turns:
        role = t.get("from") if t.get("from") is not None else t.get("role")
        content = t.get("value") if t.get("value") is not None else t.get("content")
        out.append({"role": _ROLES.get(str(role).lower(), str(role)), "content": content or ""})
    return out


@dataclass(kw_only=True, eq=False)
class ChatAlpacaTask(Task):
    name: str = "chatalpaca"
    limit: int | None = 100
    max_prompt_tokens: int = 1024
    data_dir: str | None = None
    path: str | None = None
    download: bool = True
    url: str = URL
    timeout_s: float = 30.0

    def candidates(self) -> list[Path]:
        out = []
        try:
            out.append(data_root(self.data_dir) / "chatalpaca" / FILE_NAME)
        except TaskUnavailable:
            pass
        out.append(cache_dir() / "chatalpaca" / FILE_NAME)
        return out

    def _download(self, dest: Path) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".download-")
        try:
            req = urllib.request.Request(self.url, headers={"User-Agent": "mtad"})
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp, os.fdopen(fd, "wb") as f:
                while chunk := resp.read(1 << 20):
                    f.write(chunk)
            os.replace(tmp, dest)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return dest

    def find_file(self) -> Path:
        if self.path:
            p = Path(os.path.expanduser(str(self.path)))
            if not p.is_file():
                raise TaskUnavailable(f"ChatAlpaca: no file at the configured path {p}")
            return p
        cands = self.candidates()
        for p in cands:
            if p.is_file():
                return p
        if self.download and url_reachable(self.url, timeout=min(self.timeout_s, 5.0)):
            try:
                return self._download(cands[-1])
            except OSError as e:
                raise TaskUnavailable(f"ChatAlpaca: downloading {self.url} failed: {e}") from e
        raise TaskUnavailable(
            f"ChatAlpaca data ({FILE_NAME}) is not available offline: no copy ships with the "
            f"repository, none was found at {', '.join(str(c) for c in cands)}, and "
            f"{'downloading is off' if not self.download else 'GitHub is not reachable (or the environment is offline)'}. "
            f"Get it from GitHub cascip/ChatAlpaca (data/{FILE_NAME}, {self.url}) and pass "
            f"task.path=/path/to/{FILE_NAME}, or put it at {cands[0]}."
        )

    def load(self) -> list[Example]:
        from datasets import load_dataset

        path = self.find_file()
        ds = load_dataset("json", data_files=str(path), split="train")
        examples: list[Example] = []
        for ci, row in enumerate(ds):
            msgs = _messages(row)
            conv_id = row.get("id", ci)
            for k, m in enumerate(msgs):
                if m["role"] != "assistant" or k == 0:
                    continue
                examples.append(
                    Example(
                        id=f"chatalpaca-{conv_id}-{k}",
                        turns=[msgs[k - 1]["content"]],
                        reference=m["content"],
                        meta={"history": msgs[: k - 1], "conversation": conv_id, "turn": k},
                    )
                )
                if self.limit is not None and len(examples) >= self.limit:
                    break
            if self.limit is not None and len(examples) >= self.limit:
                break
        self.source = source_label(path) if not self.path else f"local:{path}"
        self.substitute = False
        self.skipped = {}
        return examples

    def messages(self, example: Example) -> list[dict]:
        return list(example.meta.get("history", [])) + [{"role": "user", "content": example.turns[0]}]

    def render(self, example: Example, tokenizer, turn: int = 0, previous=None) -> list[int]:
        msgs = self.messages(example)
        if self.chat and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            ids = list(ids)
        else:
            ids = tokenizer("".join(m["content"] + "\n" for m in msgs))["input_ids"]
        return ids[-self.max_prompt_tokens :] if self.max_prompt_tokens else ids

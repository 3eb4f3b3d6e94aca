"""Optional MT-Bench judge: single-answer grading (1-10) by an OpenAI-compatible endpoint.

Off unless a URL and a model are configured (``task.judge.url``, ``task.judge.model``);
uses only ``urllib``. The API key, if any, is read from the environment variable
named by ``api_key_env``. Ratings follow the MT-Bench convention: the judge explains,
then writes ``[[n]]``.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request

from eval.base import Scorer

SYSTEM = "You are a helpful assistant."

_SINGLE = (
    "[Instruction]\nYou are an impartial judge. Evaluate the quality of the AI assistant's "
    "response to the user question below, considering helpfulness, relevance, accuracy, "
    "depth, creativity and level of detail. Start with a short explanation, as objective as "
    "possible. Then rate the response from 1 to 10 in exactly this format: \"[[rating]]\", "
    "for example \"Rating: [[5]]\".\n\n[Question]\n{question}\n\n"
    "[The Start of Assistant's Answer]\n{answer}\n[The End of Assistant's Answer]"
)

_MULTI = (
    "[Instruction]\nYou are an impartial judge. Evaluate the quality of the AI assistant's "
    "answer to the user's LAST question in the conversation below, considering helpfulness, "
    "relevance, accuracy, depth, creativity and level of detail. Start with a short "
    "explanation, as objective as possible. Then rate the answer from 1 to 10 in exactly this "
    "format: \"[[rating]]\", for example \"Rating: [[5]]\".\n\n"
    "<|The Start of Conversation|>\n{conversation}\n<|The End of Conversation|>"
)

_RATING = re.compile(r"\[\[(\d+(?:\.\d+)?)\]\]")


def parse_rating(text: str) -> float | None:
    m = _RATING.search(text or "")
    if not m:
        return None
    v = float(m.group(1))
    return v if 1.0 <= v <= 10.0 else None


class MTBenchJudgeScorer(Scorer):
    """Mean 1-10 judge rating over the turns answered.

    ``score(example, completion)`` takes the list of the model's answers, one per
    turn (a single string counts as the answer to turn 1). Returns None when the
    judge gives no usable rating.
    """

    name = "mt_bench_judge"
    version = "1"
    higher_is_better = True
    aggregation = "mean"

    def __init__(self, url: str, model: str, api_key_env: str | None = "OPENAI_API_KEY",
                 timeout_s: float = 120.0, max_tokens: int = 1024, temperature: float = 0.0):
        if not url or not model:
            raise ValueError("MTBenchJudgeScorer needs both url and model")
        url = url.rstrip("/")
        self.url = url if url.endswith("/chat/completions") else url + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = float(timeout_s)
        self.max_tokens = int(max_tokens)
        self.temperature = float(temperature)
        self.last_ratings: list[float | None] = []

    def judge_prompts(self, example, answers: list[str]) -> list[str]:
        prompts = []
        for t, answer in enumerate(answers):
            if t == 0:
                prompts.append(_SINGLE.format(question=example.turns[0], answer=answer))
            else:
                conv = []
                for k in range(t + 1):
                    conv.append(f"### User:\n{example.turns[k]}\n\n### Assistant:\n{answers[k]}")
                prompts.append(_MULTI.format(conversation="\n\n".join(conv)))
        return prompts

    def _post(self, payload: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.url, data=json.dumps(payload).encode(), headers=headers,
                                     method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            return json.loads(resp.read().decode("utf-8"))

    def rate(self, prompt: str) -> float | None:
        payload = {
            "model": self.model,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        out = self._post(payload)
        return parse_rating(out["choices"][0]["message"]["content"])

    def score(self, example, completion) -> float | None:
        answers = [completion] if isinstance(completion, str) else list(completion)
        answers = answers[: len(example.turns)]
        self.last_ratings = [self.rate(p) for p in self.judge_prompts(example, answers)]
        vals = [r for r in self.last_ratings if r is not None]
        return sum(vals) / len(vals) if vals else None

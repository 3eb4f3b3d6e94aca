"""The tables and the claims report name a point alike: its config-group names (tree_mtad,
bild_sampling, greedy), also when its folder stores no config-group choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtad.analysis import claims, render
from mtad.analysis.names import decoder_name, pair_name, task_name
from mtad.run.provenance import append_jsonl, write_json_atomic

ROOT = Path(__file__).resolve().parents[2]

# a stored decoder config -> the config-group name both readers must give it
DECODERS = [
    ({"_target_": "mtad.decoders.tree_mtad.TreeMTAD", "gamma": 4, "width": 4}, "tree_mtad"),
    ({"_target_": "mtad.decoders.bild.BiLD", "name": "bild_sampling", "mode": "sampling"}, "bild_sampling"),
    ({"_target_": "mtad.decoders.bild.BiLD", "mode": "greedy"}, "bild"),
    ({"_target_": "mtad.decoders.autoregressive.Greedy"}, "greedy"),
    ({"_target_": "mtad.decoders.mjgd.MTJD"}, "mtjd"),
    ({"_target_": "mtad.decoders.gone.Gone"}, "gone"),  # a class that no longer exists: its module
]


@pytest.mark.parametrize("decoder,name", DECODERS, ids=[n for _, n in DECODERS])
def test_a_folder_without_choices_is_named_by_its_config_group(decoder, name):
    config = {"decoder": decoder, "task": {"name": "humaneval"}, "model": {"name": "tiny_random"}}
    assert decoder_name({}, config) == name
    assert task_name({}, config) == "humaneval" and pair_name({}, config) == "tiny_random"
    choices = {"decoder": "other", "task": "spider", "model": "p"}
    assert (decoder_name(choices, config), task_name(choices, config), pair_name(choices, config)) == (
        "other", "spider", "p")  # the stored choices first


def test_every_decoder_config_group_names_itself():
    """For each conf/decoder/<name>.yaml, its config (or its class) gives back <name>."""
    from omegaconf import OmegaConf

    for path in sorted((ROOT / "conf" / "decoder").glob("*.yaml")):
        cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        assert decoder_name({}, {"decoder": cfg}) == path.stem, path.name


def _record(i: int) -> dict:
    return {"example_id": str(i), "turn": 0, "index": i, "text": "", "prompt_tokens": 1, "output_ids": [1],
            "new_tokens": 4, "steps": 2, "accepted_per_step": [1, 1], "drafted_per_step": [2, 2],
            "emitted_per_step": [2, 2], "tree_size_per_step": [2, 2], "target_passes": 2,
            "target_forward_time": 0.1, "draft_forward_time": 0.1, "wall_time": 0.5, "prefill_time": 0.0,
            "block_efficiency": 2.0, "stop_reason": "length", "energy_j": None, "tokens_per_s": 8.0,
            "nll_sum": 2.0, "perplexity": 1.6}


def test_render_and_claims_agree_on_a_folder_without_choices(tmp_path):
    sweep = tmp_path / "sweep"
    for h, (decoder, _) in zip(("aaa", "bbb"), DECODERS[:2]):
        folder = sweep / h
        config = {"decoder": decoder, "task": {"name": "humaneval"}, "model": {"name": "tiny_random"},
                  "seed": 42, "temperature": 1.0, "top_k": 10, "top_p": 0.9, "max_new_tokens": 4}
        write_json_atomic(folder / "point.json", {"format": 2, "identity_hash": h, "identity": {}, "choices": {}})
        write_json_atomic(folder / "config.json", config)
        write_json_atomic(folder / "summary.json", {
            "format": 2, "identity_hash": h, "limit": 2, "records": 2, "config": config,
            "metrics": {"examples": 2, "new_tokens": 8, "steps": 4}})
        for i in range(2):
            append_jsonl(folder / "samples.jsonl", _record(i))
    rendered = set(render.load_points(sweep, only_current=False)["decoder"])
    records, _ = claims.read_records(sweep)
    assert rendered == {d for d, _ in records} == {"tree_mtad", "bild_sampling"}

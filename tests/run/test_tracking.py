"""W&B tracking: run names, groups and tags; flat summary keys read back from offline runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtad.run.cli import compose_config
from mtad.run.tracking import WandbLogger, flat_summary, offline_runs, run_identity

LABELS = {"decoder": "tree_mtad", "task": "humaneval", "pair": "llama31_8b__llama32_1b"}
TREE_MTAD = {"_target_": "mtad.decoders.tree_mtad.TreeMTAD", "gamma": 6, "tau": 0.3, "width": 4}


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb_dir").mkdir()
    return tmp_path / "wandb_dir"


def test_single_run_named_by_the_decoders_own_knobs():
    cfg = {"decoder": TREE_MTAD, "gamma": 6, "tau": 0.3, "width": 4, "temperature": 1.0}
    ident = run_identity(cfg, LABELS)
    assert ident["name"] == "tree_mtad g6 t0.3 w4 humaneval"
    assert ident["tags"] == ["pair:llama31_8b__llama32_1b", "task:humaneval", "decoder:tree_mtad"]
    assert ident["group"] is None
    spd = {"decoder": {"_target_": "mtad.decoders.spd.SpD", "gamma": 5}, "gamma": 5, "tau": 0.3}
    assert run_identity(spd, {**LABELS, "decoder": "spd"})["name"] == "spd g5 humaneval"


def _sweep(tmp_path, grid, mine):
    sweep_dir = tmp_path / "table2"
    point = sweep_dir / "abc123"
    point.mkdir(parents=True)
    (sweep_dir / "sweep.json").write_text(json.dumps({"points": [{"overrides": o} for o in grid]}))
    (point / "point.json").write_text(json.dumps({"overrides": mine}))
    return point


def test_sweep_point_named_by_the_knobs_that_vary(tmp_path):
    grid = [
        ["model=a", "task=humaneval", f"decoder={d}", f"gamma={g}", "tau=0.3"]
        for d in ("spd", "tree_mtad")
        for g in (4, 6)
    ]
    point = _sweep(tmp_path, grid, grid[-1])
    cfg = {
        "decoder": TREE_MTAD,
        "gamma": 6,
        "tau": 0.3,
        "output_dir": str(point),
        "sweep": {"name": "table2"},
    }
    ident = run_identity(cfg, LABELS)
    # tau is fixed in this sweep, the model too: neither is in the name
    assert ident["name"] == "tree_mtad g6 humaneval" and ident["group"] == "table2"
    grid2 = [o[:1] + ["temperature=0", *o[1:]] for o in grid] + [["model=b", *grid[0][1:]]]
    point = _sweep(tmp_path / "two_pairs", grid2, grid2[3])
    cfg["output_dir"] = str(point)
    assert run_identity(cfg, LABELS)["name"] == "tree_mtad g6 humaneval llama31_8b__llama32_1b"


def test_flat_summary_keys_and_intervals():
    summary = {
        "decoder": "mtad",
        "lossless": False,
        "task": "spider",
        "model": {"pair": "p"},
        "energy_devices": ["cuda:0", "cuda:1"],
        "metrics": {
            "perplexity": 2.5,
            "perplexity_ci": [2.0, 3.0],
            "tokens_per_s": 40.0,
            "tokens_per_s_ci": [35.0, 45.0],
            "block_efficiency": 2.75,
            "per_depth_acceptance": [0.9, 0.6],
            "joules": None,
        },
        "score": {"value": 0.5, "ci": [0.25, 0.75], "n": 8, "metric": "exec_acc"},
    }
    flat = flat_summary(summary)
    assert flat["decoder"] == "mtad" and flat["pair"] == "p" and flat["lossless"] is False
    assert (flat["ppl"], flat["ppl_ci_low"], flat["ppl_ci_high"]) == (2.5, 2.0, 3.0)
    assert (flat["tokens_per_s_ci_low"], flat["tokens_per_s_ci_high"]) == (35.0, 45.0)
    assert (flat["score"], flat["score_ci_low"], flat["score_ci_high"], flat["score_n"]) == (
        0.5,
        0.25,
        0.75,
        8,
    )
    assert (flat["accept_depth_1"], flat["accept_depth_2"]) == (0.9, 0.6)
    assert (
        flat["energy_devices"] == "cuda:0,cuda:1"
        and "joules" not in flat
        and "perplexity" not in flat
    )


def test_run_summary_logged_offline_reads_back(tmp_path, offline_wandb):
    """A debug run's summary through the W&B logger: group, name, tags and flat keys in the offline file."""
    from mtad.run.evaluate import run

    cfg = compose_config(
        [
            "+experiment=debug",
            "decoder=mtad",
            "limit=2",
            "max_new_tokens=6",
            f"output_dir={tmp_path / 'run'}",
        ]
    )
    summary = run(cfg)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    logger = WandbLogger(mode="offline", group="checks", dir=str(offline_wandb))
    logger.start(config, labels={"decoder": "mtad", "task": "smoke", "pair": "tiny_random"})
    for record in _samples(tmp_path / "run"):
        logger.log_example(record)
    logger.log_summary(summary)
    logger.finish()

    (logged,) = offline_runs(offline_wandb)
    assert logged["complete"]
    assert logged["name"] == f"mtad g{cfg.gamma} t{cfg.tau:g} w{cfg.width} smoke"
    assert logged["group"] == "checks"
    assert logged["tags"] == ["pair:tiny_random", "task:smoke", "decoder:mtad"]
    got = logged["summary"]
    m = summary["metrics"]
    assert got["decoder"] == "mtad" and got["pair"] == "tiny_random" and got["lossless"] is False
    assert got["ppl"] == pytest.approx(m["perplexity"])
    assert [got["ppl_ci_low"], got["ppl_ci_high"]] == pytest.approx(m["perplexity_ci"])
    assert got["tokens_per_s"] == pytest.approx(m["tokens_per_s"])
    assert got["block_efficiency"] == pytest.approx(m["block_efficiency"])
    assert got["score"] == pytest.approx(summary["score"]["value"])
    depths = [got[f"accept_depth_{d}"] for d in range(1, len(m["per_depth_acceptance"]) + 1)]
    assert depths == pytest.approx(m["per_depth_acceptance"])
    new_tokens = [h["example/new_tokens"] for h in logged["history"]]
    assert new_tokens == [r["new_tokens"] for r in _samples(tmp_path / "run")]
    assert logged["config"]["decoder"]["_target_"].endswith("MTAD")


def test_records_spanning_log_blocks_read_back(offline_wandb):
    """A config larger than one 32 KiB block of the run file is split over records and rejoined."""
    big = {f"key_{i}": "x" * 100 for i in range(1000)}
    logger = WandbLogger(mode="offline", group="big", dir=str(offline_wandb))
    logger.start(big, name="big-config")
    logger.finish()
    (logged,) = offline_runs(offline_wandb)
    assert logged["complete"]
    assert logged["name"] == "big-config"
    assert {k: v for k, v in logged["config"].items() if k in big} == big


def test_run_file_cut_while_being_written_reads_as_incomplete(tmp_path, offline_wandb):
    """Any prefix of a finished run file (the writer mid-flush) reads without error, not complete."""
    from mtad.run.tracking import read_offline_run

    big = {f"key_{i}": "x" * 100 for i in range(400)}  # records over more than one block
    logger = WandbLogger(mode="offline", group="cut", dir=str(offline_wandb))
    logger.start(big, name="cut-run")
    logger.log_summary({"metrics": {"tokens_per_s": 3.0}})
    logger.finish()
    (logged,) = offline_runs(offline_wandb)
    assert logged["complete"]
    (run_dir,) = (offline_wandb / "wandb").glob("offline-run-*")
    (full,) = run_dir.glob("run-*.wandb")
    data = full.read_bytes()
    cut_dir = tmp_path / "cut" / run_dir.name
    cut_dir.mkdir(parents=True)
    cuts = sorted({*range(7, len(data), max(1, len(data) // 97)), len(data) - 1, 40000})
    for cut in cuts:
        (cut_dir / full.name).write_bytes(data[:cut])
        got = read_offline_run(cut_dir)
        assert got["complete"] is False, cut
    (cut_dir / full.name).write_bytes(data)
    assert read_offline_run(cut_dir) == logged


def _samples(run_dir: Path) -> list[dict]:
    return [
        json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines() if line
    ]


def test_hydra_multirun_named_by_the_swept_overrides(tmp_path, monkeypatch):
    """``run.py -m``: the keys swept on the command line or in hydra.sweeper.params name the run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    sweep_dir = tmp_path / "2026-01-02" / "03-04-05"
    sweep_dir.mkdir(parents=True)
    given = ["decoder=spd,mtad", "gamma=3,5", "limit=1", "+k_config=[4,2]"]
    saved = {"hydra": {"overrides": {"task": given}, "sweeper": {"params": {"tau": "0.3,0.5"}}}}
    (sweep_dir / "multirun.yaml").write_text(OmegaConf.to_yaml(saved))
    job = ["decoder=mtad", "gamma=5", "limit=1", "+k_config=[4,2]", "tau=0.5"]
    hydra = OmegaConf.create(
        {"mode": RunMode.MULTIRUN, "overrides": {"task": job}, "sweep": {"dir": str(sweep_dir)}}
    )
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hydra))
    cfg = {"decoder": {"_target_": "mtad.decoders.mtad.MTAD", "gamma": 5, "tau": 0.5, "width": 4}}
    ident = run_identity(cfg, {"decoder": "mtad", "task": "smoke", "pair": "tiny_random"})
    assert ident["name"] == "mtad g5 t0.5 smoke"
    assert ident["group"] == "multirun 2026-01-02/03-04-05"


def test_evaluate_logs_its_run_with_labels_and_summary(tmp_path, offline_wandb):
    """``logger=wandb`` on a run: evaluate passes the names it loaded and the whole summary."""
    from mtad.run.evaluate import run

    cfg = compose_config(
        [
            "+experiment=debug",
            "decoder=spd",
            "logger=wandb",
            "logger.mode=offline",
            f"logger.dir={offline_wandb}",
            "limit=1",
            "max_new_tokens=4",
            f"output_dir={tmp_path / 'run'}",
        ]
    )
    summary = run(cfg)
    (logged,) = offline_runs(offline_wandb)
    assert logged["complete"]
    assert logged["name"] == f"spd g{cfg.gamma} smoke"
    assert logged["tags"] == ["pair:tiny_random", "task:smoke", "decoder:spd"]
    assert logged["summary"]["lossless"] is True and logged["summary"]["pair"] == "tiny_random"
    assert logged["summary"]["tokens_per_s"] == pytest.approx(summary["metrics"]["tokens_per_s"])

"""Sweeps: definitions expand and compose, points resume and are never recomputed, skips are recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from mtad import sweep as sw
from mtad.cli import group_options

ROOT = Path(__file__).resolve().parent.parent

def _is_sweep_file(path: Path) -> bool:
    from omegaconf import OmegaConf

    return "sweep" in OmegaConf.load(path)  # other studies live in experiments/ too


EXPERIMENTS = sorted(p for p in (ROOT / "experiments").glob("*.yaml") if _is_sweep_file(p))
SMOKE = ROOT / "experiments" / "table2_smoke.yaml"
# the smallest real run: tiny random pair, 2 prompts, 4 new tokens
TINY = ["limit=2", "max_new_tokens=4", "warmup=0", "perplexity=true"]


def _covering(jobs: list[list[str]]) -> list[list[str]]:
    """A few jobs in which every value of every axis appears at least once."""
    seen: set[str] = set()
    out = []
    for job in jobs:
        if not set(job) <= seen:
            out.append(job)
            seen |= set(job)
    return out


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_sweep_definitions_expand_and_report_unknown_names(path):
    """Every sweep file expands; every axis value composes or is reported as an unknown name."""
    with sw._Composer(path) as composer:
        base = composer([])
        assert base.sweep.name and base.hydra.sweeper.params
        jobs = sw.expand(dict(base.hydra.sweeper.params), [])
        assert jobs and all(jobs)
        for job in _covering(jobs):
            problems = [p for p in (sw._unknown_option(o, sw.CONF_DIR) for o in job) if p]
            if problems:  # a decoder/task/model not written yet: reported, never a crash
                assert all("unknown" in p and "available:" in p for p in problems)
                continue
            cfg = sw._strip_hydra(composer(job))
            assert len(sw.config_hash(sw.identity(cfg))) == sw.HASH_LEN
            assert {"output_dir", "sweep", "logger"}.isdisjoint(sw.identity(cfg))


def test_smoke_definition_loads_every_point():
    s = sw.load(SMOKE, root="/nonexistent")
    assert len(s.points) == len(s.jobs) == 8
    assert {p.hash for p in s.known()} and None not in {p.hash for p in s.known()}
    for group, names in sw.unknown_names(s).items():
        assert set(names).isdisjoint(group_options(group))


@pytest.mark.parametrize("path", [p for p in EXPERIMENTS if p.stem.startswith("ablation_")], ids=lambda p: p.stem)
def test_ablation_profiles_compose(path):
    s = sw.load(path, root="/nonexistent", profile="smoke")
    assert s.name.endswith("_smoke") and s.known()
    assert all(p.choices["model"] == "tiny_random" for p in s.known())


def test_grid_expands_like_hydra_and_command_line_replaces_an_axis():
    s = sw.load(SMOKE, ["decoder=multinomial,spd", "gamma=2,3", "limit=1"], root="/x")
    assert [p.overrides for p in s.points][:2] == [
        ["model=tiny_random", "task=smoke", "decoder=multinomial", "gamma=2", "limit=1"],
        ["model=tiny_random", "task=smoke", "decoder=multinomial", "gamma=3", "limit=1"],
    ]
    assert len(s.points) == 4 and len({p.hash for p in s.points}) == 4
    assert all(p.cfg.limit == 1 for p in s.points)


def test_unknown_decoder_did_you_mean():
    s = sw.load(SMOKE, ["decoder=sdp,spd"], root="/x")
    bad = [p for p in s.points if p.hash is None]
    assert len(bad) == 1 and "did you mean 'spd'" in bad[0].problem
    assert sw.unknown_names(s) == {"decoder": ["sdp"]}
    assert sw.main([str(SMOKE), "decoder=sdp,spd", "--root", "/x", "--strict", "--dry-run"]) == 2


def test_identity_excludes_output_paths_and_tracking():
    a = sw.load(SMOKE, ["decoder=spd"], root="/x").points[0]
    b = sw.load(SMOKE, ["decoder=spd", "logger=wandb", "resume=false", "sweep.name=other"], root="/y").points[0]
    c = sw.load(SMOKE, ["decoder=spd", "gamma=5"], root="/x").points[0]
    assert a.hash == b.hash != c.hash
    cfg = a.cfg.copy()
    cfg.output_dir = "/somewhere/else"
    assert sw.config_hash(sw.identity(cfg)) == a.hash


def test_finished_needs_matching_hash(tmp_path):
    p = sw.load(SMOKE, ["decoder=spd"], root=tmp_path).points[0]
    d = tmp_path / p.hash
    d.mkdir()
    assert not sw.finished(d, p.hash)
    from omegaconf import OmegaConf

    cfg = p.cfg.copy()
    cfg.output_dir = str(d)
    cfg = OmegaConf.to_container(cfg, resolve=True)  # what evaluate writes
    (d / "summary.json").write_text(json.dumps({"config": cfg}))
    assert sw.finished(d, p.hash)
    cfg["gamma"] = 7
    (d / "summary.json").write_text(json.dumps({"config": cfg}))
    assert not sw.finished(d, p.hash)


def test_sweep_resumes_without_recomputing(tmp_path, monkeypatch):
    """2-point smoke sweep, killed in the middle of the second point, then rerun."""
    import mtad.engine
    import mtad.evaluate

    s = sw.load(SMOKE, ["decoder=multinomial,spd", *TINY], root=tmp_path)
    first, second = s.points
    generated: list[int] = []
    real_generate = mtad.engine.Engine.generate

    def counting_generate(self, *a, **k):
        generated.append(1)
        return real_generate(self, *a, **k)

    monkeypatch.setattr(mtad.engine.Engine, "generate", counting_generate)
    real_append = mtad.evaluate.append_jsonl

    def append_then_die(path, record):
        real_append(path, record)
        if Path(path).parent.name == second.hash:
            raise KeyboardInterrupt  # the process is killed after the second point's first example

    monkeypatch.setattr(mtad.evaluate, "append_jsonl", append_then_die)
    with pytest.raises(KeyboardInterrupt):
        sw.run(s, progress=False)
    assert sw.finished(tmp_path / s.name / first.hash, first.hash)
    assert not (tmp_path / s.name / second.hash / "summary.json").exists()
    partial = (tmp_path / s.name / second.hash / "samples.jsonl").read_text().splitlines()
    assert len(partial) == 1 and len(generated) == 3
    index = json.loads((tmp_path / s.name / "sweep.json").read_text())
    assert [p["status"] for p in index["points"]] == ["done", "partial"]

    monkeypatch.setattr(mtad.evaluate, "append_jsonl", real_append)
    summary_before = (tmp_path / s.name / first.hash / "summary.json").stat().st_mtime_ns
    generated.clear()
    report = sw.run(sw.load(SMOKE, ["decoder=multinomial,spd", *TINY], root=tmp_path), progress=False)
    assert report.statuses == {first.label: sw.CACHED, second.label: sw.DONE}
    assert len(generated) == 1  # only the second point's missing example
    assert (tmp_path / s.name / first.hash / "summary.json").stat().st_mtime_ns == summary_before
    lines = (tmp_path / s.name / second.hash / "samples.jsonl").read_text().splitlines()
    assert lines[0] == partial[0] and len(lines) == 2
    summary = json.loads((tmp_path / s.name / second.hash / "summary.json").read_text())
    assert summary["metrics"]["examples"] == 2 and sw.finished(tmp_path / s.name / second.hash, second.hash)


def test_unavailable_task_and_model_are_skipped_and_the_sweep_goes_on(tmp_path, monkeypatch):
    import mtad.evaluate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub pair is not cached here: its load fails
    calls = []
    real_run = mtad.evaluate.run

    def counting_run(cfg, out):
        calls.append(out)
        return real_run(cfg, out)

    monkeypatch.setattr(mtad.evaluate, "run", counting_run)
    s = sw.load(SMOKE, ["task=chatalpaca,smoke", "model=llama31_8b__llama32_1b", "decoder=spd", *TINY],
                root=tmp_path)
    report = sw.run(s, progress=False)
    assert list(report.statuses.values()) == [sw.SKIPPED, sw.SKIPPED]
    ta = json.loads((tmp_path / s.name / s.points[0].hash / "skipped.json").read_text())
    mo = json.loads((tmp_path / s.name / s.points[1].hash / "skipped.json").read_text())
    assert ta["kind"] == "task_unavailable" and "ChatAlpaca" in ta["reason"]
    assert mo["kind"] == "model_unavailable" and "llama31_8b__llama32_1b" in mo["reason"]
    assert len(calls) == 1  # the task was checked before any model was loaded


def test_a_folder_with_another_config_is_not_resumed(tmp_path):
    s = sw.load(SMOKE, ["decoder=spd", *TINY], root=tmp_path)
    d = s.dir / s.points[0].hash
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"gamma": 99}))
    report = sw.run(s, progress=False, evaluate=lambda cfg, out: pytest.fail("must not resume"))
    assert report.count(sw.FAILED) == 1
    assert "another config" in json.loads((d / "error.json").read_text())["reason"]


def test_other_errors_are_recorded_and_the_sweep_goes_on(tmp_path):
    def broken(cfg, out):
        raise ValueError("decoder bug")

    s = sw.load(SMOKE, ["decoder=multinomial,spd", *TINY], root=tmp_path)
    report = sw.run(s, progress=False, evaluate=broken)
    assert report.count(sw.FAILED) == 2 and not report.ok
    err = json.loads((tmp_path / s.name / s.points[0].hash / "error.json").read_text())
    assert "decoder bug" in err["reason"] and "Traceback" in err["traceback"]
    with pytest.raises(ValueError):
        sw.run(s, progress=False, evaluate=broken, fail_fast=True)


def test_a_file_that_is_not_a_sweep_is_refused(tmp_path):
    f = tmp_path / "study.yaml"
    f.write_text("seed: 0\n")
    with pytest.raises(ValueError, match="not a sweep file"):
        sw.load(f)


def test_dry_run_lists_points_and_estimate(tmp_path, capsys):
    assert sw.main([str(SMOKE), "--dry-run", "--root", str(tmp_path), "decoder=spd,nodecoder"]) == 0
    out = capsys.readouterr().out
    assert "pending" in out and "unknown" in out and "estimate:" in out and "nodecoder" in out
    assert not (tmp_path / "table2_smoke").exists()


def test_launch_one_multirun_per_model_pair(tmp_path, monkeypatch):
    """--launcher: one Hydra multirun per pair (model fixed, so the launcher reads its gpus)."""
    commands = []
    monkeypatch.setattr(sw.subprocess, "call", lambda cmd: commands.append(cmd) or 0)
    s = sw.load(ROOT / "experiments" / "table2.yaml",
                ["model=llama31_8b__llama32_1b,opt13b__opt125m", "task=humaneval", "decoder=spd,nope",
                 "hydra.launcher.partition=gpu"], root=tmp_path)
    assert s.hydra_overrides == ["hydra.launcher.partition=gpu"] and len(s.known()) == 2
    assert sw.launch(s, "mtad_slurm") == 0
    assert len(commands) == 2
    for cmd, model in zip(commands, ("llama31_8b__llama32_1b", "opt13b__opt125m")):
        assert cmd[2:6] == ["mtad.sweep", "hydra", "-m", "-cd"]
        assert {"hydra/launcher=mtad_slurm", "hydra.launcher.partition=gpu", f"model={model}",
                "decoder=spd", "task=humaneval", f"sweep.root={tmp_path.resolve()}"} <= set(cmd)
    assert (tmp_path / "table2" / "sweep.json").exists()

    class FakePopen:
        def __init__(self, cmd):
            commands.append(cmd)

        def wait(self):
            return 0

    commands.clear()
    monkeypatch.setattr(sw.subprocess, "Popen", FakePopen)
    assert sw.launch(s, "mtad_slurm", concurrent=True) == 0 and len(commands) == 2


def _compose_launcher(sweep_file: Path, overrides):
    with initialize_config_dir(config_dir=str(sweep_file.parent), version_base="1.3"):
        return compose(sweep_file.stem, overrides=[f"hydra.searchpath=[file://{ROOT / 'conf'}]", *overrides],
                       return_hydra_config=True)


@pytest.mark.parametrize("model,gpus", [("llama31_8b__llama32_1b", 1), ("llama2_70b__llama2_7b", 2), ("tiny_random", None)])
def test_slurm_launcher_composes_with_gpus_from_the_model(model, gpus):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = _compose_launcher(ROOT / "experiments" / "table2.yaml", ["hydra/launcher=mtad_slurm", f"model={model}"])
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.gpus_per_node == gpus and cfg.hydra.launcher.tasks_per_node == 1
    launcher = instantiate(cfg.hydra.launcher)  # builds the launcher; submits nothing
    assert launcher.params["gpus_per_node"] == gpus and launcher.params["name"] == "mtad-table2"


def test_joblib_launcher_composes():
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    cfg = _compose_launcher(SMOKE, ["hydra/launcher=mtad_joblib"])
    assert cfg.hydra.launcher.n_jobs == 1
    assert type(instantiate(cfg.hydra.launcher)).__name__ == "JoblibLauncher"
    assert str(cfg.hydra.sweep.dir).startswith("results/sweeps/table2_smoke/.hydra/")

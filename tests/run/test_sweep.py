"""Sweeps: definitions expand and compose, points resume and are never recomputed, skips are
recorded, folders written by the old sweep layout are adopted, two sweeps never write one point."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from mtad.run import sweep as sw
from mtad.run.cli import CONF_DIR, check_keys, expand, group_options
from mtad.run.config import ConfigError
from mtad.run.results import (
    CACHED,
    DONE,
    FAILED,
    HASH_LEN,
    RECORD_FIELDS,
    SKIPPED,
    PointFolder,
    identity,
    identity_hash,
)

ROOT = Path(__file__).resolve().parents[2]

def _is_sweep_file(path: Path) -> bool:
    from omegaconf import OmegaConf

    return "sweep" in OmegaConf.load(path)  # other studies live in experiments/ too


EXPERIMENTS = sorted(p for p in (ROOT / "experiments").glob("*.yaml") if _is_sweep_file(p))
TABLE2 = ROOT / "experiments" / "table2.yaml"
SMOKE = TABLE2  # with --profile smoke: the tiny random pair, 2 prompts, 16 new tokens, 8 decoders


def load_smoke(overrides=(), **kw) -> sw.Sweep:
    """Table 2's smoke profile (results/sweeps/table2_smoke)."""
    return sw.load(TABLE2, overrides, profile="smoke", **kw)


# the smallest real run: tiny random pair, 2 prompts, 4 new tokens
TINY = ["limit=2", "max_new_tokens=4", "warmup=0", "perplexity=true"]


def full_record(**fields) -> dict:
    """A ``samples.jsonl`` record with every field of ``RECORD_FIELDS`` (placeholder values)."""
    return {**{k: [] if types[0] is list else types[0]() for k, types in RECORD_FIELDS.items()}, **fields}


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
    with sw.Composer(path) as composer:
        base = composer([])
        assert base.sweep.name and base.hydra.sweeper.params
        jobs = expand([f"{k}={v}" for k, v in base.hydra.sweeper.params.items()])
        assert jobs and all(jobs)
        for job in _covering(jobs):
            try:
                check_keys(job, CONF_DIR)
            except ConfigError as e:  # a decoder/task/model not written yet: reported, never a crash
                assert "unknown" in str(e) and "available:" in str(e)
                continue
            cfg = sw.plan.strip_hydra(composer(job))
            sw.plan.check_point(cfg, job, path)
            assert len(identity_hash(identity(cfg))) == HASH_LEN


def test_smoke_definition_loads_every_point():
    s = load_smoke(root="/nonexistent")
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
    # the file's axes, then its profile's settings, then the command line's: a later value of a
    # key replaces the earlier one in its place (limit=1 the profile's limit=2)
    s = load_smoke(["decoder=mtad,spd", "gamma=2,3", "limit=1"], root="/x")
    profile = ["limit=1", "max_new_tokens=16", "warmup=0"]
    assert [p.overrides for p in s.points][:2] == [
        ["model=tiny_random", "task=smoke", "decoder=mtad", *profile, "gamma=2"],
        ["model=tiny_random", "task=smoke", "decoder=mtad", *profile, "gamma=3"],
    ]
    assert len(s.points) == 4 and len({p.hash for p in s.points}) == 4
    assert all(p.cfg.limit == 1 for p in s.points)


def test_unknown_decoder_did_you_mean():
    s = load_smoke(["decoder=sdp,spd"], root="/x")
    bad = [p for p in s.points if p.hash is None]
    assert len(bad) == 1 and "did you mean 'spd'" in bad[0].problem
    assert sw.unknown_names(s) == {"decoder": ["sdp"]}
    assert sw.main([str(SMOKE), "--profile", "smoke", "decoder=sdp,spd", "--root", "/x", "--strict", "--dry-run"]) == 2


def test_identity_excludes_output_paths_tracking_and_the_number_of_examples():
    a = load_smoke(["decoder=spd"], root="/x").points[0]
    b = load_smoke(["decoder=spd", "logger=wandb", "resume=false", "sweep.name=other", "limit=1",
                        "warmup=3", "perplexity=false"], root="/y").points[0]
    c = load_smoke(["decoder=spd", "gamma=5"], root="/x").points[0]
    d = load_smoke(["decoder=spd", "model.dtype=bfloat16"], root="/x").points[0]
    assert a.hash == b.hash and len({a.hash, c.hash, d.hash}) == 3
    cfg = a.cfg.copy()
    cfg.output_dir = "/somewhere/else"
    cfg.task.scorer.timeout = 99.0  # scores carry their scorer per record: not identity
    assert identity_hash(identity(cfg)) == a.hash
    assert identity_hash(identity(cfg, version="999")) != a.hash  # a changed decoder is a new point


def test_a_knob_the_decoder_ignores_is_not_identity_and_not_accepted():
    m4 = load_smoke(["decoder=multinomial"], root="/x").points[0]
    cfg = m4.cfg.copy()
    cfg.gamma = 6  # a config default changed: multinomial does not use it
    assert identity_hash(identity(cfg)) == m4.hash
    s = load_smoke(["decoder=specinfer,spd", "gamma=6"], root="/x")
    bad, good = s.points
    assert bad.hash is None and "specinfer uses k_config, not gamma" in bad.problem
    assert good.hash is not None and good.cfg.decoder.gamma == 6
    assert sw.main([str(SMOKE), "--profile", "smoke", "decoder=specinfer", "gamma=6", "--root", "/x", "--strict", "--dry-run"]) == 2


def test_a_point_at_a_sampling_setting_its_decoder_does_not_support_is_kept_with_its_reason():
    """Greedy match supports temperature 0 only: at the file's temperature its point is planned
    with its one-line reason and never run (``--strict`` refuses the sweep); at 0 it is a point."""
    s = load_smoke(["decoder=greedy_match,spd"], root="/x")
    bad, good = s.points
    assert bad.hash is None and good.hash is not None
    assert bad.problem == ("decoder=greedy_match: verifier 'greedy_match' supports temperature 0 only (it accepts "
                           "a draft token iff it is the target's argmax), got temperature=1; set temperature=0")
    assert load_smoke(["decoder=greedy_match", "temperature=0"], root="/x").points[0].hash is not None
    assert sw.main([str(SMOKE), "--profile", "smoke", "decoder=greedy_match", "--root", "/x", "--strict",
                    "--dry-run"]) == 2


def test_finished_needs_matching_identity_limit_and_a_clean_record_file(tmp_path):
    p = load_smoke(["decoder=spd", *TINY], root=tmp_path).points[0]
    folder = PointFolder(tmp_path / p.hash)
    folder.path.mkdir()
    assert not folder.finished(p.hash, p.limit)
    records = [full_record(example_id=f"e{i}", turn=0, index=i) for i in range(2)]
    folder.file("samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    folder.write_summary({"metrics": {"examples": 2}}, p.hash, p.limit, 2)
    assert folder.finished(p.hash, p.limit)
    assert not folder.finished(p.hash, 5)  # more examples asked for: not finished
    assert not folder.finished("0" * HASH_LEN, p.limit)
    with open(folder.file("samples.jsonl"), "a") as f:
        f.write(json.dumps(records[1]) + "\n")  # a duplicate record
    assert not folder.finished(p.hash, p.limit)


def count_generations(monkeypatch) -> list[int]:
    """A list that grows by one at every ``Engine.generate`` call (the real one still runs)."""
    import mtad.core.engine

    generated: list[int] = []
    real_generate = mtad.core.engine.Engine.generate

    def counting_generate(self, *a, **k):
        generated.append(1)
        return real_generate(self, *a, **k)

    monkeypatch.setattr(mtad.core.engine.Engine, "generate", counting_generate)
    return generated


def test_sweep_resumes_without_recomputing(tmp_path, monkeypatch):
    """2-point smoke sweep, killed in the middle of the second point, then rerun."""
    import mtad.run.results.folder

    s = load_smoke(["decoder=multinomial,spd", *TINY], root=tmp_path)
    first, second = s.points
    generated = count_generations(monkeypatch)
    real_append = mtad.run.results.folder.append_jsonl

    def append_then_die(path, record):
        real_append(path, record)
        if Path(path).parent.name == second.hash:
            raise KeyboardInterrupt  # the process is killed after the second point's first example

    monkeypatch.setattr(mtad.run.results.folder, "append_jsonl", append_then_die)
    with pytest.raises(KeyboardInterrupt):
        sw.run(s, progress=False)
    assert PointFolder(tmp_path / s.name / first.hash).finished(first.hash, first.limit)
    assert not (tmp_path / s.name / second.hash / "summary.json").exists()
    partial = (tmp_path / s.name / second.hash / "samples.jsonl").read_text().splitlines()
    assert len(partial) == 1 and len(generated) == 3
    index = json.loads((tmp_path / s.name / "sweep.json").read_text())
    assert [p["status"] for p in index["points"]] == ["done", "partial"]
    assert not Path(index["file"]).is_absolute()  # committed indexes carry no machine paths

    monkeypatch.setattr(mtad.run.results.folder, "append_jsonl", real_append)
    summary_before = (tmp_path / s.name / first.hash / "summary.json").stat().st_mtime_ns
    generated.clear()
    report = sw.run(load_smoke(["decoder=multinomial,spd", *TINY], root=tmp_path), progress=False)
    assert report.statuses == {first.label: CACHED, second.label: DONE}
    assert len(generated) == 1  # only the second point's missing example
    assert (tmp_path / s.name / first.hash / "summary.json").stat().st_mtime_ns == summary_before
    lines = (tmp_path / s.name / second.hash / "samples.jsonl").read_text().splitlines()
    assert lines[0] == partial[0] and len(lines) == 2
    summary = json.loads((tmp_path / s.name / second.hash / "summary.json").read_text())
    assert summary["metrics"]["examples"] == 2
    assert PointFolder(tmp_path / s.name / second.hash).finished(second.hash, second.limit)


def test_a_point_held_elsewhere_is_read_and_resumed_in_place(tmp_path, monkeypatch):
    """Identity is global: a sweep finds a point that another sweep's folder under its search
    path holds. A folder of more examples covers fewer (read, untouched); one of fewer is
    completed in place under its own lock (the first records kept byte for byte), equals a run
    from scratch, and the first sweep then finds it cached. A folder under the same hash name
    holding another point is never used; --dry-run says where each point was found."""
    import io

    from mtad.run.sweep.cli import dry_run, estimate

    generated = count_generations(monkeypatch)
    tiny = [o for o in TINY if not o.startswith("limit=")]
    base = ["decoder=multinomial", *tiny]
    first = load_smoke([*base, "limit=2"], root=tmp_path / "a", name="first")
    assert sw.run(first, progress=False).ok
    (p,) = first.points
    src = tmp_path / "a" / "first" / p.hash
    before = (src / "samples.jsonl").read_bytes()
    # a folder under the same hash name that holds another point is never used
    decoy = tmp_path / "b" / "decoy" / p.hash
    decoy.mkdir(parents=True)
    other = load_smoke(["decoder=spd", *tiny, "limit=2"], root=tmp_path / "x").points[0]
    assert other.hash != p.hash
    PointFolder(decoy).claim(identity(other.cfg))
    (decoy / "samples.jsonl").write_text((src / "samples.jsonl").read_text() * 2)

    fewer = load_smoke([*base, "limit=1"], root=tmp_path / "b", name="fewer", search=[tmp_path])
    assert fewer.folder(fewer.points[0]).path == src  # 2 examples cover 1: read in place
    generated.clear()
    assert sw.run(fewer, progress=False).statuses == {fewer.points[0].label: CACHED} and not generated
    assert (src / "samples.jsonl").read_bytes() == before
    index = json.loads((tmp_path / "b" / "fewer" / "sweep.json").read_text())
    assert (tmp_path / "b" / "fewer" / index["points"][0]["dir"]).resolve() == src.resolve()

    second = load_smoke([*base, "limit=3"], root=tmp_path / "b", name="second", search=[tmp_path])
    assert second.points[0].hash == p.hash  # limit is not part of the identity
    listing = io.StringIO()
    dry_run(second, 10, 10, out=listing)
    assert f"found in {src.name}/, resumed there" in listing.getvalue()  # never an absolute path
    assert "1 partial (found elsewhere)" in listing.getvalue()
    assert estimate(second, 10, 10)["turns"] == 1
    with PointFolder(src).lock():  # resumed under that folder's lock: busy while another holds it
        import threading

        out = {}
        t = threading.Thread(target=lambda: out.update(r=sw.run(second, progress=False)))
        t.start()
        t.join()
    assert list(out["r"].statuses.values()) == ["busy"]
    assert sw.run(second, progress=False).ok
    assert len(generated) == 1  # only the third example, written into the first sweep's folder
    assert not (tmp_path / "b" / "second" / p.hash).exists()
    lines = (src / "samples.jsonl").read_text().splitlines()
    assert lines[:2] == before.decode().splitlines() and len(lines) == 3
    assert PointFolder(src).finished(p.hash, 3) and PointFolder(src).finished(p.hash, 2)
    generated.clear()
    assert set(sw.run(load_smoke([*base, "limit=2"], root=tmp_path / "a", name="first"),
                      progress=False).statuses.values()) == {CACHED}
    assert not generated

    fresh = load_smoke([*base, "limit=3"], root=tmp_path / "fresh", name="second")
    assert sw.run(fresh, progress=False).ok
    strip = ("wall_time", "prefill_time", "target_forward_time", "draft_forward_time", "tokens_per_s",
             "segment")  # timings, and the id of the run that wrote the record (its provenance)

    def read(f):
        return [{k: v for k, v in json.loads(line).items() if k not in strip} for line in f.read_text().splitlines()]

    assert read(src / "samples.jsonl") == read(tmp_path / "fresh" / "second" / p.hash / "samples.jsonl")


def test_a_sweep_given_a_root_searches_only_that_root(tmp_path):
    """A scratch root never reaches into the results tree: ``--root`` without ``--search``."""
    s = sw.load(ROOT / "experiments" / "table2.yaml", ["decoder=spd"], profile="cpu", root=tmp_path)
    assert s.search == [tmp_path]
    assert sw.load(ROOT / "experiments" / "table2.yaml", ["decoder=spd"], profile="cpu").search == [Path("results")]


def test_unavailable_task_and_model_are_skipped_and_the_sweep_goes_on(tmp_path, monkeypatch):
    import mtad.run.evaluate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub pair is not cached here: its load fails
    calls = []
    real_run = mtad.run.evaluate.run

    def counting_run(cfg, out, *args):
        calls.append(out)
        return real_run(cfg, out, *args)

    monkeypatch.setattr(mtad.run.evaluate, "run", counting_run)
    s = load_smoke(["task=chatalpaca,smoke", "model=llama31_8b__llama32_1b", "decoder=spd", *TINY],
                root=tmp_path)
    report = sw.run(s, progress=False)
    assert list(report.statuses.values()) == [SKIPPED, SKIPPED]
    ta = json.loads((tmp_path / s.name / s.points[0].hash / "skipped.json").read_text())
    mo = json.loads((tmp_path / s.name / s.points[1].hash / "skipped.json").read_text())
    assert ta["kind"] == "task_unavailable" and "ChatAlpaca" in ta["reason"]
    assert mo["kind"] == "model_unavailable" and "llama31_8b__llama32_1b" in mo["reason"]
    assert len(calls) == 1  # the task was checked before any model was loaded


def test_a_folder_with_another_point_is_not_resumed(tmp_path):
    s = load_smoke(["decoder=spd", *TINY], root=tmp_path)
    other = load_smoke(["decoder=spd", "gamma=3", *TINY], root=tmp_path).points[0]
    d = s.dir / s.points[0].hash
    d.mkdir(parents=True)
    (d / "point.json").write_text(json.dumps({"format": 2, "identity_hash": other.hash,
                                              "identity": identity(other.cfg)}))
    (d / "samples.jsonl").write_text('{"example_id": "HumanEval/0", "turn": 0, "index": 0}\n')
    report = sw.run(s, progress=False, evaluate=lambda cfg, out: pytest.fail("must not resume"))
    assert report.count(FAILED) == 1
    assert len((d / "samples.jsonl").read_text().splitlines()) == 1  # left as it was


def test_other_errors_are_recorded_and_the_sweep_goes_on(tmp_path):
    def broken(cfg, out):
        raise ValueError("decoder bug")

    s = load_smoke(["decoder=multinomial,spd", *TINY], root=tmp_path)
    report = sw.run(s, progress=False, evaluate=broken)
    assert report.count(FAILED) == 2 and not report.ok
    err = json.loads((tmp_path / s.name / s.points[0].hash / "error.json").read_text())
    assert "decoder bug" in err["reason"] and "Traceback" in err["traceback"]
    with pytest.raises(ValueError):
        sw.run(s, progress=False, evaluate=broken, fail_fast=True)


def test_a_file_that_is_not_a_sweep_is_refused(tmp_path):
    f = tmp_path / "study.yaml"
    f.write_text("seed: 0\n")
    with pytest.raises(ValueError, match="not a sweep file"):
        sw.load(f)


def test_a_missing_or_unreadable_sweep_file_is_one_line_exit_2(tmp_path, capsys):
    """A mistyped path, a file that is not YAML and a YAML without `sweep:` end in one line each
    on stderr (exit 2), no traceback, no folder made."""
    from mtad.run.sweep.cli import main

    notyaml = tmp_path / "notes.md"
    notyaml.write_text("* a list\n*not yaml: [\n")
    plain = tmp_path / "study.yaml"
    plain.write_text("seed: 0\n")
    for path, says in ((tmp_path / "no_such.yaml", "no sweep file"), (notyaml, "is not a YAML sweep file"),
                       (plain, "is not a sweep file")):
        assert main([str(path), "--root", str(tmp_path / "out"), "--dry-run"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "out").exists()


def test_examples_policy_is_checked_and_written_to_the_index(tmp_path):
    """``sweep.examples`` (all | requested) names what a rendering shows; a bad value is refused
    naming the field, and the index carries the policy and each point's limit."""
    from mtad.run.sweep.execute import write_index
    text = (ROOT / "experiments" / "table2.yaml").read_text()
    shutil.copytree(ROOT / "experiments" / "shared", tmp_path / "shared")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("  name: table2\n", "  name: table2\n  examples: first\n"))
    with pytest.raises(ValueError, match=r"sweep.examples='first'.*all, requested"):
        sw.load(bad, profile="smoke", root=tmp_path)
    from mtad.run.sweep.plan import sweep_meta
    assert all(sweep_meta(ROOT / f"experiments/ablation_{k}.yaml")["examples"] == "requested"
               for k in ("tau", "gamma", "width", "draft"))
    sweep = load_smoke(root=tmp_path)
    write_index(sweep)
    index = json.loads((sweep.dir / "sweep.json").read_text())
    assert index["examples"] == "all" and {p["limit"] for p in index["points"]} == {2}
    assert index["render"] == {}  # smoke: default rendering


def test_render_options_per_profile_are_checked_and_indexed(tmp_path):
    """``sweep.render.<profile>``: the cpu profiles draw perplexity vs block efficiency and show
    no speedup columns (their tokens/s come from a shared machine); an unknown option or value
    is refused, naming it."""
    from mtad.analysis.figures import PARETO_X
    from mtad.run.sweep.execute import write_index
    from mtad.run.sweep.plan import RENDER_OPTIONS, render_options
    assert set(RENDER_OPTIONS["pareto_x"]) == set(PARETO_X)
    for name in ("table2", "ablation_tau", "ablation_gamma", "ablation_width"):
        assert render_options(ROOT / f"experiments/{name}.yaml", "cpu") == {
            "pareto_x": "block_efficiency", "speedups": False}
    assert render_options(TABLE2) == {}  # paper: tokens/s on GPUs
    sweep = sw.load(TABLE2, profile="cpu", root=tmp_path)
    write_index(sweep)
    assert json.loads((sweep.dir / "sweep.json").read_text())["render"] == {
        "pareto_x": "block_efficiency", "speedups": False}
    shutil.copytree(ROOT / "experiments" / "shared", tmp_path / "shared")
    bad = tmp_path / "bad.yaml"
    bad.write_text(TABLE2.read_text().replace("cpu: {pareto_x: block_efficiency,", "cpu: {pareto_x: wall,"))
    with pytest.raises(ValueError, match=r"sweep.render.cpu.pareto_x='wall'.*block_efficiency"):
        sw.load(bad, profile="cpu", root=tmp_path)


def test_dry_run_lists_points_and_estimate(tmp_path, capsys):
    assert sw.main([str(SMOKE), "--profile", "smoke", "--dry-run", "--root", str(tmp_path), "decoder=spd,nodecoder"]) == 0
    out = capsys.readouterr().out
    assert "pending" in out and "unknown" in out and "estimate:" in out and "nodecoder" in out
    assert not (tmp_path / "table2_smoke").exists()


def test_launch_one_job_per_model_pair(tmp_path, monkeypatch):
    """--launcher (not Slurm): one Hydra multirun whose jobs are model pairs (x shards): a pair loads once.
    (Slurm: tests/run/test_slurm.py.)"""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    commands = []
    monkeypatch.setattr(sw.launcher.subprocess, "call", lambda cmd: commands.append(cmd) or 0)
    s = sw.load(ROOT / "experiments" / "table2.yaml",
                ["model=llama31_8b__llama32_1b,opt13b__opt125m", "task=humaneval", "decoder=spd,nope",
                 "hydra.launcher.n_jobs=2"], root=tmp_path)
    assert s.hydra_overrides == ["hydra.launcher.n_jobs=2"] and len(s.known()) == 2
    assert sw.launch(s, "mtad_joblib", jobs_per_pair=2) == 0
    (cmd,) = commands
    assert cmd[2:6] == ["mtad.run.sweep", "pairs", "-m", "-cd"]
    assert {"hydra/launcher=mtad_joblib", "hydra.launcher.n_jobs=2", "hydra.sweeper.params=null",
            "model=llama31_8b__llama32_1b,opt13b__opt125m", "+sweep.shard=0,1", "+sweep.shards=2",
            f"sweep.root={tmp_path.resolve()}"} <= set(cmd)
    index = json.loads((tmp_path / "table2" / "sweep.json").read_text())
    assert index["overrides"] == s.base_overrides  # what each pair job expands again


def test_pair_job_runs_only_its_pair_and_shard(tmp_path, monkeypatch):
    s = load_smoke(["decoder=multinomial,spd,mtad", *TINY], root=tmp_path)
    sw.write_index(s)
    ran = []
    monkeypatch.setattr(sw.launcher, "run", lambda sweep, points, progress: ran.append(points) or sw.Report())

    class FakeHydraConfig:
        @staticmethod
        def get():
            from omegaconf import OmegaConf

            return OmegaConf.create({"runtime": {"choices": {"model": "tiny_random"}}})

    monkeypatch.setattr("hydra.core.hydra_config.HydraConfig", FakeHydraConfig)
    from omegaconf import OmegaConf

    meta = {"file": str(SMOKE), "name": s.name, "root": str(tmp_path), "shards": 2}
    for shard in (0, 1):
        sw.pair_job(OmegaConf.create({"sweep": {**meta, "shard": shard}}))
    labels = [[p.label for p in points] for points in ran]
    assert [len(x) for x in labels] == [2, 1] and sorted(sum(labels, [])) == sorted(p.label for p in s.points)


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
    # as launch() composes it: the sweep's name (here its smoke profile's) is given
    cfg = _compose_launcher(SMOKE, ["hydra/launcher=mtad_joblib", "sweep.name=table2_smoke"])
    assert cfg.hydra.launcher.n_jobs == 1
    assert type(instantiate(cfg.hydra.launcher)).__name__ == "JoblibLauncher"
    assert str(cfg.hydra.sweep.dir).startswith("results/sweeps/table2_smoke/.hydra/")


# ----------------------------------------------------------------------------- legacy folders

LEGACY = ROOT / "tests" / "fixtures" / "legacy_sweep"
# the grid that wrote the fixture with the old sweep code (multinomial finished, spd cut off in
# its second record's line, bild finished by BiLD version 1), without the stop sequences the
# smoke task has since (a changed stop set is adopted separately: tests/run/test_adopt.py)
LEGACY_GRID = ["decoder=multinomial,spd,bild", "limit=2", "max_new_tokens=4", "warmup=0", "task.stop=[]"]


def test_legacy_sweep_folder_is_adopted(tmp_path, monkeypatch):
    """Folders of the old layout: finished points are cached, a cut-off one resumes in place
    (torn line recomputed), a point whose decoder changed (BiLD 1 -> 2) is recomputed apart."""
    import re
    import shutil

    import mtad.core.engine

    shutil.copytree(LEGACY, tmp_path, dirs_exist_ok=True)
    old = tmp_path / "table2_smoke"
    by_decoder = {json.loads((d / "point.json").read_text())["choices"]["decoder"]: d
                  for d in old.iterdir() if d.is_dir()}
    torn = (by_decoder["spd"] / "samples.jsonl").read_text().splitlines()[1]
    lost_ids = json.loads(re.search(r'"output_ids": (\[[^\]]*\])', torn).group(1))
    multinomial_summary = (by_decoder["multinomial"] / "summary.json").read_bytes()
    bild_files = {p.name: p.read_bytes() for p in by_decoder["bild"].iterdir()}

    generated = []
    real_generate = mtad.core.engine.Engine.generate
    monkeypatch.setattr(mtad.core.engine.Engine, "generate",
                        lambda self, *a, **k: generated.append(1) or real_generate(self, *a, **k))
    s = load_smoke(LEGACY_GRID, root=tmp_path)
    report = sw.run(s, progress=False)
    mn, spd, bild = s.points
    assert [report.statuses[p.label] for p in s.points] == [CACHED, DONE, DONE]
    assert len(generated) == 1 + 2  # spd's torn example, bild's two examples
    assert (by_decoder["multinomial"] / "summary.json").read_bytes() == multinomial_summary
    for d, p in ((by_decoder["multinomial"], mn), (by_decoder["spd"], spd)):
        point = json.loads((d / "point.json").read_text())
        assert point["format"] == 2 and point["identity_hash"] == p.hash and "adopted" in point
        assert PointFolder(d).finished(p.hash, p.limit)
    records = [json.loads(line) for line in (by_decoder["spd"] / "samples.jsonl").read_text().splitlines()]
    assert [r["index"] for r in records] == [0, 1] and records[1]["output_ids"] == lost_ids
    assert {p.name: p.read_bytes() for p in by_decoder["bild"].iterdir()} == bild_files
    assert PointFolder(old / bild.hash).finished(bild.hash, bild.limit)
    index = json.loads((old / "sweep.json").read_text())
    assert [row["dir"] for row in index["points"]] == [by_decoder["multinomial"].name,
                                                      by_decoder["spd"].name, bild.hash]
    generated.clear()
    assert set(sw.run(load_smoke(LEGACY_GRID, root=tmp_path), progress=False).statuses.values()) == {CACHED}
    assert not generated


# ----------------------------------------------------------------------------- processes

def _sweep_cmd(root: Path, *extra: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "mtad.run.sweep", str(SMOKE), "--profile", "smoke", "decoder=multinomial,spd", "limit=2",
            "max_new_tokens=4", "warmup=0", "perplexity=false", "--root", str(root), *extra]


def _env() -> dict:
    import os

    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


@pytest.mark.slow  # about 25 s: two process starts (the lock itself: tests/run/test_results.py)
def test_two_sweeps_at_once_write_each_record_once(tmp_path):
    """Two processes on one sweep: each point is written by one of them (the other reports it
    busy, or waits with --wait and then finds it cached)."""
    import subprocess

    procs = [subprocess.Popen(_sweep_cmd(tmp_path, "decoder=spd", *extra), cwd=ROOT, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for extra in ((), ("--wait",))]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert procs[1].returncode == 0, outs[1]
    assert procs[0].returncode == 0 or "busy 1" in outs[0], outs[0]
    s = load_smoke(["decoder=spd", "limit=2", "max_new_tokens=4", "warmup=0", "perplexity=false"],
                root=tmp_path)
    for p in s.points:
        lines = (s.dir / p.hash / "samples.jsonl").read_text().splitlines()
        assert sorted(json.loads(x)["index"] for x in lines) == [0, 1]
    assert set(sw.run(s, progress=False).statuses.values()) == {CACHED}


TIMING = {"wall_time", "target_forward_time", "draft_forward_time", "prefill_time", "tokens_per_s",
          "energy_j"}


def _content(root: Path) -> dict:
    """Every point's records and summary metrics without the timing fields and without the
    segment, the id of the run that wrote a record (each run its own: a resumed point's records
    name the runs that made them, an uninterrupted point's one run; each names a segment its
    folder holds)."""
    from mtad.run.results import PointFolder
    from mtad.run.results.segments import SEGMENT_FIELD, segments

    s = load_smoke(["decoder=multinomial,spd", "limit=2", "max_new_tokens=4", "warmup=0",
                        "perplexity=false"], root=root)
    out = {}
    for p in s.points:
        d = s.dir / p.hash
        records = [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]
        known = segments(PointFolder(d))
        assert records and all(str(r.pop(SEGMENT_FIELD)) in known for r in records), d
        summary = json.loads((d / "summary.json").read_text())
        metrics = {k: v for k, v in summary["metrics"].items()
                   if k in ("examples", "new_tokens", "steps", "block_efficiency", "acceptance_rate")}
        out[p.hash] = ([{k: v for k, v in r.items() if k not in TIMING} for r in sorted(records, key=lambda r: r["index"])],
                       metrics, summary["score"]["value"], summary["records"])
    return out


@pytest.mark.slow  # about 50 s on 2 cores: seven process starts
def test_sweep_killed_five_times_then_resumed_equals_an_uninterrupted_run(tmp_path):
    """SIGKILL at seeded random moments while points are being written, then resume."""
    import random
    import signal
    import subprocess
    import time

    rng = random.Random(1234)
    killed_root, clean_root = tmp_path / "killed", tmp_path / "clean"
    kills = 0
    for _ in range(5):
        proc = subprocess.Popen(_sweep_cmd(killed_root), cwd=ROOT, env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not list(killed_root.glob("*/*/point.json")) and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 2.0))  # somewhere inside the points' generation and writes
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= 1
    resumed = subprocess.run(_sweep_cmd(killed_root), cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    clean = subprocess.run(_sweep_cmd(clean_root), cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert clean.returncode == 0
    assert _content(killed_root) == _content(clean_root)


def test_a_machine_that_cannot_score_refuses_the_sweep_and_runs_nothing(tmp_path, monkeypatch, capsys):
    """No bubblewrap here (HumanEval's scorer preflight): not "points not run" and exit 0 with
    "every point is finished", but one line per reason, exit 2, nothing written; a dry run still
    lists the points, and the points themselves are not called broken."""
    from eval import sandbox

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # bwrap on no PATH entry, probed afresh
    monkeypatch.setattr(sandbox, "_PROBED", {})
    root = tmp_path / "sweeps"
    args = [str(SMOKE), "--profile", "smoke", "decoder=spd,mtad", "--root", str(root), *TINY]
    assert sw.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 of 2 points" in err[0] and "cannot run on this machine" in err[0]
    assert "bubblewrap" in err[0] and "task.scorer.isolation=rlimits" in err[0]
    assert not (root / "table2_smoke").exists() or not any((root / "table2_smoke").iterdir())
    assert sw.main([*args, "--dry-run"]) == 0
    s = load_smoke(["decoder=spd", *TINY], root=root)
    assert s.points[0].machine and s.points[0].hash is None
    assert sw.main([*args, "task.scorer.isolation=rlimits", "--dry-run"]) == 0
    assert all(p.hash and not p.machine for p in load_smoke(["decoder=spd", "task.scorer.isolation=rlimits", *TINY], root=root).points)

"""The Slurm path without a cluster: job sizes from the pair, refusals before submitting (a job no
partition can grant, no accounting), the jobs' environment, only unfinished points submitted,
failures listed with the resuming command. The real cluster: ``make slurm-check``."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mtad.run import sweep as sw
from mtad.run.sweep import slurm

ROOT = Path(__file__).resolve().parents[2]
TABLE2 = ROOT / "experiments" / "table2.yaml"
SMOKE_ARGS = ["experiments/table2.yaml", "--profile", "smoke"]

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
pytest.importorskip("submitit")

# sinfo --noheader -o '%P|%c|%m|%G|%l|%D' of a cluster with a CPU and a GPU partition
SINFO = ("cpu*|2|24105|(null)|infinite|1\ngpu|32|515000|gpu:a100:4(S:0-1)|2-00:00:00|8\n"
         "gpu|64|256000|gpu:h100:8|2-00:00:00|2\n")


def _fake_tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _params(model: str, *overrides: str) -> dict:
    s = sw.load(TABLE2, [f"model={model}", "task=humaneval", "decoder=spd", *overrides])
    return slurm.launcher_config(s, "mtad_slurm", s.known()[0])


@pytest.mark.parametrize("model,gpus,cpus,mem", [("llama2_70b__llama2_7b", 2, 4, 64),
                                                 ("llama31_8b__llama32_1b", 1, 4, 32),
                                                 ("tiny_random", None, 1, 2),
                                                 ("qwen_coder_offline", None, 2, 8)])
def test_job_size_comes_from_the_pair_else_defaults(model, gpus, cpus, mem):
    p = _params(model)
    assert slurm.is_slurm(p)
    assert (p["gpus_per_node"], p["cpus_per_task"], p["mem_gb"]) == (gpus, cpus, mem)


def test_job_size_is_not_in_a_points_identity():
    """cpus/mem_gb size the job, they do not change tokens: same hash with other values."""
    a = sw.load(TABLE2, ["model=tiny_random", "task=humaneval", "decoder=spd"])
    b = sw.load(TABLE2, ["model=tiny_random", "task=humaneval", "decoder=spd", "model.mem_gb=64", "model.cpus=8"])
    c = sw.load(TABLE2, ["model=tiny_random", "task=humaneval", "decoder=spd", "model.hidden_size=64"])
    assert a.known()[0].hash == b.known()[0].hash != c.known()[0].hash


def test_site_settings_reach_the_job():
    p = _params("tiny_random", "hydra.launcher.partition=gpu", "hydra.launcher.cpus_per_task=16")
    assert p["partition"] == "gpu" and p["cpus_per_task"] == 16


def test_partitions_from_sinfo():
    cpu, gpu, _ = slurm.partitions(SINFO)
    assert (cpu.name, cpu.default, cpu.cpus, cpu.mem_mb, cpu.gpus, cpu.time_min) == ("cpu", True, 2, 24105, 0, float("inf"))
    assert (gpu.name, gpu.default, gpu.gpus, gpu.time_min, gpu.nodes) == ("gpu", False, 4, 2880, 8)


@pytest.mark.parametrize("params,needle", [
    ({"cpus_per_task": 64, "mem_gb": 8}, "no node of partition 'cpu' (sinfo's default; name another with "
                                         "partition=...) can run it (cpus_per_task x tasks_per_node = 64 > 2 CPUs"),
    ({"cpus_per_task": 2, "mem_gb": 1000}, "mem_gb = 1000 > 23.5 GB per node"),
    ({"cpus_per_task": 2, "gpus_per_node": 1}, "gpus_per_node = 1 > 0 GPUs per node"),
    ({"cpus_per_task": 2, "partition": "gpu", "gpus_per_node": 16}, "gpus_per_node = 16 > 8 GPUs per node"),
    ({"cpus_per_task": 2, "partition": "gpu", "timeout_min": 4000}, "timeout_min = 4000 > the partition's 2880 min"),
    ({"cpus_per_task": 2, "partition": "bigmem"}, "partition 'bigmem' is not among sinfo's (cpu, gpu)"),
    ({"cpus_per_task": 4, "partition": "cpu"}, "no node of partition 'cpu' can run it (cpus_per_task x "
                                               "tasks_per_node = 4 > 2 CPUs per node)"),
    ({"cpus_per_task": 48, "mem_gb": 400, "partition": "gpu"},
     "no node of partition 'gpu' has all it asks for (the closest, a node of 'gpu': "),
])
def test_a_job_no_partition_can_run_is_refused_in_one_line(params, needle):
    with pytest.raises(slurm.SlurmRefused) as e:
        slurm.check_fits(params, slurm.partitions(SINFO), "the job of model pair x")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_job_some_partition_can_run_passes():
    parts = slurm.partitions(SINFO)
    slurm.check_fits({"cpus_per_task": 4, "mem_gb": 64, "gpus_per_node": 2, "timeout_min": 720, "partition": "gpu"},
                     parts, "x")
    slurm.check_fits({"cpus_per_task": 48, "mem_gb": 200, "gpus_per_node": 8, "partition": "cpu,gpu"}, parts, "x")
    slurm.check_fits({"cpus_per_task": 1, "mem_gb": 2}, parts, "x")


def test_the_real_launcher_config_fits_the_paper_pairs_on_a_gpu_partition():
    parts = slurm.partitions(SINFO)
    for model in ("llama2_70b__llama2_7b", "llama31_8b__llama32_1b", "opt13b__opt125m"):
        slurm.check_fits(_params(model, "hydra.launcher.partition=gpu"), parts, model)
    with pytest.raises(slurm.SlurmRefused, match="gpus_per_node = 2 > 0 GPUs"):
        slurm.check_fits(_params("llama2_70b__llama2_7b"), parts, "x")  # the default partition: cpu


def test_no_sacct_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sacct at all
    with pytest.raises(slurm.SlurmRefused, match="needs Slurm accounting.*sacct is not on PATH"):
        slurm.check_accounting()
    _fake_tool(tmp_path, "sacct", 'echo "Slurm accounting storage is disabled" >&2; exit 1')
    with pytest.raises(slurm.SlurmRefused) as e:
        slurm.check_accounting()
    assert "sacct fails here: Slurm accounting storage is disabled" in str(e.value) and "\n" not in str(e.value)
    _fake_tool(tmp_path, "sacct", "exit 0")
    slurm.check_accounting()


def test_launch_refuses_before_submitting(tmp_path, monkeypatch, capsys):
    """Through the command line: no sacct -> exit 2, one line, nothing submitted (no sbatch call)."""
    _fake_tool(tmp_path, "sbatch", f"touch {tmp_path}/submitted; exit 1")
    _fake_tool(tmp_path, "sinfo", f"printf '{SINFO}'")
    monkeypatch.setenv("PATH", str(tmp_path))
    argv = [*SMOKE_ARGS, "--root", str(tmp_path / "r"), "--launcher", "mtad_slurm"]
    assert sw.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mtad-sweep: the mtad_slurm launcher needs Slurm accounting")
    _fake_tool(tmp_path, "sacct", "exit 0")
    assert sw.main([*argv, "hydra.launcher.mem_gb=1000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no node of partition 'cpu' (sinfo's default" in err[0] and "mem_gb = 1000 > 23.5 GB" in err[0]
    assert not (tmp_path / "submitted").exists()


def test_jobs_export_the_submitting_shells_environment(tmp_path, monkeypatch):
    """A site with sbatch --export=NONE: the job script itself exports what the job needs.
    (submitit's Slurm executor wants ``srun`` on PATH: a stand-in, so the test runs without Slurm.)"""
    _fake_tool(tmp_path, "srun", "exit 0")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    environ = {"HF_HUB_OFFLINE": "1", "MTAD_CACHE": "/shared/my cache", "OMP_NUM_THREADS": "4",
               "PYTHONPATH": "/repo", "UNRELATED": "x"}
    p = _params("tiny_random", "++hydra.launcher.additional_parameters.export=NONE")
    p["submitit_folder"] = str(tmp_path / "%j")
    ex = slurm.executor_for(p, environ)
    setup = ex._executor.parameters["setup"]
    assert setup == ["export TOKENIZERS_PARALLELISM=false", "export HF_HUB_OFFLINE=1",
                     "export MTAD_CACHE='/shared/my cache'", "export OMP_NUM_THREADS=4", "export PYTHONPATH=/repo"]
    script = ex._executor._make_submission_file_text("python -m x", "abc")
    assert "#SBATCH --export=NONE" in script and "#SBATCH --mem=2GB" in script and "#SBATCH --cpus-per-task=1" in script
    assert script.index("export MTAD_CACHE='/shared/my cache'") < script.index("srun")


def test_split_submits_only_unfinished_points(tmp_path, monkeypatch):
    s = sw.load(TABLE2, ["model=tiny_random", "task=smoke", "decoder=multinomial,spd,specinfer,mcss,mtad",
                         "limit=2"], root=tmp_path)
    jobs = slurm.split(s, 2)
    assert [len(pts) for _, pts in jobs] == [3, 2] and {m for m, _ in jobs} == {"tiny_random"}
    done = {s.known()[0].hash, s.known()[3].hash}
    monkeypatch.setattr(type(s.folder(s.known()[0])), "finished",
                        lambda self, h, limit: h in done)
    jobs = slurm.split(s, 2)
    assert sorted(p.hash for _, pts in jobs for p in pts) == sorted(p.hash for p in s.known() if p.hash not in done)
    assert [len(pts) for _, pts in slurm.split(s, 8)] == [1, 1, 1]  # never more jobs than points
    monkeypatch.setattr(type(s.folder(s.known()[0])), "finished", lambda self, h, limit: True)
    assert slurm.split(s, 2) == []


def test_launch_goes_to_slurm_for_a_slurm_launcher(tmp_path, monkeypatch):
    s = sw.load(TABLE2, ["model=tiny_random", "task=smoke", "decoder=spd", "limit=2"], root=tmp_path)
    seen = []
    monkeypatch.setattr(slurm, "launch", lambda sweep, launcher, jobs_per_pair: seen.append((launcher, jobs_per_pair)) or 0)
    assert sw.launch(s, "mtad_slurm", jobs_per_pair=3) == 0 and seen == [("mtad_slurm", 3)]


def test_failed_jobs_list_unfinished_points_and_the_resuming_command(tmp_path, monkeypatch, capsys):
    argv = [*SMOKE_ARGS, "decoder=spd,mtad", "--root", str(tmp_path), "--launcher", "mtad_slurm", "--jobs-per-pair", "2"]
    monkeypatch.setattr(slurm, "launch", lambda sweep, launcher, jobs_per_pair: print("job 7_1 (...): CANCELLED") or 1)
    assert sw.main(argv) == 1
    out = capsys.readouterr().out
    assert "sweep table2_smoke: 2 of 2 points not finished" in out
    assert "resume them (finished points are kept, not redone): python -m mtad.run.sweep " + " ".join(argv[:3]) in out
    assert out.count("pending") == 2 and "Traceback" not in out


def test_a_finished_sweep_exits_0_and_says_so(tmp_path, monkeypatch, capsys):
    argv = [*SMOKE_ARGS, "decoder=spd", "--root", str(tmp_path), "--launcher", "mtad_slurm"]
    monkeypatch.setattr(slurm, "launch", lambda sweep, launcher, jobs_per_pair: 0)
    monkeypatch.setattr(sw.execute, "unfinished", lambda sweep: [])
    monkeypatch.setattr(sw.cli, "unfinished", lambda sweep: [])
    assert sw.main(argv) == 0
    assert "all 1 runnable points finished" in capsys.readouterr().out


def test_minutes():
    assert slurm._minutes("infinite") == float("inf")
    assert slurm._minutes("30") == 30 and slurm._minutes("4:00:00") == 240
    assert slurm._minutes("1-00:00:00") == 1440 and slurm._minutes("10:30") == 10.5


class _Paths:
    def __init__(self, tmp_path, jid):
        self.result_pickle = tmp_path / f"{jid}_result.pkl"
        self.stdout = tmp_path / f"{jid}_log.out"


class _Watcher:
    def __init__(self, states):
        self.states = states

    def is_done(self, jid, mode="standard"):
        return self.states.get(jid, "UNKNOWN") not in ("PENDING", "RUNNING", "UNKNOWN", "COMPLETING")

    def get_state(self, jid, mode="standard"):
        return self.states.get(jid, "UNKNOWN")


class _Job:
    def __init__(self, tmp_path, jid, watcher):
        self.job_id, self.paths, self.watcher = jid, _Paths(tmp_path, jid), watcher

    def result(self):
        return {"done": 2}


def test_wait_reports_each_end_and_never_hangs(tmp_path, monkeypatch):
    """Finished, killed, cancelled (only once its processes are gone), never-starting (cancelled),
    and vanished-without-accounting jobs each get a one-line outcome; the loop ends."""
    from submitit.slurm.slurm import SlurmJob

    states = {"1_0": "COMPLETED", "1_1": "FAILED", "1_2": "CANCELLED by 0", "1_3": "PENDING", "1_4": "RUNNING"}
    queue_rows = [{"1_2": ("COMPLETING", "None"), "1_3": ("PENDING", "PartitionConfig")}, {}]
    cancelled = []
    watcher = _Watcher(states)
    jobs = [sw.launcher.slurm.Submitted(_Job(tmp_path, j, watcher), "tiny_random", []) for j in sorted(states)]
    (tmp_path / "1_0_result.pkl").write_text("x")
    monkeypatch.setattr(SlurmJob.watcher, "update", lambda: None)
    monkeypatch.setattr(slurm, "_queue", lambda ids: queue_rows.pop(0) if queue_rows else {})
    monkeypatch.setattr(slurm.subprocess, "run", lambda cmd, **kw: cancelled.append(cmd))
    clock = iter(range(0, 10_000, 100))
    monkeypatch.setattr(slurm.time, "time", lambda: next(clock))
    monkeypatch.setattr(slurm.time, "sleep", lambda s: None)
    slurm.wait(jobs, poll_s=0)
    out = {s.job.job_id: s.outcome for s in jobs}
    assert out["1_0"].endswith("finished (done 2)") and jobs[0].ok
    assert "1_1 (pair tiny_random, 0 points): FAILED before finishing" in out["1_1"]
    assert "CANCELLED by 0 before finishing" in out["1_2"]
    assert "pending with reason PartitionConfig" in out["1_3"] and cancelled == [["scancel", "1_3"]]
    assert "left the queue 120 s ago and accounting (sacct) still says RUNNING" in out["1_4"]
    assert all("\n" not in o for o in out.values()) and not any(s.ok for s in jobs[1:])

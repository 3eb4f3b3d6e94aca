"""The README's commands work: CPU ones run here (on the tiny pair) or in CI; GPU/Slurm ones compose.

A command is a line of a ```bash block; its trailing ``# comment`` marks it as needing a GPU
or Slurm when it says so. ``run.py`` commands run with the tiny pair in place of the offline
pair (the same overrides otherwise); ``make`` commands must dry-run (``make -n``), and the
ones that run long are exercised where ``MAKE_EXERCISED`` says.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mtad.run.cli import compose_config

ROOT = Path(__file__).resolve().parent.parent
NOT_CPU = re.compile(r"\b(GPU|Slurm)\b")
RUN = ".venv/bin/python run.py"
#: Tiny stand-ins for the offline pair and the task's size (what a README command would load).
TINY = ["model=tiny_random", "task=smoke", "limit=1", "max_new_tokens=4", "warmup=0"]
#: CPU make commands that run for minutes: the file that exercises each, and what it must contain.
MAKE_EXERCISED = {
    "make test": (".ci/run", "make test"),
    "make reproduce-table2 PROFILE=smoke": ("tests/run/test_reproduce_smoke.py", '"--profile", "smoke"'),
    "make run": ("tests/test_readme.py", "test_make_run_config_composes"),
    "make reproduce-claims": ("tests/analysis/test_claims.py", "test_reproduce_claims_plans_the_committed_points"),
}


def readme_commands() -> list[tuple[str, bool]]:
    """(command, runs on CPU) for every line of the README's bash blocks."""
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            command, comment = re.match(r"(.*?)(?:\s+#\s*(.*))?$", line.strip()).groups()
            if command:
                out.append((command, not NOT_CPU.search(comment or "")))
    return out


COMMANDS = readme_commands()


def _ids(cmds):
    return [c for c, _ in cmds]


def test_readme_commands_are_make_targets_or_run_py():
    assert COMMANDS, "no bash block found in README.md"
    odd = [c for c, _ in COMMANDS if not c.startswith(("make ", RUN + " "))]
    assert not odd, f"README commands of a kind this test does not check: {odd}"


MAKE = [(c, cpu) for c, cpu in COMMANDS if c.startswith("make ")]


@pytest.mark.parametrize(("command", "cpu"), MAKE, ids=_ids(MAKE))
def test_make_command_dry_runs(command, cpu):
    args = command.split()[1:]
    # -W pyproject.toml: treat the install stamp as stale so the install recipe is printed too
    res = subprocess.run(
        ["make", "-n", "-W", "pyproject.toml", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    for arg in args:
        if arg.startswith("TORCH_INDEX="):
            assert f"--index-url {arg.partition('=')[2]}" in res.stdout
    if cpu and command in MAKE_EXERCISED:
        path, needle = MAKE_EXERCISED[command]
        assert needle in (ROOT / path).read_text(), f"{command!r} is no longer exercised by {path}"


def test_every_long_cpu_make_command_is_exercised():
    """A CPU make command is either quick to check by its dry run (install) or listed in MAKE_EXERCISED."""
    quick = {"install"}
    missing = [
        c for c, cpu in MAKE if cpu and c.split()[1] not in quick and c not in MAKE_EXERCISED
    ]
    assert not missing, f"add where these are exercised to MAKE_EXERCISED: {missing}"


def test_make_run_config_composes():
    """``make run`` = ``run.py``'s entry point (the ``mtad-run`` console script) with the defaults:
    the offline pair, SpD, the smoke task."""
    res = subprocess.run(
        ["make", "-n", "-W", "pyproject.toml", "run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and re.search(r"(python run\.py|bin/mtad-run)\s*$", res.stdout, re.M), res.stdout
    cfg = compose_config([])
    assert cfg.model.name in ("qwen_coder_offline", "qwen_coder_offline_avx2") and cfg.task.name == "smoke"


def _jobs(args: list[str]) -> int:
    """Jobs of a Hydra multirun: the product of the comma-separated values."""
    return len(list(itertools.product(*[a.partition("=")[2].split(",") for a in args if "," in a])))


RUNS = [(c, cpu) for c, cpu in COMMANDS if c.startswith(RUN)]


@pytest.mark.parametrize(("command", "cpu"), RUNS, ids=_ids(RUNS))
def test_run_command(command, cpu, tmp_path):
    from mtad.run.evaluate import run

    args = command.split()[2:]
    knobs = [a for a in args if a != "-m"]
    if not cpu:  # GPU / hub: the config composes and names a hub pair on a GPU
        cfg = compose_config(knobs)
        assert cfg.model._target_.endswith("hub_pair") and str(cfg.model.device).startswith("cuda")
        return
    if "+experiment=debug" in knobs:  # fast: the command itself, through run.py
        res = subprocess.run(
            [sys.executable, "run.py", *args, f"hydra.run.dir={tmp_path}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        assert res.returncode == 0, res.stderr[-3000:]
        summaries = [json.loads((tmp_path / "summary.json").read_text())]
    else:  # the command's overrides (each job of a multirun) on the tiny pair, in-process
        swept = [a.partition("=") for a in knobs if "," in a]
        fixed = [a for a in knobs if "," not in a]
        summaries = []
        for i, values in enumerate(itertools.product(*[v.split(",") for _, _, v in swept])):
            job = fixed + [f"{k}={v}" for (k, _, _), v in zip(swept, values)]
            summaries.append(run(compose_config(job + TINY + [f"output_dir={tmp_path / str(i)}"])))
        assert len(summaries) == _jobs(knobs)
    for summary in summaries:
        assert summary["metrics"]["examples"] >= 1 and summary["metrics"]["new_tokens"] >= 1


#: The README is the entrance: what the project is, the two commands, where to read on. Detail
#: belongs in docs/.
README_MAX_CHARS = 10_000


def test_readme_stays_within_its_length():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text) <= README_MAX_CHARS, (
        f"README.md has {len(text):,} characters (at most {README_MAX_CHARS:,}): move detail into docs/")

"""The command line: Hydra's own override syntax, field-named errors, "did you mean", knobs that
belong to decoders, and run.py end to end (refusing another point's folder, multirun folders)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtad.run.cli import CONF_DIR, check_overrides, expand

ROOT = Path(__file__).resolve().parents[2]


def _error(argv, capsys, conf_dir: Path = CONF_DIR) -> str:
    with pytest.raises(SystemExit) as e:
        check_overrides(argv, conf_dir)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5"])
def test_limit_is_checked_like_the_other_fields(value, capsys):
    err = _error(["+experiment=debug", f"limit={value}"], capsys)
    assert "limit must be an integer >= 1 or null" in err and value in err


def test_limit_accepts_positive_and_null():
    check_overrides(["+experiment=debug", "limit=1"])
    check_overrides(["+experiment=debug", "limit=null"])


@pytest.mark.parametrize(
    "argv,message",
    [
        (["task.limit=-1"], "task.limit must be an integer >= 1 or null"),
        (["task.limit=0"], "task.limit must be an integer >= 1 or null"),
        (["task.limit=abc"], "task.limit must be an integer >= 1 or null"),
        (["seed=99999999999999999999"], "seed must be an integer in [0, 9223372036854775807]"),
        (["seed=-1"], "seed must be an integer in [0, "),
        (["decoder=specinfer", "decoder.k_config=[0,-1]"], "decoder.k_config must be a non-empty list of integers >= 1"),
        (["decoder=specinfer", "decoder.k_config=abc"], "decoder.k_config must be a non-empty list of integers >= 1"),
        (["decoder=specinfer", "decoder.k_config=[]"], "decoder.k_config must be a non-empty list"),
        (["decoder=spd", "decoder.gamma=0"], "decoder.gamma must be an integer >= 1"),
        (["decoder=mtad", "decoder.tau=-1"], "decoder.tau must be > 0"),
        (["decoder=tree_mtad", "decoder.width=0"], "decoder.width must be an integer >= 1"),
        (["decoder=mtad", "decoder.replacement=maybe"], "decoder.replacement must be true or false, got 'maybe'"),
        (["decoder=mjgd", "decoder.method=exakt"], "decoder.method must be one of 'exact', 'beam', 'auto', got 'exakt'; did you mean 'exact'?"),
        (["decoder=bild", "decoder.alpha_fb=inf"], "decoder.alpha_fb must be a finite number >= 0"),
        (["task.scorer.timeout=0"], "task.scorer.timeout must be in (0, 86400]"),
        (["model=tiny_random", "model.dtype=float64"], "model.dtype must be one of 'float32', 'bfloat16', 'float16'"),
        (["-m", "decoder=spd", "decoder.gamma=2,0"], "decoder.gamma must be an integer >= 1"),  # every swept value
        (["+experiment=debug", "task.limit=0"], "task.limit must be"),  # an experiment does not hide it
    ],
)
def test_nested_values_are_checked_like_the_top_level_ones(argv, message, capsys):
    err = _error(argv, capsys)
    assert message in err and ("; e.g." in err or "did you mean" in err), err


def test_good_nested_values_pass():
    check_overrides(["decoder=specinfer", "decoder.k_config=[2,1]", "task.limit=null", "seed=9223372036854775807"])
    check_overrides(["decoder=tree_mtad", "decoder.replacement=false", "tau=inf"])
    check_overrides(["decoder=mtad", "decoder.tau=inf"])
    check_overrides(["-m", "decoder=spd", "decoder.gamma=1,auto", "model=tiny_random", "model.dtype=bfloat16"])


def test_the_largest_seed_and_its_per_example_seeds_fit_torch(capsys):
    import torch

    from mtad.run.config import MAX_SEED

    torch.Generator().manual_seed(MAX_SEED + 1000 * 10**6 + 9)  # seed + 1000 * index + turn
    with pytest.raises(ValueError):  # torch's own limit is 2**64 - 1
        torch.Generator().manual_seed(2**64)
    assert f"seed must be an integer in [0, {MAX_SEED}]" in _error([f"seed={MAX_SEED + 1}"], capsys)


@pytest.mark.parametrize("argv", [["gama=4"], ["+gama=4"], ["++gama=4"]])
def test_unknown_top_level_key_did_you_mean(argv, capsys):
    assert "unknown key 'gama'; did you mean 'gamma'?" in _error(argv, capsys)


def test_top_level_adds_are_refused_except_experiment(capsys):
    assert "set it without '+'" in _error(["+gamma=4"], capsys)
    check_overrides(["+experiment=debug"])


def test_nested_unknown_key_did_you_mean(capsys):
    assert "did you mean 'gamma'" in _error(["decoder=spd", "decoder.gama=3"], capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["decoder=choice(spd,mtad)"],
        ["decoder=spd,mtad", "gamma=range(2,5)"],
        ["decoder=glob(tree_*)", "tau=0.3,0.5"],
        ["decoder=spd", "gamma=choice(2,4)", "output_dir='a,b'"],
        ["decoder=spd", "hydra.run.dir=\"x,y\""],
    ],
)
def test_hydra_sweep_syntax_is_accepted(argv):
    check_overrides(["-m", *argv])


def test_unknown_group_option_in_a_sweep_did_you_mean(capsys):
    err = _error(["-m", "decoder=choice(spd,mtda)"], capsys)
    assert "unknown decoder 'mtda'" in err and "'mtad'" in err.split("did you mean")[1]


def test_expansion_matches_hydras_basic_sweeper():
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the reference, tests only
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = ["decoder=spd,mtad", "gamma=range(2,4)", "tau=choice(0.3,0.5)", "seed=1", "decoder=mtad,spd,tree_mtad"]
    reference = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(args), None)[0]
    assert expand(args) == [list(job) for job in reference]
    assert expand(["decoder=glob(spec*)"]) == [["decoder=specinfer"], ["decoder=spectr"]]


def test_a_knob_the_decoder_does_not_use_is_refused(capsys):
    err = _error(["decoder=specinfer", "gamma=6"], capsys)
    assert "specinfer uses k_config, not gamma" in err
    assert "multinomial has no knobs" in _error(["decoder=multinomial", "tau=0.3"], capsys)
    assert "job: decoder=specinfer gamma=3" in _error(["-m", "decoder=spd,specinfer", "gamma=3"], capsys)


def test_defaults_and_used_knobs_pass():
    check_overrides(["decoder=multinomial"])  # gamma/tau/width defaults in conf/config.yaml
    check_overrides(["decoder=specinfer", "+experiment=debug"])
    check_overrides(["decoder=tree_mtad", "gamma=6", "tau=0.3", "width=2"])


def test_a_knob_set_by_an_experiment_file_counts_as_explicit(tmp_path, capsys):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "experiment" / "long_drafts.yaml").write_text("# @package _global_\ngamma: 8\n")
    check_overrides(["+experiment=long_drafts", "decoder=spd"], conf)
    assert "not gamma" in _error(["+experiment=long_drafts", "decoder=specinfer"], capsys, conf)


# ----------------------------------------------------------------------------- run.py


def _run_py(*args: str, unprivileged: bool = False) -> subprocess.CompletedProcess:
    prefix = []
    if unprivileged and os.geteuid() == 0:  # root writes anywhere: drop its capabilities
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: file modes cannot stop a write")
        prefix = ["setpriv", "--inh-caps=-all", "--bounding-set=-all"]
    return subprocess.run([*prefix, sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


TINY_RUN = ["+experiment=debug", "model=tiny_random", "limit=1", "max_new_tokens=2", "perplexity=false", "~task.scorer"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "spd"
    res = _run_py("decoder=spd", *TINY_RUN, f"hydra.run.dir={out}")
    assert res.returncode == 0, res.stderr[-2000:]
    return out


def test_run_py_refuses_a_busy_folder_and_leaves_it_as_it_was(finished_run):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom mtad.run.results import PointFolder\n"
        "with PointFolder(sys.argv[1]).lock():\n    print('locked', flush=True)\n    time.sleep(120)"),
        str(finished_run)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = _files(finished_run)
        # the same point asked for in other words (Hydra would write other overrides.yaml)
        res = _run_py("decoder=spd", *TINY_RUN, "wait_lock=false", f"hydra.run.dir={finished_run}")
        assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith("error: ")
        assert "is being written by another process" in res.stderr
        assert _files(finished_run) == before
    finally:
        holder.kill()
        holder.wait()


def test_run_py_refuses_a_read_only_folder_in_one_line(finished_run, tmp_path):
    folder = tmp_path / "read_only"
    shutil.copytree(finished_run, folder)
    for p in [folder, *folder.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        before = _files(folder)
        res = _run_py("decoder=spd", *TINY_RUN, f"hydra.run.dir={folder}", unprivileged=True)
        assert res.returncode == 2, res.stderr[-2000:]
        assert res.stderr.strip().splitlines() == [res.stderr.strip()] and "Traceback" not in res.stderr
        assert res.stderr.startswith(f"error: {folder} is not writable") and "hydra.run.dir=" in res.stderr
        assert _files(folder) == before
    finally:
        for p in [folder, *folder.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)


def test_run_py_stops_early_on_a_bad_value():
    res = _run_py("+experiment=debug", "limit=abc")
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "error: limit must be an integer >= 1 or null (null: all of the task's examples), got 'abc'; e.g. limit=30"
    ]


def test_run_py_multirun_folders_resume_refuse_and_render(tmp_path):
    """`run.py -m` with Hydra's choice(): every job folder is a results folder that renders; a
    run into a folder holding another point is refused, naming the key, and changes nothing."""
    from mtad.analysis import render
    tiny = ["+experiment=debug", "limit=1", "max_new_tokens=2", "perplexity=false", "~task.scorer"]
    res = _run_py("-m", "decoder=choice(spd,mtad)", *tiny, f"hydra.sweep.dir={tmp_path}")
    assert res.returncode == 0, res.stderr[-2000:]
    df = render.load_points(tmp_path)
    assert sorted(df["decoder"]) == ["mtad", "spd"] and set(df["status"]) == {"done"}
    spd = next(d for d in tmp_path.iterdir() if d.is_dir() and json.loads(
        (d / "point.json").read_text())["choices"]["decoder"] == "spd")
    assert (spd / ".hydra" / "overrides.yaml").is_file() and "spd/smoke" in (spd / "run.log").read_text()
    before = _files(spd)
    res = _run_py("decoder=spd", "gamma=2", *tiny, f"hydra.run.dir={spd}")
    assert res.returncode == 2 and "decoder.gamma: 4 -> 2" in res.stderr and "hydra.run.dir" in res.stderr
    assert _files(spd) == before  # .hydra/ and run.log included
    assert len(list(itertools.chain.from_iterable(
        (d / "samples.jsonl").read_text().splitlines() for d in tmp_path.iterdir() if d.is_dir()))) == 2


@pytest.mark.parametrize("argv,message", [
    (["task=humaneval", "task.scorer.timeout=1e12"], "task.scorer.timeout must be in (0, 86400]"),
    (["task=humaneval", "task.scorer.timeout=inf"], "task.scorer.timeout must be in (0, 86400]"),
    (["task=humaneval", f"task.scorer.memory_mb={2**43}"], "task.scorer.memory_mb must be an integer in [1, 1048576]"),
    (["task=humaneval", "task.scorer.isolation=foo"], "task.scorer.isolation must be one of 'bubblewrap', 'rlimits'"),
    (["task=humaneval", "task.scorer.drop_privileges=maybe"], "task.scorer.drop_privileges must be true or false"),
    (["task=spider", "task.scorer.timeout_s=1e12"], "task.scorer.timeout_s must be in (0, 86400]"),
    (["seed=1,2"], "seed=1,2 is a sweep: add -m"),
])
def test_scorer_settings_and_sweeps_without_m_are_refused_in_one_line(argv, message, capsys):
    err = _error(["+experiment=debug", *argv], capsys)
    assert message in err, err


def test_a_run_dir_naming_a_file_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    for run_dir in (tmp_path / "f", tmp_path / "f" / "below"):
        err = _error(["+experiment=debug", f"hydra.run.dir={run_dir}"], capsys)
        assert f"{tmp_path / 'f'} is a file" in err, err


# ----------------------------------------------------------------------------- messages that say what to type


def test_a_field_its_yaml_does_not_write_is_added_with_a_plus(capsys):
    """beam_specinfer's YAML leaves ``replacement`` to its default: Hydra takes it only with a '+',
    and the message says so (not "must be true or false, got '?'"); the line it gives is the one
    that reaches the decoder's own check (here: beam sampling without replacement does not fit)."""
    base = ["+experiment=debug", "decoder=beam_specinfer"]
    err = _error([*base, "decoder.replacement=false"], capsys)
    assert err.strip() == ("error: decoder.replacement: conf/decoder/beam_specinfer.yaml does not write "
                           "replacement (its default, true, applies); add it with a '+': "
                           "+decoder.replacement=false"), err
    assert "needs i.i.d. children" in _error([*base, "+decoder.replacement=false"], capsys)
    err = _error([*base, "decoder.replacement=maybe"], capsys)
    assert "e.g. +decoder.replacement=true (conf/decoder/beam_specinfer.yaml does not write replacement" in err
    check_overrides([*base, "+decoder.replacement=true"])  # the example given passes
    err = _error(["+experiment=debug", "decoder=mtad", "decoder.replacement=maybe"], capsys)
    assert "e.g. decoder.replacement=true" in err  # mtad.yaml writes it: no '+'
    # any checked field its YAML does not write: no '?' for a value Hydra's error does not carry
    err = _error(["+experiment=debug", "model=tiny_random", "model.gpus=1"], capsys)
    assert err.strip() == ("error: model.gpus: the composed config does not write gpus; add it with a '+': "
                           "+model.gpus=..."), err


@pytest.mark.parametrize("argv, message", [
    (["decoder=typical", "eps=0.2"], "error: unknown key 'eps': a field of a decoder, not a top-level key; "
                                     "did you mean decoder.eps=0.2?"),
    (["decoder=specinfer", "k_config=[2,2]"], "did you mean decoder.k_config=[2,2]?"),
])
def test_a_decoder_field_set_at_the_top_level_gets_a_did_you_mean(argv, message, capsys):
    err = _error(["+experiment=debug", *argv], capsys)
    assert message in err, err


def test_a_class_that_fixes_its_pieces_names_that_as_the_reason(capsys):
    """specinfer is tree drafts + SpecInfer's rule by its class: asking it for another verifier is
    refused for that reason (and whether the pair would fit), not by listing its other fields."""
    for override in ("decoder.verifier=threshold", "+decoder.verifier=threshold"):
        err = _error(["+experiment=debug", "decoder=specinfer", override], capsys)
        assert "specinfer's class fixes its pieces (proposer 'tree', verifier 'specinfer')" in err, err
        assert "mtad.decoders.compose.Speculative" in err and "k_config" not in err, err
        assert "verifier 'threshold' needs beam history" in err, err


def test_load_decoder_refuses_in_one_line_and_takes_the_decoders_fields():
    from mtad.run.cli import load_decoder
    from mtad.run.config import ConfigError

    assert load_decoder("typical", eps=0.2).eps == 0.2
    assert load_decoder("typical", **{"decoder.eps": 0.25}).eps == 0.25
    assert load_decoder("beam_specinfer", replacement=True).gamma == 4
    for name, knobs, message in [
        ("typical", {"epss": 0.2}, "load_decoder('typical'): unknown knob 'epss'; did you mean 'eps'?"),
        ("typical", {"eps": 2}, "decoder.eps must be in (0, 1], got 2"),
        ("typicl", {}, "unknown decoder 'typicl' (no conf/decoder/typicl.yaml; did you mean 'typical'?)"),
        ("spd", {"gama": 3}, "did you mean 'gamma'?"),
        ("specinfer", {"verifier": "threshold"}, "specinfer's class fixes its pieces"),
    ]:
        with pytest.raises(ConfigError) as e:
            load_decoder(name, **knobs)
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)

"""Stored configs are data: a results folder naming code outside the project's classes is
refused, in one line naming the folder and the path, before anything it names runs.

Each reader that turns a stored config into objects or looks a class up by its stored path
gets the payload of a results folder whose config names ``shutil.copyfile`` (or a project
module's re-export of ``os``) with arguments that copy a file; the copy must never appear.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtad.run.results import rewrite_jsonl, write_json_atomic
from mtad.run.results.targets import UntrustedConfig, stored_object, trusted_config

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "pyproject.toml"  # any readable file


def _payloads(dest: Path) -> dict[str, dict]:
    """Stored task configs that would copy ``SOURCE`` to ``dest`` if instantiated."""
    copy = {"_target_": "shutil.copyfile", "_args_": [str(SOURCE), str(dest)]}
    spider = {"_target_": "mtad.tasks.spider.SpiderTask", "name": "spider", "limit": 1,
              "scorer": {"_target_": "eval.spider_exec.SpiderExecutionScorer"}}
    return {
        "task": {**copy, "scorer": None},  # the reported payload
        "scorer": {**spider, "scorer": copy},
        "nested": {**spider, "data_dir": copy},  # Hydra instantiates nested nodes too
        "in_args": {**spider, "_args_": [copy]},
        "reexport": {"_target_": "mtad.tasks.common.os.system",  # a project module's import of os
                     "_args_": [f"cp {SOURCE} {dest}"], "scorer": None},
        "not_dotted": {"_target_": "mtad.tasks.spider.SpiderTask; import os", "scorer": None},
    }


def _folder(path: Path, task: dict, decoder: str = "mtad.decoders.spd.SpD") -> Path:
    config = {"task": task, "decoder": {"_target_": decoder}, "model": {"name": "tiny_random"},
              "limit": 1, "seed": 0}
    summary = {"decoder": "spd", "task": "spider", "metrics": {"examples": 1}, "config": config,
               "score": {"metric": "spider_exec_acc", "version": "2", "value": 1.0, "n": 1}}
    path.mkdir(parents=True)
    write_json_atomic(path / "config.json", config)
    write_json_atomic(path / "summary.json", summary)
    rewrite_jsonl(path / "samples.jsonl", [{"example_id": "spider-dev-0", "turn": 0, "index": 0,
                                            "text": "SELECT 1", "score": 1.0}])
    return path


LABELS = list(_payloads(Path("x")))


@pytest.mark.parametrize("label", LABELS)
def test_rescore_refuses_a_folder_naming_other_code(tmp_path, label, capsys):
    from mtad.analysis.rescore import main

    dest = tmp_path / "COPIED"
    folder = _folder(tmp_path / "point", _payloads(dest)[label])
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert main([str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert not dest.exists()
    assert len(err.splitlines()) == 1 and str(folder) in err and "refusing" in err, err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # nothing written, no lock


@pytest.mark.parametrize("label", LABELS)
def test_regenerate_refuses_a_folder_naming_other_code(tmp_path, label):
    from mtad.testing import regenerate

    dest = tmp_path / "COPIED"
    folder = _folder(tmp_path / "point", _payloads(dest)[label])
    with pytest.raises(UntrustedConfig, match="refusing"):
        regenerate(folder)
    assert not dest.exists()


def test_readers_refuse_a_folder_naming_other_code(tmp_path, capsys):
    """render, claims and the names both show: refused (render in one line, exit 2), never run."""
    from mtad.analysis import claims, render
    from mtad.analysis.names import decoder_name
    from mtad.run.results import load_point

    dest = tmp_path / "COPIED"
    sweep = tmp_path / "sweep"
    folder = _folder(sweep / "aaa", _payloads(dest)["task"])
    with pytest.raises(UntrustedConfig, match="shutil.copyfile"):
        load_point(folder)
    _, notes = claims.read_records(sweep)
    assert any("not read" in n and "shutil.copyfile" in n for n in notes)
    with pytest.raises(SystemExit) as e:
        _cli(render, [str(sweep), "--all", "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(folder) in err and "shutil.copyfile" in err, err
    # a decoder path is looked up only when a config of conf/decoder/ names it: others are
    # shown by their module's name, never imported
    import sys

    sys.modules.pop("this", None)
    for target in ("this.X", "shutil.copyfile", "mtad.decoders.compose.Beam"):
        assert decoder_name({}, {"decoder": {"_target_": target}}) in ("this.X", "shutil.copyfile", "compose")
    assert "this" not in sys.modules
    assert decoder_name({}, {"decoder": {"_target_": "mtad.decoders.tree_mtad.TreeMTAD"}}) == "tree_mtad"
    assert not dest.exists()


def _cli(module, argv):
    import sys

    old = sys.argv
    sys.argv = ["prog", *argv]
    try:
        module.cli()
    finally:
        sys.argv = old


def test_the_project_classes_and_moved_paths_are_allowed():
    config = {"decoder": {"_target_": "mtad.decoders.tree_mtad.TreeMTAD"},
              "task": {"_target_": "mtad.tasks.humaneval.HumanEvalTask",
                       "scorer": {"_target_": "eval.humaneval_pass.HumanEvalPassScorer"}},
              "model": {"_target_": "mtad.models.pair.tiny_pair"},
              "logger": {"_target_": "mtad.tracking.NullLogger"}}  # moved: read at its new place
    out = trusted_config(config, "here", resolve=True)
    assert out["logger"]["_target_"] == "mtad.run.tracking.NullLogger"
    assert stored_object("mtad.decoders.spd.SpD", "decoder").__name__ == "SpD"
    with pytest.raises(UntrustedConfig, match="task.scorer"):
        trusted_config({"task": {"scorer": {"_target_": "mtad.decoders.spd.SpD"}}}, "here")
    with pytest.raises(UntrustedConfig, match="a place where no class is built"):
        trusted_config({"sweep": {"_target_": "mtad.decoders.spd.SpD"}}, "here")


def test_every_committed_config_is_allowed():
    paths = sorted(ROOT.glob("results/**/config.json")) + sorted(ROOT.glob("tests/fixtures/**/config.json"))
    assert paths
    for path in paths:
        trusted_config(json.loads(path.read_text()), path, resolve=True)


def test_a_sweep_point_naming_other_code_is_not_run(tmp_path):
    """A launcher job composes its points from its sweep folder's ``sweep.json`` overrides: a
    point whose config names code outside the project is a problem, never run."""
    from mtad.run.sweep.plan import load

    sweep = load(ROOT / "experiments" / "scoring_spd.yaml", ["task._target_=shutil.copyfile"],
                 root=tmp_path)
    assert sweep.points and all(p.hash is None and "shutil.copyfile" in p.problem for p in sweep.points)


def test_a_plain_temperature_folder_naming_other_code_has_no_identity(tmp_path):
    """A stored config at plain temperature makes the identity read its decoder's proposer
    (``draw_version``): the folder's targets are checked first, so a path outside the project is
    refused without an import, and a project module's re-export names no class."""
    import sys

    from mtad.run.results.folder import PointFolder

    sys.modules.pop("this", None)
    for i, target in enumerate(("this.X", "mtad.decoders.compose.os.system", "shutil.copyfile")):
        folder = _folder(tmp_path / f"p{i}", {"_target_": "mtad.tasks.spider.SpiderTask", "name": "spider"},
                         decoder=target)
        config = json.loads((folder / "config.json").read_text())
        config.update(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=8)
        write_json_atomic(folder / "config.json", config)
        summary = json.loads((folder / "summary.json").read_text())
        write_json_atomic(folder / "summary.json", {**summary, "config": config})
        assert PointFolder(folder).stored() == (None, None)
    assert "this" not in sys.modules
    good = _folder(tmp_path / "good", {"_target_": "mtad.tasks.spider.SpiderTask", "name": "spider"},
                   decoder="mtad.decoders.tree_mtad.TreeMTAD")
    config = {**json.loads((good / "config.json").read_text()), "temperature": 1.0, "top_k": 0, "top_p": 1.0,
              "max_new_tokens": 8, "decoder": {"_target_": "mtad.decoders.tree_mtad.TreeMTAD", "gamma": 4,
                                               "width": 4, "tau": 0.5, "replacement": True}}
    write_json_atomic(good / "config.json", config)
    stored, kind = PointFolder(good).stored()
    assert kind == "legacy" and stored["draw_version"] == "2+slot_then_row"


def test_a_plain_temperature_folder_naming_odd_pieces_gets_no_extra_identity(tmp_path):
    """``draw_version`` reads the stored proposer's and verifier's names too: a name that is not a
    registered piece (unknown, a list, a mapping, a dotted path) adds nothing, imports nothing and
    raises nothing; a registered verifier adds its declared name."""
    import sys

    from mtad.run.results.folder import PointFolder

    sys.modules.pop("this", None)
    task = {"_target_": "mtad.tasks.spider.SpiderTask", "name": "spider"}
    cases = [("chains", "this.X", "2"), (["beam"], {"spectr": 1}, "2"), ("shutil.copyfile", "spectr", "2+spectr_rho_select"),
             ("beam", "specinfer", "2+slot_then_row")]
    for i, (proposer, verifier, want) in enumerate(cases):
        folder = _folder(tmp_path / f"p{i}", task, decoder="mtad.decoders.compose.Speculative")
        config = {**json.loads((folder / "config.json").read_text()), "temperature": 1.0, "top_k": 0,
                  "top_p": 1.0, "max_new_tokens": 8,
                  "decoder": {"_target_": "mtad.decoders.compose.Speculative", "proposer": proposer,
                              "verifier": verifier, "gamma": 4}}
        write_json_atomic(folder / "config.json", config)
        summary = json.loads((folder / "summary.json").read_text())
        write_json_atomic(folder / "summary.json", {**summary, "config": config})
        stored, _ = PointFolder(folder).stored()
        assert stored is not None and stored["draw_version"] == want, (proposer, verifier)
    assert "this" not in sys.modules

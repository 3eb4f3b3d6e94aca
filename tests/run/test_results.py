"""The results store: identity (what changes the tokens and nothing else), atomic files and torn
lines, refusing another point's folder, one writer per folder, resuming and extending runs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from mtad.run.cli import compose_config
from mtad.run.results import (
    FolderBusy,
    IdentityMismatch,
    PointFolder,
    append_jsonl,
    identity,
    identity_hash,
    scan_jsonl,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = ["+experiment=debug", "limit=2", "max_new_tokens=4", "perplexity=false"]
UNSCORED = "~task.scorer"  # faster runs where the score does not matter


def full_record(**fields) -> dict:
    """A ``samples.jsonl`` record with every field of ``RECORD_FIELDS`` (placeholder values)."""
    from mtad.run.results import RECORD_FIELDS

    return {**{k: [] if types[0] is list else types[0]() for k, types in RECORD_FIELDS.items()}, **fields}


def _cfg(*overrides: str):
    return compose_config([*TINY, *overrides])


def _hash(*overrides: str) -> str:
    return identity_hash(identity(_cfg(*overrides)))


def _hashes(variants: list[list[str]]) -> list[str]:
    """Identity hashes of several configs, composed under one Hydra initialization."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return [identity_hash(identity(compose("config", overrides=[*TINY, *v]))) for v in variants]


# ----------------------------------------------------------------------------- identity


def test_identity_holds_what_changes_the_tokens():
    changed = ["gamma=3", "tau=0.7", "width=2", "model.dtype=bfloat16", "model.hidden_size=16",
               "temperature=0.5", "top_k=5", "top_p=0.5", "seed=1", "max_new_tokens=5",
               "task.max_prompt_tokens=64", "decoder.replacement=false"]
    same = ["limit=1", "task.limit=3", "warmup=2", "perplexity=true", "resume=false", "logger=wandb",
            "output_dir=/elsewhere", "task.scorer.timeout=9.0", "temperature=1"]
    base, *hashes = _hashes([["decoder=mtad"]] + [["decoder=mtad", o] for o in changed + same])
    assert {o for o, h in zip(changed + same, hashes) if h == base} == set(same)


def test_a_knob_its_decoder_does_not_use_is_not_identity():
    assert _hash("decoder=multinomial", "gamma=6") == _hash("decoder=multinomial", "gamma=4")
    assert _hash("decoder=specinfer", "gamma=6") == _hash("decoder=specinfer")
    assert _hash("decoder=spd", "gamma=6") != _hash("decoder=spd")


def test_the_decoder_version_is_identity():
    cfg = _cfg("decoder=bild")
    assert identity(cfg)["decoder_version"] == "2"
    assert identity_hash(identity(cfg, version="1")) != identity_hash(identity(cfg))


# ----------------------------------------------------------------------------- files


def test_a_torn_last_line_is_found_and_never_appended_to(tmp_path):
    path = tmp_path / "samples.jsonl"
    append_jsonl(path, {"example_id": "a", "turn": 0})
    path.write_text(path.read_text() + '{"example_id": "b", "turn": 0}')  # parses, but no newline
    scan = scan_jsonl(path)
    assert scan.torn_tail and scan.bad_lines == [2] and len(scan.records) == 1
    with pytest.raises(ValueError, match="torn"):
        append_jsonl(path, {"example_id": "c", "turn": 0})


def test_self_check_repairs_torn_glued_and_duplicate_lines(tmp_path, caplog):
    folder = PointFolder(tmp_path)
    r = [json.dumps(full_record(example_id=f"e{i}", turn=0, index=i)) for i in range(4)]
    # line 2: a record torn by a kill with the next record glued on (the old append did that)
    (tmp_path / "samples.jsonl").write_text(f"{r[0]}\n{r[1][:20]}{r[2]}\n{r[0]}\n{r[3]}\n{r[3][:10]}")
    with caplog.at_level(logging.WARNING):
        check = folder.check(repair=True)
    assert [x["example_id"] for x in check.records] == ["e0", "e3"]
    assert check.duplicates == 1 and check.torn_tail and 2 in check.bad_lines
    assert "repaired" in caplog.text and len(caplog.records) == 1
    assert folder.check().clean and len(scan_jsonl(tmp_path / "samples.jsonl").records) == 2


def test_self_check_drops_lines_that_are_not_records(tmp_path, caplog):
    lines = [full_record(example_id="e0"), {"example_id": "e1", "turn": 0},  # parses, no fields
             full_record(example_id="e2", turn="0"), full_record(example_id="e1")]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    with caplog.at_level(logging.WARNING):
        check = PointFolder(tmp_path).check(repair=True)
    assert [r["example_id"] for r in check.records] == ["e0", "e1"] and not check.clean
    assert sorted(check.incomplete) == [2, 3] and "text" in check.incomplete[2]
    assert len(caplog.records) == 1 and "incomplete records (line 2: no " in caplog.text
    assert PointFolder(tmp_path).check().clean


# ----------------------------------------------------------------------------- folders


def _resolved(cfg) -> dict:
    from omegaconf import OmegaConf

    # output_dir reads ${hydra:...}, which needs a Hydra run
    return OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "output_dir"]), resolve=True)


@pytest.mark.parametrize("garbage", ["not json", "[1, 2]", "{}", '{"format": 2}', '{"hash": 3, "identity": {}}',
                                     '{"format": 9, "identity": {}, "identity_hash": "x"}'])
@pytest.mark.parametrize("with_config", [False, True])
def test_a_point_file_that_is_not_one_is_refused(tmp_path, garbage, with_config):
    cfg = _cfg("decoder=spd")
    (tmp_path / "point.json").write_text(garbage)
    if with_config:  # what an old-format folder holds besides point.json
        (tmp_path / "config.json").write_text(json.dumps(_resolved(cfg)))
    with pytest.raises(IdentityMismatch, match=r"point\.json is not a point file.*choose another folder") as e:
        PointFolder(tmp_path).claim(identity(cfg))
    assert len(str(e.value).splitlines()) == 1
    assert (tmp_path / "point.json").read_text() == garbage
    assert PointFolder(tmp_path).identity_hash() is None  # a store scan passes over it




def test_a_folder_holding_another_point_is_refused_with_the_differing_keys(tmp_path):
    folder = PointFolder(tmp_path)
    folder.claim(identity(_cfg("decoder=spd", "gamma=4")))
    with pytest.raises(IdentityMismatch, match=r"decoder\.gamma: 4 -> 2.*hydra\.run\.dir"):
        folder.claim(identity(_cfg("decoder=spd", "gamma=2")))
    with pytest.raises(IdentityMismatch, match="decoder_version"):
        folder.claim(identity(_cfg("decoder=spd", "gamma=4"), version="7"))
    folder.claim(identity(_cfg("decoder=spd", "gamma=4", "limit=1")))  # same point: accepted


def test_records_without_metadata_are_refused(tmp_path):
    (tmp_path / "samples.jsonl").write_text('{"example_id": "e", "turn": 0, "index": 0}\n')
    with pytest.raises(IdentityMismatch, match="no point.json"):
        PointFolder(tmp_path).claim(identity(_cfg()))


_HOLD = """
import sys, time
from mtad.run.results import PointFolder
from pathlib import Path
with PointFolder(sys.argv[1]).lock():
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    (Path(sys.argv[1]) / "released").write_text("")  # the last thing done while holding the lock
"""


def _holder(path: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path), str(seconds)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_one_writer_per_folder_and_a_dead_holder_leaves_no_lock(tmp_path):
    folder = PointFolder(tmp_path)
    proc = _holder(tmp_path, 60)
    with pytest.raises(FolderBusy, match="another process.*wait_lock=true"):
        with folder.lock():
            pass
    proc.kill()  # SIGKILL: no cleanup runs, the kernel drops the lock
    proc.wait()
    with folder.lock():
        with folder.lock(wait=True):  # re-entrant within the process
            pass


def test_wait_takes_the_lock_when_the_holder_finishes(tmp_path):
    proc = _holder(tmp_path, 1.0)
    with PointFolder(tmp_path).lock(wait=True):
        assert (tmp_path / "released").exists()  # taken only after the holder let go
    proc.wait()


# ----------------------------------------------------------------------------- runs


def _records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines()]


@pytest.fixture
def counted(monkeypatch):
    import mtad.core.engine

    calls: list[int] = []
    real = mtad.core.engine.Engine.generate
    monkeypatch.setattr(mtad.core.engine.Engine, "generate", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    return calls


def test_a_run_extends_to_more_examples_and_summarizes_the_requested_ones(tmp_path, counted):
    from mtad.run.evaluate import run

    out = tmp_path / "run"
    assert run(_cfg("decoder=spd", "limit=1", UNSCORED), out)["metrics"]["examples"] == 1
    assert run(_cfg("decoder=spd", "limit=2", UNSCORED), out)["metrics"]["examples"] == 2
    assert len(counted) == 2  # the second run generated only the new example
    summary = run(_cfg("decoder=spd", "limit=1", UNSCORED), out)
    assert summary["metrics"]["examples"] == 1 and len(counted) == 2 and len(_records(out)) == 2
    assert PointFolder(out).finished(_hash("decoder=spd"), 1)


def test_a_torn_line_is_recomputed_on_unfinished_and_finished_points(tmp_path, counted):
    from mtad.run.evaluate import run

    out = tmp_path / "run"
    run(_cfg("decoder=spd", UNSCORED), out)
    full = _records(out)
    h = _hash("decoder=spd")
    text = (out / "samples.jsonl").read_text()
    torn = text[: len(text) - len(text.splitlines()[-1]) // 2 - 1]  # the last line cut in half

    (out / "samples.jsonl").write_text(torn)  # finished point: summary still counts 2 records
    assert not PointFolder(out).finished(h, 2)
    (out / "summary.json").unlink()  # unfinished point
    (out / "samples.jsonl").write_text(torn)
    counted.clear()
    summary = run(_cfg("decoder=spd", UNSCORED), out)
    assert len(counted) == 1 and summary["metrics"]["examples"] == 2
    again = _records(out)
    assert [r["output_ids"] for r in again] == [r["output_ids"] for r in full]
    assert PointFolder(out).finished(h, 2)


def test_a_record_line_without_its_fields_is_recomputed(tmp_path, counted, caplog):
    """A line that parses but is no record (e.g. a hand-edited or foreign line) is dropped with
    the torn-line warning and its example generated again, on finished and unfinished points."""
    from mtad.run.evaluate import run
    from mtad.run.results import record_problem

    out = tmp_path / "run"
    run(_cfg("decoder=spd", UNSCORED), out)
    full = _records(out)
    assert all(record_problem(r) is None for r in full)  # what the writer writes is a record
    h = _hash("decoder=spd")
    stub = json.dumps({"example_id": full[1]["example_id"], "turn": 0})
    (out / "samples.jsonl").write_text(json.dumps(full[0]) + "\n" + stub + "\n")
    assert not PointFolder(out).finished(h, 2)
    counted.clear()
    with caplog.at_level(logging.WARNING, logger="mtad.run.results"):
        summary = run(_cfg("decoder=spd", UNSCORED), out)
    assert len(counted) == 1 and summary["metrics"]["examples"] == 2
    assert [r["output_ids"] for r in _records(out)] == [r["output_ids"] for r in full]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("repaired") and "line 2: no " in warnings[0]
    assert PointFolder(out).finished(h, 2)


def test_scored_records_carry_their_scorer(tmp_path):
    from hydra.utils import instantiate

    from mtad.run.evaluate import run

    cfg = _cfg("decoder=multinomial", "limit=1")
    scorer = instantiate(cfg.task.scorer)
    run(cfg, tmp_path)
    (record,) = _records(tmp_path)
    assert (record["scorer"], record["scorer_version"]) == (scorer.name, scorer.version)
    assert record["score"] is not None


def test_resume_false_sets_the_old_records_aside(tmp_path, counted):
    from mtad.run.evaluate import run

    run(_cfg("decoder=spd", "limit=1", UNSCORED), tmp_path)
    first = _records(tmp_path)
    run(_cfg("decoder=spd", "limit=1", "resume=false", UNSCORED), tmp_path)
    (aside,) = tmp_path.glob("samples.replaced-*.jsonl")
    assert _records(tmp_path)[0]["output_ids"] == first[0]["output_ids"]  # same seed, same tokens
    assert [json.loads(x) for x in aside.read_text().splitlines()] == first and len(counted) == 2


def test_shown_path_is_never_absolute(tmp_path, monkeypatch):
    from mtad.core.io import REPO_ROOT
    from mtad.run.results import shown_path

    monkeypatch.chdir(tmp_path)
    assert shown_path(tmp_path / "a" / "b.json") == "a/b.json"  # under the working directory
    # a file of the checkout the code runs from (e.g. a frozen worktree), seen from elsewhere
    assert shown_path(REPO_ROOT / "experiments" / "claims.yaml") == "experiments/claims.yaml"
    assert shown_path("/somewhere/else/x.yaml") == "x.yaml"


def test_reasons_carry_no_machine_paths(tmp_path):
    """skipped.json / error.json are committed: this checkout's path and the home folder are
    written as ``.`` and ``~``."""
    import json
    from pathlib import Path

    from mtad.core.io import REPO_ROOT
    from mtad.run.results.folder import PointFolder

    folder = PointFolder(tmp_path / "p")
    folder.path.mkdir(parents=True)
    folder.write_reason("skipped.json", "abc", f"none at {REPO_ROOT}/data/x.json or {Path.home()}/.cache/x")
    reason = json.loads((folder.path / "skipped.json").read_text())["reason"]
    assert reason == "none at ./data/x.json or ~/.cache/x"


# ----------------------------------------------------------------------------- moved class paths
def _committed_configs() -> list[Path]:
    return sorted((ROOT / "results").glob("**/config.json"))


def test_moved_class_paths_are_read_at_their_new_place():
    """A stored config names the class paths of when it was written (the loggers were
    ``mtad.tracking.*``); ``migrate`` gives each moved ``_target_`` its new path, which imports."""
    from hydra.utils import get_class, instantiate

    from mtad.run.results.identity import MOVED_TARGETS, migrate
    from mtad.run.tracking import NullLogger, WandbLogger

    assert MOVED_TARGETS["mtad.tracking.NullLogger"] == "mtad.run.tracking.NullLogger"
    assert MOVED_TARGETS["mtad.tracking.WandbLogger"] == "mtad.run.tracking.WandbLogger"
    for new in MOVED_TARGETS.values():
        assert get_class(new) in (NullLogger, WandbLogger)
    stored = {"logger": {"_target_": "mtad.tracking.NullLogger"}, "decoder": {"_target_": "x.Y", "k": [1]},
              "task": {"stop": ["\n"], "scorer": {"_target_": "eval.a.B"}}, "seed": 42}
    migrated = migrate(stored)
    assert migrated["logger"] == {"_target_": "mtad.run.tracking.NullLogger"}
    assert {k: v for k, v in migrated.items() if k != "logger"} == {k: v for k, v in stored.items() if k != "logger"}
    assert stored["logger"]["_target_"] == "mtad.tracking.NullLogger"  # a copy: the stored one unchanged
    assert isinstance(instantiate(migrated["logger"]), NullLogger)


def test_no_identity_path_moves():
    """Decoders, models and tasks did not move: their ``_target_`` is part of committed identities."""
    from mtad.run.results.identity import MOVED_TARGETS

    for old in MOVED_TARGETS:
        assert not old.startswith(("mtad.decoders.", "mtad.models.", "mtad.tasks.", "eval.")), old


def test_committed_configs_load_and_keep_their_identity():
    """Every committed ``config.json`` instantiates its logger at its new place once migrated,
    with the same identity hash as stored, and readers (``load_point``) see the new paths."""
    from hydra.utils import instantiate

    from mtad.run.results import LEGACY_DECODER_VERSION, load_point
    from mtad.run.results.identity import MOVED_TARGETS, migrate

    configs = _committed_configs()
    assert configs, "no committed config.json"
    old_paths = 0
    for path in configs:
        stored = json.loads(path.read_text())
        migrated = migrate(stored)
        old_paths += (stored.get("logger") or {}).get("_target_") in MOVED_TARGETS
        point = json.loads((path.parent / "point.json").read_text())
        version = point["identity"]["decoder_version"] if point.get("format") else LEGACY_DECODER_VERSION
        assert identity_hash(identity(migrated, version)) == identity_hash(identity(stored, version)), path
        if migrated.get("logger"):
            instantiate(migrated["logger"])
        text = json.dumps(load_point(path.parent)["config"])
        assert not any(f'"{old}"' in text for old in MOVED_TARGETS), path
    assert old_paths, "no committed config names a moved path: the migration is untested"


@pytest.fixture
def checks(monkeypatch):
    """Counts of config checks (``validate`` as ``mtad.run.evaluate`` calls it) and identity reads
    (every ``identity()`` of the current format reads its decoder's version once)."""
    import importlib

    import mtad.run.evaluate

    ident_module = importlib.import_module("mtad.run.results.identity")  # the package's `identity` is the function
    calls = {"validate": 0, "identity": 0}

    def counting(name, real):
        def wrapper(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        return wrapper

    monkeypatch.setattr(mtad.run.evaluate, "validate", counting("validate", mtad.run.evaluate.validate))
    monkeypatch.setattr(ident_module, "decoder_version", counting("identity", ident_module.decoder_version))
    return calls


def test_a_run_checks_its_config_and_reads_its_identity_once(tmp_path, checks):
    from mtad.run.evaluate import check, run
    from mtad.run.sweep import run_point

    cfg = _cfg("decoder=spd", "limit=1", UNSCORED)
    run(cfg, tmp_path / "run")
    assert checks == {"validate": 1, "identity": 1}
    checks.update(validate=0, identity=0)
    assert run_point(cfg, PointFolder(tmp_path / "point")) == "done"  # a sweep's point
    assert checks == {"validate": 1, "identity": 1}
    point = check(cfg)  # a caller that claimed the folder passes its check down
    checks.update(validate=0, identity=0)
    run(point, tmp_path / "again")
    assert checks == {"validate": 0, "identity": 0}
    assert point.hash == _hash("decoder=spd")

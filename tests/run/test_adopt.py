"""The stop set is part of a point's identity; points stored under another stop set are adopted
when no record would end earlier (mtad/run/sweep/adopt.py), else regenerated apart."""

from __future__ import annotations

import json
from pathlib import Path

from mtad.run import sweep as sw
from mtad.run.results import CACHED, DONE, PointFolder, identity, identity_hash
from mtad.run.results.identity import without_stop
from mtad.run.sweep.adopt import ADOPTED, CURRENT, REGENERATE, adopt
from mtad.run.sweep.cli import dry_run

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "experiments" / "table2.yaml"  # with its smoke profile (results/sweeps/table2_smoke)


def load_smoke(overrides=(), **kw) -> sw.Sweep:
    return sw.load(SMOKE, overrides, profile="smoke", **kw)

GRID = ["decoder=multinomial,spd", "limit=2", "max_new_tokens=12", "warmup=0", "perplexity=false"]


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_the_stop_set_is_identity_and_an_empty_one_is_left_out():
    s = load_smoke(["decoder=spd"])
    cfg = s.points[0].cfg
    ident = identity(cfg)
    assert ident["task"]["stop"] == ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]
    none = load_smoke(["decoder=spd", "task.stop=[]"]).points[0].cfg
    eos = load_smoke(["decoder=spd", "+model.eos_token_ids=[1]"]).points[0].cfg
    hashes = {identity_hash(identity(c)) for c in (cfg, none, eos)}
    assert len(hashes) == 3
    assert "stop" not in identity(none)["task"] and identity(eos)["model"]["eos_token_ids"] == [1]
    assert without_stop(identity(none)) == without_stop(ident) == without_stop(identity(eos))
    qwen = sw.load(ROOT / "experiments" / "claims.yaml", ["task=cnn_dailymail", "decoder=spd"]).points[0].cfg
    assert identity(qwen)["model"]["eos_token_ids"] == [151643, 151645] and "stop" not in identity(qwen)["task"]


def test_records_no_new_stop_would_cut_are_adopted_and_equal_a_fresh_run(tmp_path, monkeypatch):
    old = load_smoke([*GRID, "task.stop=[]"], root=tmp_path)
    sw.run(old, progress=False)
    before = {p.hash: _files(tmp_path / old.name / p.hash) for p in old.points}

    # a stop set that occurs in no record: every point is adopted, nothing is generated again
    new = load_smoke([*GRID, "task.stop=[never]"], root=tmp_path)
    assert {p.hash for p in new.points}.isdisjoint(before)
    assert [o.status for o in adopt(new, check=True)] == [ADOPTED] * 2
    assert {h: _files(tmp_path / old.name / h) for h in before} == before  # --check writes nothing
    outcomes = adopt(new)
    assert [o.status for o in outcomes] == [ADOPTED, ADOPTED]
    for o, p in zip(outcomes, old.points):
        folder = tmp_path / old.name / p.hash  # adopted in place, under its old name
        point = json.loads((folder / "point.json").read_text())
        assert point["identity_hash"] == o.point.hash and point["adopted"]["from_hash"] == p.hash
        assert point["adopted"]["stop"] == {"eos_token_ids": [], "stop": ["never"]}
        assert (folder / "samples.jsonl").read_bytes() == before[p.hash]["samples.jsonl"]
        assert PointFolder(folder).finished(o.point.hash, o.point.limit)
    assert [o.status for o in adopt(load_smoke([*GRID, "task.stop=[never]"], root=tmp_path))] == [CURRENT] * 2

    import tests.run.test_sweep as ts

    generated = ts.count_generations(monkeypatch)
    report = sw.run(load_smoke([*GRID, "task.stop=[never]"], root=tmp_path), progress=False)
    assert set(report.statuses.values()) == {CACHED} and not generated
    # what the new code writes from scratch is what was adopted
    fresh = load_smoke([*GRID, "task.stop=[never]"], root=tmp_path / "fresh")
    sw.run(fresh, progress=False)
    for p, o in zip(old.points, outcomes):
        got = [(r["output_ids"], r["emitted_per_step"], r["stop_reason"]) for r in _records(tmp_path / old.name / p.hash)]
        want = [(r["output_ids"], r["emitted_per_step"], r["stop_reason"])
                for r in _records(tmp_path / "fresh" / old.name / o.point.hash)]
        assert got == want


def test_a_point_the_new_stop_set_cuts_is_regenerated_apart(tmp_path, capsys):
    old = load_smoke([*GRID, "task.stop=[]"], root=tmp_path)
    sw.run(old, progress=False)
    spd = old.points[1]
    ids = _records(tmp_path / old.name / spd.hash)[1]["output_ids"]
    before = _files(tmp_path / old.name / spd.hash)
    for extra in ([f"task.stop=['t{ids[3]} t{ids[4]}']"], ["task.stop=[]", f"+model.eos_token_ids=[{ids[5]}]"]):
        new = load_smoke([*GRID, *extra], root=tmp_path)
        outcome = adopt(new)[1]
        assert outcome.status == REGENERATE and outcome.old_hash == spd.hash
        assert any(c.startswith("HumanEval/1/0: ") for c in outcome.cut)
        assert _files(tmp_path / old.name / spd.hash) == before
        dry_run(new, 10.0, 1.0)
        line = next(ln for ln in capsys.readouterr().out.splitlines() if new.points[1].hash in ln)
        assert "pending" in line
    report = sw.run(new, progress=False)
    assert report.statuses[new.points[1].label] == DONE
    regenerated = _records(tmp_path / old.name / new.points[1].hash)[1]
    assert regenerated["stop_reason"] == "eos" and regenerated["output_ids"] == ids[: ids.index(ids[5]) + 1]

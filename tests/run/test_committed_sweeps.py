"""The sweep files still plan the committed points where they are.

For every sweep file (``experiments/*.yaml`` with a ``sweep:`` block), with and without each of
its profiles, and so for every claims stage (``experiments/claims_stages.yaml``): the plan
(``mtad.run.sweep.load``, what ``--dry-run`` prints) finds each point that has committed records
under ``results/`` in the committed folder that holds it, never as a new pending point, and a
committed index (``<root>/<name>/sweep.json``) lists the same points (identities unchanged) with
its finished points still done. A sweep file, a profile or a shared default
that changed what a point composes to would break this: the records would no longer be found.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from mtad.run import sweep as sw
from mtad.run.results import (
    CACHED,
    DONE,
    ERROR_FILE,
    INDEX_FILE,
    PENDING,
    SKIPPED_FILE,
    SUMMARY_FILE,
    Catalog,
    read_json,
)

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
STAGES_FILE = EXPERIMENTS / "claims_stages.yaml"


def sweep_files() -> list[Path]:
    return sorted(p for p in EXPERIMENTS.glob("*.yaml") if "sweep" in OmegaConf.load(p))


def runs() -> list[tuple[Path, str | None]]:
    """(sweep file, profile): every file without a profile and with each of its profiles."""
    out = []
    for path in sweep_files():
        profiles = (OmegaConf.load(path).sweep.get("profiles") or {}).keys()
        out += [(path, None), *((path, str(p)) for p in profiles)]
    return out


RUNS = runs()


def _declared(path: Path, profile: str | None) -> tuple[str, Path]:
    """(name, root) a (file, profile) writes to, read from the file alone (no composition)."""
    meta = OmegaConf.load(path).sweep
    name = str(meta.get("name") or path.stem) + (f"_{profile}" if profile else "")
    return name, Path(meta.get("root") or "results/sweeps")


def _has_records(folder) -> bool:
    return any(folder.file(f).exists() for f in (SUMMARY_FILE, SKIPPED_FILE, ERROR_FILE)) or bool(
        folder.check().records)


def test_every_committed_index_has_its_sweep_file_and_profile():
    """Each committed sweep (results/**/sweep.json) is written by one (file, profile) of
    experiments/: the same name under the same root (Table 2's profiles keep table2_cpu and
    table2_smoke)."""
    declared = {(root / name).as_posix() for name, root in (_declared(p, pr) for p, pr in RUNS)}
    committed = {index.parent.relative_to(ROOT).as_posix()
                 for index in (ROOT / "results").glob("**/" + INDEX_FILE)}
    assert committed, "no committed sweep index"
    assert committed <= declared, f"committed sweeps no (file, profile) writes: {committed - declared}"


def test_the_claims_stages_are_sweep_files_in_order():
    """The stages make reproduce-claims runs: sweep files under results/claims, each extending
    only points of stages before it; every committed claims sweep is a stage."""
    stages = yaml.safe_load(STAGES_FILE.read_text())["stages"]
    assert stages and len(set(stages)) == len(stages)
    for stage in stages:
        meta = OmegaConf.load(EXPERIMENTS / f"{stage}.yaml").sweep
        assert meta.name == stage and meta.root == "results/claims", stage
    committed = {d.name for d in (ROOT / "results" / "claims").iterdir() if (d / INDEX_FILE).exists()}
    assert committed <= set(stages)
    assert stages.index("claims") < stages.index("claims_spider")  # claims_spider extends claims' Spider points
    assert stages.index("claims_tree") < stages.index("claims_specinfer")  # ... claims_specinfer claims_tree's


def test_every_profile_composes():
    """Every profile of every sweep file composes its points (Table 2 included: smoke, cpu)."""
    for path, profile in RUNS:
        if profile is None:
            continue
        s = sw.load(path, root="/nonexistent", profile=profile)
        assert s.name.endswith(f"_{profile}") and s.known(), (path.name, profile)


@pytest.mark.slow  # composes every point of every sweep (Table 2's paper grid: 192): about a minute
@pytest.mark.parametrize("path,profile", RUNS, ids=[f"{p.stem}-{pr or 'default'}" for p, pr in RUNS])
def test_committed_points_are_planned_where_they_are(path, profile, monkeypatch):
    monkeypatch.chdir(ROOT)  # sweep roots and search folders are relative to the checkout
    s = sw.load(path.relative_to(ROOT), profile=profile)
    assert (s.name, s.root) == _declared(path, profile)
    store = s.store()
    catalog = Catalog([Path("results")])
    planned = {}
    for p in s.known():
        folder = s.folder(p, store)
        planned[p.hash] = (folder.status(p.hash, p.limit)[0], folder.path.resolve())
        held = [f for f in catalog.folders(p.hash) if _has_records(f)]
        if held:  # committed records of this point: found where they are
            assert planned[p.hash][0] != PENDING, (p.label, [str(f.path) for f in held])
            assert planned[p.hash][1] in {f.path.resolve() for f in held}, p.label
    index = read_json(s.dir / INDEX_FILE)
    if index is None:
        return
    listed = {q["hash"]: q for q in index["points"] if q.get("hash")}
    assert set(listed) == set(planned), "the committed index lists other points (identities changed?)"
    for h, q in listed.items():
        if q.get("status") in (DONE, CACHED):  # still done: in the folder the index names, or in
            # one that a later sweep extended the point into (more records; claims_spider's Spider)
            status, where = planned[h]
            assert status == DONE, (q["overrides"], status)
            assert where in {f.path.resolve() for f in catalog.folders(h)}, q["overrides"]

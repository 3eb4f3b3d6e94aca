"""The record schema (mtad.core.records) matches what its producer, the engine, makes."""

from __future__ import annotations

import pytest

from mtad.core.engine import Engine
from mtad.core.records import (
    ENGINE_FIELDS,
    OPTIONAL_FIELDS,
    RECORD_FIELDS,
    record_problem,
    value_ok,
)
from mtad.core.warping import Warping
from mtad.decoders.spd import SpD


@pytest.mark.parametrize("gamma", [2, "auto"])
def test_the_engine_makes_exactly_its_fields_with_their_types(toy_pair, gamma, monkeypatch, tmp_path):
    monkeypatch.setenv("MTAD_COST_PRIOR", str(tmp_path / "none.json"))  # no prior file: the default
    target, draft = toy_pair
    rec = Engine(target, draft, SpD(gamma=gamma), Warping(1.0)).generate([2, 3], 12, seed=0).to_record()
    optional = {"shape_per_step"} if gamma == "auto" else set()
    assert set(rec) == set(ENGINE_FIELDS) | optional
    assert optional <= set(OPTIONAL_FIELDS)
    bad = [k for k, v in rec.items() if not value_ok(v, {**ENGINE_FIELDS, **OPTIONAL_FIELDS}[k])]
    assert not bad, f"engine fields outside their schema: {bad}"
    # with the runner's fields it is a whole record
    whole = {"example_id": "e", "turn": 0, "index": 0, "text": "", "energy_j": None,
             "tokens_per_s": 1.0, **rec}
    assert set(RECORD_FIELDS) <= set(whole) and record_problem(whole) is None
    assert record_problem({k: v for k, v in whole.items() if k != "steps"}) == "no steps"


def test_the_schema_is_importable_where_it_was():
    import mtad.run.results as results
    import mtad.run.results.folder as folder

    assert results.RECORD_FIELDS is folder.RECORD_FIELDS is RECORD_FIELDS
    assert folder.OPTIONAL_FIELDS is OPTIONAL_FIELDS and folder.record_problem is record_problem

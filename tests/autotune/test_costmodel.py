"""The cost model's maths (hand computations), shape choice on synthetic costs, survival
estimation, and gamma=auto / width=auto end to end on tiny models (SpD stays lossless)."""

import json
import math

import pytest

from mtad.autotune.autoshape import AutoShape, check_shape_knob
from mtad.autotune.costmodel import (
    AcceptanceModel,
    CostModel,
    DepthCounts,
    PassTime,
    choose_shape,
    expected_tokens,
    expected_tokens_iid,
    file_sha,
    fit_overhead,
    load_prior,
    predict,
    save_prior,
)
from mtad.core.engine import Engine
from mtad.core.warping import Warping
from mtad.decoders.mtad import MTAD
from mtad.decoders.spd import SpD
from mtad.decoders.tree_mtad import TreeMTAD
from mtad.testing import chi_square_gof, exact_joint, sample_sequences


def test_pass_time_interpolates_extrapolates_and_is_monotone():
    t = PassTime([1, 4], [1.0, 1.3])
    assert t(1) == 1.0 and t(0.5) == 1.0
    assert t(3) == pytest.approx(1.2)
    assert t(6) == pytest.approx(1.5)  # last segment's slope, 0.1 per row
    fitted = PassTime.fit({1: [1.0, 1.2, 1.1], 2: [0.9], 3: [1.4]})  # medians 1.1, 0.9, 1.4
    assert fitted.seconds == pytest.approx([1.0, 1.0, 1.4])  # pooled: never cheaper with more rows
    gpu = PassTime([1, 64, 256], [0.02, 0.02, 0.05])  # flat until it saturates
    assert gpu(32) == pytest.approx(0.02) and gpu(160) == pytest.approx(0.035)


def test_expected_tokens_iid_matches_hand_and_survival_form():
    assert expected_tokens_iid(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens_iid(1.0, 3) == 4.0
    for a in (0.1, 0.6, 0.95):
        for g in (1, 4, 8):
            assert expected_tokens([a**d for d in range(1, g + 1)]) == pytest.approx(expected_tokens_iid(a, g))


def test_step_time_and_tokens_per_s_by_hand():
    cost = CostModel(PassTime([1, 4], [1.0, 1.3]), PassTime([1, 3], [0.1, 0.3]),
                     overhead={"spd": (0.05, 0.01), "tree_mtad": (0.0, 0.0)})
    # SpD(2): 2 draft passes of 1 row + a target pass of 3 rows + 0.05 + 0.01 * 2
    assert cost.step_time("spd", 2) == pytest.approx(2 * 0.1 + 1.2 + 0.07)
    # MTAD(W=2, g=3): draft root + 2 passes of 2 rows; target 4 rows
    assert cost.step_time("mtad", 3, 2) == pytest.approx(0.1 + 2 * 0.2 + 1.3)
    # tree-MTAD(W=2, g=3): target over 2 * 3 tree nodes + the endpoint row = 7 rows
    assert cost.step_time("tree_mtad", 3, 2) == pytest.approx(0.1 + 2 * 0.2 + 1.6)
    acc = AcceptanceModel(prior_hazard=0.5, width_strength=1e9, depth_strength=1e9)  # pure prior
    assert predict(cost, acc, "spd", 2) == pytest.approx(1.75 / 1.47)
    cost.node_fraction["tree_mtad"] = 0.5  # duplicate slots: 3 distinct nodes
    assert cost.step_time("tree_mtad", 3, 2) == pytest.approx(0.1 + 2 * 0.2 + 1.3)


def test_choose_shape_picks_the_obvious_optimum():
    flat = PassTime([1, 64], [1.0, 1.0])  # a GPU-like target: extra rows are free
    free_draft = PassTime([1, 64], [1e-6, 1e-6])
    high = AcceptanceModel(prior_hazard=0.95, width_strength=1e9, depth_strength=1e9)
    assert choose_shape(CostModel(flat, free_draft), high, "spd")[:2] == (8, 1)
    steep = PassTime.linear(1.0, 1.0)  # each extra row costs a whole pass
    low = AcceptanceModel(prior_hazard=0.3, width_strength=1e9, depth_strength=1e9)
    assert choose_shape(CostModel(steep, PassTime.linear(0.5, 0.0)), low, "spd")[:2] == (1, 1)
    # tree: more candidates raise the per-depth hazard and cost nothing on a flat target
    wide = AcceptanceModel(prior_hazard=0.5, width_strength=1e9, depth_strength=1e9, rho=0.5)
    g, w, v = choose_shape(CostModel(flat, free_draft), wide, "tree_mtad")
    assert (g, w) == (8, 8) and v == pytest.approx(predict(CostModel(flat, free_draft), wide, "tree_mtad", 8, 8))
    # ...but on a steep target the wide tree loses to a narrow one
    assert choose_shape(CostModel(PassTime.linear(1.0, 0.5), free_draft), wide, "tree_mtad")[1] < 8


def test_survival_counts_censoring_and_shrinkage():
    c = DepthCounts()
    c.add(4, 4)
    c.add(4, 1)
    c.add(2, 0)
    assert c.at_risk == [3, 2, 1, 1] and c.passed == [2, 1, 1, 1]
    assert c.rates() == [2 / 3, 0.5, 1.0, 1.0]
    m = AcceptanceModel(width_strength=1e-12, depth_strength=1e-12)
    for g, a in ((4, 4), (4, 1), (2, 0)):
        m.observe(1, g, a)
    assert m.survival(1, 4) == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])
    assert m.pooled(1) == pytest.approx(5 / 7)  # SpD's alpha: passed / at risk over all depths
    assert m.hazard(1, 6) == pytest.approx(5 / 7)  # an unobserved depth: the pooled rate
    # with pseudo-counts: (passed + k * prior) / (at_risk + k), depth level shrunk to pooled
    s = AcceptanceModel(prior_hazard=0.5, width_strength=2.0, depth_strength=1.0)
    s.observe(1, 1, 1)
    pooled = (1 + 2 * 0.5) / (1 + 2)
    assert s.pooled(1) == pytest.approx(pooled)
    assert s.hazard(1, 1) == pytest.approx((1 + pooled) / 2)


def test_unobserved_width_prior_links_widths():
    m = AcceptanceModel(prior_hazard=0.5, width_strength=1e-12, depth_strength=1e-12, rho=0.5)
    for _ in range(10):
        m.observe(2, 1, 1)
        m.observe(2, 1, 0)  # width 2: hazard 0.5
    assert m.pooled(8) == pytest.approx(1 - 0.5 ** 2)  # (8 / 2) ** 0.5 = 2 effective tries
    assert m.pooled(1) == pytest.approx(1 - 0.5 ** (0.5 ** 0.5))
    chain = AcceptanceModel(rho=0.0)
    assert chain.pooled(8) == pytest.approx(chain.pooled(1))


def test_fit_overhead_and_prior_round_trip(tmp_path):
    assert fit_overhead([(1, 0.012), (3, 0.016), (5, 0.020)]) == pytest.approx((0.010, 0.002))
    assert fit_overhead([(4, 0.01), (4, 0.03)]) == pytest.approx((0.02, 0.0))
    path = tmp_path / "prior.json"
    assert file_sha(path) is None and load_prior(path, "m", "t", "d") is None
    cost = CostModel(PassTime([1, 2], [0.1, 0.2]), PassTime([1], [0.01]), {"spd": (0.001, 0.0)})
    save_prior(path, {"machine": "m", "target": "t", "draft": "d", **cost.to_dict()})
    save_prior(path, {"machine": "m2", "target": "t", "draft": "d", **cost.to_dict()})
    save_prior(path, {"machine": "m", "target": "t", "draft": "d", **cost.to_dict(), "note": 1})
    assert len(json.loads(path.read_text())["entries"]) == 2
    e = load_prior(path, "m", "t", "d")
    assert e["note"] == 1 and CostModel.from_dict(e).to_dict() == cost.to_dict()
    assert load_prior(path, "other", "t", "d") is None and len(file_sha(path)) == 12


def test_shape_knob_accepts_auto_only():
    assert check_shape_knob("gamma", "auto") == "auto" and check_shape_knob("gamma", 3) == 3
    for bad in ("Auto", "4", 0, True, 2.0):
        with pytest.raises(ValueError, match="gamma must be an integer >= 1 or 'auto'"):
            check_shape_knob("gamma", bad)
    with pytest.raises(ValueError, match="width"):
        MTAD(width="wide")


def _no_prior(monkeypatch, tmp_path):
    monkeypatch.setenv("MTAD_COST_PRIOR", str(tmp_path / "none.json"))


def test_spd_auto_records_shapes_and_learns(toy_pair, monkeypatch, tmp_path):
    _no_prior(monkeypatch, tmp_path)
    target, draft = toy_pair
    dec = SpD(gamma="auto")
    res = Engine(target, draft, dec, Warping(1.0)).generate([2, 3], 24, seed=0)
    shapes = [s.shape for s in res.steps]
    assert all(s is not None and s["width"] == 1 and 1 <= s["gamma"] <= 8 for s in shapes[:-1])
    assert shapes[0]["prior"] == "default"
    rec = res.to_record()
    assert rec["shape_per_step"][0]["gamma"] == shapes[0]["gamma"]
    assert all(d <= s["gamma"] for d, s in zip(rec["drafted_per_step"], shapes) if s)
    assert dec._auto.acceptance.observations(1) == sum(1 for d in rec["drafted_per_step"] if d > 0)
    assert "shape_per_step" not in Engine(target, draft, SpD(2), Warping(1.0)).generate([2, 3], 4).to_record()


def test_tree_mtad_auto_explores_every_width(toy_pair, monkeypatch, tmp_path):
    _no_prior(monkeypatch, tmp_path)
    target, draft = toy_pair
    dec = TreeMTAD(gamma="auto", width="auto", tau=0.5)
    dec._auto.explore_every = 2
    res = Engine(target, draft, dec, Warping(1.0)).generate([2, 3], 40, seed=1)
    used = {s.shape["width"] for s in res.steps if s.shape}
    assert used == {1, 2, 4, 8}  # every other step tries the least-observed width
    assert any(s.shape["explore"] for s in res.steps if s.shape)
    fixed_w = MTAD(gamma="auto", width=2)
    res = Engine(target, draft, fixed_w, Warping(1.0)).generate([2, 3], 12, seed=1)
    assert {s.shape["width"] for s in res.steps if s.shape} == {2}


def test_auto_loads_a_matching_prior(toy_pair, monkeypatch, tmp_path):
    from mtad.autotune.autoshape import machine_id, model_key

    target, draft = toy_pair
    path = tmp_path / "prior.json"
    flat = CostModel(PassTime([1, 64], [0.01, 0.01]), PassTime([1, 64], [1e-5, 1e-5]))
    counts = {"1": {"at_risk": [100, 95], "passed": [95, 90]}}
    save_prior(path, {"machine": machine_id("cpu"), "target": model_key(target), "draft": model_key(draft),
                      **flat.to_dict(), "acceptance": {"spd": counts}})
    monkeypatch.setenv("MTAD_COST_PRIOR", str(path))
    dec = SpD(gamma="auto")
    res = Engine(target, draft, dec, Warping(1.0)).generate([2, 3], 3, seed=0)
    first = res.steps[0].shape
    assert first["prior"] == "file" and first["gamma"] == 8  # free draft, flat target, alpha ~ 0.95
    # the saved counts are a prior worth prior_steps observations, not 100
    assert dec._auto.acceptance.observations(1) == pytest.approx(8 + 1)


def test_spd_auto_is_lossless(toy_pair, monkeypatch, tmp_path):
    """Chi-square of whole sequences vs the exact warped target joint, with the shape
    changing between steps (the controller keeps learning across the seeded runs)."""
    _no_prior(monkeypatch, tmp_path)
    target, draft = toy_pair
    warping = Warping(0.8, top_k=4, top_p=0.9)
    dec = SpD(gamma="auto")
    dec._auto.gammas = (1, 2, 3)
    joint = exact_joint(target, [2, 3], 4, warping)
    seen = set()
    orig = dec._auto.choose

    def spy(ctx):
        shape = orig(ctx)
        seen.add(shape[0])
        return shape

    dec._auto.choose = spy
    counts = sample_sequences(Engine(target, draft, dec, warping), [2, 3], 4, 1500, seed0=7)
    _, pval, dof = chi_square_gof(counts, joint)
    assert dof >= 10 and pval > 1e-4, f"SpD gamma=auto differs from the target joint (p={pval:.2e})"
    assert len(seen) > 1, f"the test needs the shape to vary; auto always chose {seen}"


def test_config_accepts_auto_and_names_the_rule():
    from mtad.run.cli import compose_config, load_decoder
    from mtad.run.config import ConfigError, validate
    from mtad.run.results.identity import identity

    cfg = compose_config(["decoder=tree_mtad", "gamma=auto", "width=auto", "model=tiny_random"],
                         drop=("logger",))
    validate(cfg)
    assert "cost_prior" in identity(cfg)
    assert "cost_prior" not in identity(compose_config(["model=tiny_random"], drop=("logger",)))
    with pytest.raises(ConfigError, match="gamma must be an integer >= 1 or 'auto'"):
        validate(compose_config(["gamma=fast"], drop=("task", "logger")))
    with pytest.raises(ConfigError, match="width must be an integer >= 1 or 'auto'"):
        validate(compose_config(["decoder=mtad", "width=0"], drop=("task", "logger")))
    assert load_decoder("spd", gamma="auto").gamma == "auto"
    assert math.isfinite(AutoShape("spd").acceptance.pooled(1))

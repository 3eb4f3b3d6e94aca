"""The draw scheme in a point's identity: ``draw_version`` only where draws are made by inverse
CDF (temperature > 0 without top-k, the default there), so every point of the exponential race
(greedy, top-k: every committed sweep's; ``draws=race``) keeps the identity it had."""

from __future__ import annotations

import pytest

from mtad.run.cli import compose_config
from mtad.run.config import validate
from mtad.run.evaluate import warping_of
from mtad.run.results import identity, identity_hash
from mtad.run.results.identity import DRAW_VERSION

TINY = ["+experiment=debug", "limit=2", "max_new_tokens=4", "perplexity=false", "decoder=specinfer"]


def _ident(*overrides: str) -> dict:
    return identity(compose_config([*TINY, *overrides]))


def test_only_inverse_cdf_points_carry_a_draw_version():
    assert "draw_version" not in _ident()  # T 1, top-k 10, top-p 0.9
    assert "draw_version" not in _ident("temperature=0", "top_k=0", "top_p=1.0")
    assert "draw_version" not in _ident("top_p=1.0")
    assert _ident("top_k=0", "top_p=1.0")["draw_version"] == DRAW_VERSION  # plain temperature
    assert _ident("top_k=0")["draw_version"] == DRAW_VERSION  # top-p alone
    assert _ident("top_k=10", "+draws=inverse_cdf")["draw_version"] == DRAW_VERSION


def test_a_race_point_at_plain_temperature_keeps_its_old_identity():
    plain = _ident("top_k=0", "top_p=1.0")
    race = _ident("top_k=0", "top_p=1.0", "+draws=race")
    old = {k: v for k, v in plain.items() if k != "draw_version"}  # what it was before the scheme
    assert identity_hash(race) == identity_hash(old) != identity_hash(plain)


def test_the_run_draws_with_the_named_scheme():
    cfg = compose_config([*TINY, "top_k=0", "+draws=race"])
    validate(cfg)
    assert warping_of(cfg).scheme == "race"
    assert warping_of(compose_config([*TINY, "top_k=0"])).scheme == "inverse_cdf"


def test_an_unknown_scheme_is_refused_in_one_line():
    with pytest.raises(ValueError, match="draws must be one of race, inverse_cdf"):
        _ident("+draws=gumbel")
    with pytest.raises(ValueError, match="draws must be one of race, inverse_cdf"):
        warping_of(compose_config([*TINY, "+draws=gumbel"]))


def test_beam_sampling_names_its_own_draws_in_exactly_the_points_they_draw():
    """Beam sampling with replacement draws a slot, then a token of its row, under the inverse
    CDF (``mtad.propose.beam.Beam.cdf_draws``): its points there carry that name; its race points,
    its points without replacement and every other decoder's keep the identity they had."""
    beam = f"{DRAW_VERSION}+slot_then_row"
    for decoder in ("tree_mtad", "mtad", "beam_specinfer"):
        assert _ident(f"decoder={decoder}", "top_k=0", "top_p=1.0")["draw_version"] == beam
        assert _ident(f"decoder={decoder}", "top_k=0")["draw_version"] == beam  # top-p alone
        assert "draw_version" not in _ident(f"decoder={decoder}")  # top-k: the race, as committed
        assert "draw_version" not in _ident(f"decoder={decoder}", "top_k=0", "+draws=race")
    assert _ident("decoder=tree_mtad", "top_k=0", "decoder.replacement=false")["draw_version"] == DRAW_VERSION
    for decoder in ("spd", "specinfer", "mcss", "multinomial"):
        assert _ident(f"decoder={decoder}", "top_k=0", "top_p=1.0")["draw_version"] == DRAW_VERSION


def test_spectr_names_its_rho_by_selection_in_exactly_its_inverse_cdf_points():
    """SpecTr's walk finds rho by selection where the draws are made by inverse CDF
    (``MultiDraft.cdf_draws``); its race points keep the identity (and the stream) they had."""
    own = f"{DRAW_VERSION}+spectr_rho_select"
    assert _ident("decoder=spectr", "top_k=0", "top_p=1.0")["draw_version"] == own
    assert _ident("decoder=spectr", "top_k=0")["draw_version"] == own  # top-p alone
    assert "draw_version" not in _ident("decoder=spectr")  # top-k: the race, as committed
    assert "draw_version" not in _ident("decoder=spectr", "top_k=0", "+draws=race")

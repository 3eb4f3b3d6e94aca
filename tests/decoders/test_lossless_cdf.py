"""The lossless decoders drawn by inverse CDF (the default at plain temperature and top-p alone)
still reproduce the warped target joint over whole sequences (the chi-square test of
``test_lossless.py``), and the known-lossy control is still rejected under that scheme."""

import pytest
from test_lossless import ALPHA, LongestOfKSpD, _decoder, _pvalue

from mtad.core.warping import INVERSE_CDF, Warping

WARPINGS = {"T1": Warping(1.0), "T0.9-p0.8": Warping(0.9, top_p=0.8)}
DECODERS = ["spd", "specinfer", "mcss", "spectr"]
MORE = ["beam_specinfer", "multinomial", "mcns"]


def _check(toy_pair, name, warping):
    w = WARPINGS[warping]
    assert w.scheme == INVERSE_CDF
    pval = _pvalue(toy_pair, _decoder(name), w, 1500)
    assert pval > ALPHA, f"{name} at {warping} (inverse CDF): output differs from the warped target (p={pval:.2e})"


#: the default suite's cases: each warping once (SpD, SpecInfer); the rest are slow (each case is
#: some 15-30 s of one core; every decoder's default lossless test is test_lossless.py's)
DEFAULT = {("spd", "T1"), ("specinfer", "T0.9-p0.8")}


@pytest.mark.parametrize("name, warping", [
    pytest.param(n, w, marks=[] if (n, w) in DEFAULT else [pytest.mark.slow], id=f"{n}-{w}")
    for n in DECODERS for w in WARPINGS])
def test_inverse_cdf_draws_are_lossless(toy_pair, name, warping):
    _check(toy_pair, name, warping)


@pytest.mark.slow
@pytest.mark.parametrize("warping", list(WARPINGS))
@pytest.mark.parametrize("name", MORE)
def test_inverse_cdf_draws_are_lossless_more(toy_pair, name, warping):
    _check(toy_pair, name, warping)


def test_the_lossy_control_is_rejected_under_inverse_cdf(toy_pair):
    """``test_lossless.py``'s fast control warping (where 1,500 sequences have the power; at plain
    temperature it takes the slow test's 8,000), drawn by inverse CDF."""
    w = Warping(0.8, top_k=4, top_p=0.9, draws=INVERSE_CDF)
    assert _pvalue(toy_pair, LongestOfKSpD(), w, 1500) < ALPHA


@pytest.mark.parametrize("name", ["spectr", "specinfer", "mcss"])  # (about 4 s each)
def test_the_staged_walk_is_lossless(toy_pair, name, monkeypatch):
    """The walk's tensor rules taken stage by stage under the inverse CDF (``multidraft._lazy_pick``;
    SpecTr's first candidate accepted without rho where ``certify_first`` shows it), forced on the
    toy pair (every row drawn on its support, no list rules): still the warped target joint."""
    import mtad.core.sampling
    from mtad.verify import multidraft as md

    monkeypatch.setattr(mtad.core.sampling, "DENSE_MAX", 0)
    monkeypatch.setattr(md, "_FAST_MAX", -1)
    seen = {"staged": 0, "certified": 0}
    pick, cert = md._lazy_pick, md._SpectrStages.certify_first

    def counted_pick(*a):
        seen["staged"] += 1
        return pick(*a)

    def counted_cert(self, t):
        ok = cert(self, t)
        seen["certified"] += ok
        return ok

    monkeypatch.setattr(md, "_lazy_pick", counted_pick)
    monkeypatch.setattr(md._SpectrStages, "certify_first", counted_cert)
    _check(toy_pair, name, "T1")
    assert seen["staged"] > 0 and (name != "spectr" or seen["certified"] > 0), seen

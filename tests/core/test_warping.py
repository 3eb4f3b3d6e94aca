"""The shared warping: temperature, top-k, top-p (Hugging Face semantics), greedy at T=0."""

import pytest
import torch

from mtad.core.warping import Warping, warp_probs


def _reference(logits, temperature, top_k, top_p):
    """Plain reference: mask with full sorts, as Hugging Face's TopK/TopP warpers do."""
    x = logits.double() / temperature
    if top_k:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1:
        s, i = torch.sort(x, dim=-1)
        cum = s.softmax(-1).cumsum(-1)
        rm = cum <= 1 - top_p
        rm[..., -1] = False
        x = x.masked_fill(rm.scatter(-1, i, rm), float("-inf"))
    return x.softmax(-1)


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (10, 1.0), (0, 0.9), (10, 0.9), (3, 0.5), (50, 0.95)])
@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_matches_reference(top_k, top_p, temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 300, generator=g, dtype=torch.float64) * 3
    out = warp_probs(logits, temperature, top_k, top_p)
    torch.testing.assert_close(out, _reference(logits, temperature, top_k, top_p), atol=1e-12, rtol=0)
    assert torch.allclose(out.sum(-1), torch.ones(7, dtype=out.dtype))


def test_ties_at_the_kth_logit_keep_all_tied_tokens():
    # bfloat16-like logits: coarse values, so ties at the k-th place happen
    logits = torch.tensor([[5.0, 4.0, 3.0, 3.0, 3.0, 1.0, 0.0]])
    out = warp_probs(logits, 1.0, 3, 1.0)
    assert int((out > 0).sum()) == 5  # the three tied at 3.0 are all kept, as in Hugging Face
    torch.testing.assert_close(out.double(), _reference(logits, 1.0, 3, 1.0), atol=1e-7, rtol=0)


@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.6])
def test_bfloat16_ties_take_the_fast_path_and_match_the_reference(top_p, monkeypatch):
    # coarse logits (bfloat16 rounding of a large vocabulary) tie at the k-th place in many rows;
    # the fast path keeps every tied token without sorting the vocabulary
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(64, 5000, generator=g) * 2 + 8).to(torch.bfloat16).float()
    kth = torch.topk(logits, 10, dim=-1).values[:, -1:]
    assert int(((logits >= kth).sum(-1) > 10).sum()) > 5  # the case under test occurs
    ref = _reference(logits, 1.0, 10, top_p)

    def no_full_sort(*a, **k):
        raise AssertionError("the warping sorted the whole vocabulary")

    with monkeypatch.context() as m:
        m.setattr(torch, "sort", no_full_sort)
        out = warp_probs(logits, 1.0, 10, top_p)
    # rows where equal logits straddle the top-p cut are order-dependent in any implementation
    # (Hugging Face's unstable sort too): compare the others
    s = torch.sort(logits.double(), dim=-1, descending=True).values[:, :40]
    tied_cut = torch.zeros(64, dtype=torch.bool)
    if top_p < 1:
        kept = (ref > 0).sum(-1)
        tied_cut = s.gather(1, (kept - 1)[:, None]).squeeze(1) == s.gather(1, kept[:, None]).squeeze(1)
    ok = ~tied_cut
    assert int(ok.sum()) > 30
    torch.testing.assert_close(out.double()[ok], ref[ok], atol=1e-6, rtol=0)


def test_temperature_zero_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, 2.0, -1.0]])
    out = warp_probs(logits, 0.0, 2, 0.5)
    assert out.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_most_likely_token_always_kept():
    logits = torch.tensor([[10.0, 0.0, 0.0]])
    out = warp_probs(logits, 1.0, 0, 0.01)
    assert out[0, 0] == 1.0


@pytest.mark.parametrize("kwargs,field", [({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"),
                                          ({"top_p": 1.2}, "top_p"), ({"top_k": -1}, "top_k")])
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Warping(**kwargs)


def _sort_path_remove(x, top_p):
    s, i = torch.sort(x, dim=-1)
    cum = s.softmax(-1).cumsum(-1)
    rm = cum <= 1 - top_p
    rm[..., -1] = False
    return rm.scatter(-1, i, rm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [0.05, 1.0, 4.0, 12.0])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_nucleus_without_a_sort_keeps_the_sorting_paths_tokens(dtype, scale, top_p, monkeypatch):
    """Top-p alone on the CPU (bucketed, no sort over the vocabulary) keeps exactly the tokens the
    sorting path keeps, from near-uniform rows (most of the vocabulary kept) to peaked ones (a few)."""
    from mtad.core.warping import _nucleus_remove

    g = torch.Generator().manual_seed(int(scale * 100) + int(top_p * 100))
    x = (scale * torch.randn(6, 20000, generator=g, dtype=torch.float64)).to(dtype)
    x[0, :5000] = float("-inf")  # masked entries (as top-k leaves them) count as zero mass
    want = _sort_path_remove(x, top_p)
    real_sort = torch.sort

    def small_sorts_only(t, *a, **k):
        assert t.shape[-1] < 2000, "the nucleus sorted (most of) the vocabulary"
        return real_sort(t, *a, **k)

    monkeypatch.setattr(torch, "sort", small_sorts_only)
    got = _nucleus_remove(x, top_p)
    monkeypatch.undo()
    assert torch.equal(got, want)
    out = warp_probs(x, 1.0, 0, top_p)
    torch.testing.assert_close(out.double(), x.double().masked_fill(want, float("-inf")).softmax(-1),
                               atol=1e-6 if dtype == torch.float32 else 1e-12, rtol=0)


def test_nucleus_ties_at_the_boundary_are_cut_by_token_id():
    """Tied logits straddling the cut: as many kept as the sorting path keeps, the higher ids."""
    from mtad.core.warping import _nucleus_remove

    g = torch.Generator().manual_seed(3)
    x = (3 * torch.randn(8, 30000, generator=g)).to(torch.bfloat16).float()  # coarse: many ties
    got, want = _nucleus_remove(x, 0.9), _sort_path_remove(x, 0.9)
    assert torch.equal(got.sum(-1), want.sum(-1))  # the same number kept in every row
    assert not torch.equal(got, want)  # the case under test occurs: tied tokens chosen otherwise
    for r in range(8):
        diff = torch.nonzero(got[r] != want[r]).flatten()
        assert bool((x[r, diff] == x[r, diff[0]]).all()) if len(diff) else True  # only within a tie
        kept_at_cut = torch.nonzero(~got[r] & (x[r] == x[r, diff[0]])).flatten() if len(diff) else []
        removed_at_cut = torch.nonzero(got[r] & (x[r] == x[r, diff[0]])).flatten() if len(diff) else []
        if len(kept_at_cut) and len(removed_at_cut):
            assert int(removed_at_cut.max()) < int(kept_at_cut.min())  # lower ids removed first


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_top_k_candidates_read_ties_from_the_top_k_plus_one(dtype):
    """The candidates' tie check on the top ``k + 1`` (no count over the rows when they are
    strictly decreasing) gives the ids, values and order of the count over the whole rows:
    rows without ties, ties inside the top-k only, and ties at the k-th logit."""
    from mtad.core import warping as w

    def counted(logits, k, p):  # the check as a count over the whole rows
        vals, idx = torch.topk(logits, k, dim=-1)
        kth = vals[..., -1:]
        c = int((logits >= kth).sum(-1).max())
        if c > k:
            if c > 4 * k + 64:
                return None
            vals, idx = torch.topk(logits, c, dim=-1)
            vals = vals.masked_fill(vals < kth, float("-inf"))
        return w._top_p_of(vals, idx, p)

    gen = torch.Generator().manual_seed(0)
    fast = 0
    for trial in range(600):
        rows, vocab = 1 + trial % 9, 12 + 37 * (trial % 50)
        x = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 3
        if trial % 4 == 0:
            x = (x * 2).round() / 2  # ties everywhere
        x = x.to(dtype).to(torch.float64 if dtype == torch.float64 else torch.float32)
        k, p = 1 + trial % 10, (1.0, 0.9, 0.5)[trial % 3]
        got, want = w._top_k_candidates(x, k, p), counted(x, k, p)
        assert (got is None) == (want is None)
        if got is not None:
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        top = torch.topk(x, k + 1, dim=-1).values
        fast += bool((top[:, :-1] > top[:, 1:]).all())
    assert 100 < fast < 600  # both the strictly decreasing rows and the tied ones were met


def _masked(x, top_p):
    """The bucketed nucleus applied by a mask: what ``_nucleus_logits`` must equal, bit for bit."""
    from mtad.core.warping import _nucleus_remove

    return x.masked_fill(_nucleus_remove(x, top_p), float("-inf"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [0.05, 1.0, 4.0, 12.0])
@pytest.mark.parametrize("ties", [False, True])
def test_nucleus_logits_are_the_masked_logits_bit_for_bit(dtype, scale, ties):
    """``_nucleus_logits`` (a threshold below the band, the band's removals by index) is the
    masked fill of ``_nucleus_remove``'s tokens, as warp_probs took it before: the same tensor."""
    from mtad.core.warping import _nucleus_logits

    g = torch.Generator().manual_seed(int(scale * 10) + 2 * ties + (dtype == torch.float64))
    x = (scale * torch.randn(5, 20000, generator=g, dtype=torch.float64)).to(dtype)
    if ties:
        x = x.to(torch.bfloat16).to(dtype)  # many tied logits, at the cut too
        x[2, 100:] = x[2, 99]  # a row mostly of one value
        x[3] = 0.0
        x[3, 12000:] = -1.0  # two values: the cut falls among the tied maxima, the first of them kept
    for top_p in (1e-9, 0.1, 0.5, 0.9, 0.95, 0.999):
        assert torch.equal(_nucleus_logits(x, top_p), _masked(x, top_p)), top_p


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nucleus_logits_cut_exactly_at_a_buckets_least_value(dtype):
    """Logits placed on every bucket's least value and on the value just below it: whatever the
    first bucket kept, tokens sit on both sides of the threshold (a threshold one value off,
    or a bucket's least value found one step off, fails this), and each found value is the
    least that the tensors' own arithmetic puts in its bucket."""
    import numpy as np

    from mtad.core.warping import _NUCLEUS_BUCKETS, _least_in_bucket, _nucleus_logits

    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 9000, generator=g, dtype=torch.float64).to(dtype)
    dt = np.float32 if dtype == torch.float32 else np.float64
    for r in range(3):
        top, low = x[r].max(), x[r].min()
        scale = (_NUCLEUS_BUCKETS - 1) / (top - low).clamp_min(torch.finfo(dtype).tiny)
        cuts = [_least_in_bucket(k, float(low), float(scale), dtype) for k in range(1, _NUCLEUS_BUCKETS)]
        vals = torch.tensor([[c, float(np.nextafter(dt(c), dt(-np.inf)))] for c in cuts], dtype=dtype)
        buckets = ((vals - low) * scale).clamp_(0, _NUCLEUS_BUCKETS - 1).long()
        assert buckets[:, 0].tolist() == list(range(1, _NUCLEUS_BUCKETS))  # in its bucket ...
        assert buckets[:, 1].tolist() == list(range(0, _NUCLEUS_BUCKETS - 1))  # ... the value below not
        x[r, 1 : 1 + 2 * len(cuts)] = vals.flatten()  # inside (low, top): the extremes stay
    for top_p in (0.3, 0.6, 0.9, 0.97):
        assert torch.equal(_nucleus_logits(x, top_p), _masked(x, top_p)), top_p


def test_top_p_on_a_row_of_equal_logits_keeps_the_highest_ids():
    """A row of equal logits is one bucket (the bucketing's quotient would overflow): top-p keeps
    the tokens the sorting path's count says (4,500 of 4,999), the highest ids (ties cut by id),
    and the most likely token (the first maximum: id 0 when all are equal), instead of failing."""
    x = torch.zeros(2, 4999)  # (0.1 of the mass is not a whole number of tokens: no rounding at the cut)
    x[1, 7] = 1e-40  # all but equal: the quotient overflows too
    out = warp_probs(x, 1.0, 0, 0.9)
    assert int((~_sort_path_remove(x[:1], 0.9)).sum()) == 4500
    assert torch.nonzero(out[0] > 0).flatten().tolist() == [0, *range(499, 4999)]
    assert torch.nonzero(out[1] > 0).flatten().tolist() == [7, *range(500, 4999)]  # its largest, then by id
    assert torch.isclose(out.sum(-1), torch.ones(2)).all()

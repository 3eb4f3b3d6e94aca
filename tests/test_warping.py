"""The shared warping: temperature, top-k, top-p (Hugging Face semantics), greedy at T=0."""

import pytest
import torch

from mtad.warping import Warping, warp_probs


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

"""Typical acceptance's entropy from the warping's candidates equals the dense rows' bit for bit."""

import pytest
import torch

from mtad.core.warping import warp_candidates, warp_probs
from mtad.verify.typical import candidate_entropy, entropy


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("setting", [(1.0, 10, 0.9), (0.7, 4, 1.0), (1.3, 50, 0.5)])
def test_candidate_entropy_is_the_dense_entropy(dtype, setting):
    g = torch.Generator().manual_seed(7)
    logits = (3 * torch.randn(9, 32000, generator=g, dtype=torch.float64)).to(dtype)
    logits[:3] = logits[:3].round()  # ties at the k-th logit
    ids, probs = warp_candidates(logits, *setting)
    got = candidate_entropy(ids, probs, logits.shape[-1])
    want = entropy(warp_probs(logits, *setting))
    assert got.dtype == want.dtype and torch.equal(got, want)

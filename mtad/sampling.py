"""Drawing tokens from warped distributions, on their support only.

After top-k / top-p a warped distribution over the vocabulary (V ~ 152k for the
Qwen pair) has a handful of nonzero entries, yet ``torch.multinomial`` on the dense
vector costs O(V) random numbers per draw. Every draw here goes through
``support``: for a long vector (more than ``DENSE_MAX`` entries) its nonzero entries
(ascending token id) and their masses, one multinomial over those, mapped back to
token ids. The distribution is exactly the dense one's; the random stream is not
(``torch.multinomial`` draws one exponential per entry), so seeded outputs of a
large-vocabulary run differ from a dense draw's, not in distribution. A short vector
(toy vocabularies, compressed verification problems) is drawn densely, exactly as
``torch.multinomial`` on it: that is as cheap, and keeps seeded small-vocabulary
outputs as they were.

This module knows probability vectors and an explicit ``torch.Generator`` (never the
global RNG); nothing about models, trees or acceptance rules. It sits below the
decoders and the drafting / verification maths (``mtad.beam``, ``mtad.multidraft``),
which all import from it.
"""

from __future__ import annotations

import torch

__all__ = ["DENSE_MAX", "draw", "residual", "sample", "support"]

DENSE_MAX = 4096  # vectors up to this length are drawn densely (see the module docstring)


def support(
    probs: torch.Tensor,  # [V] non-negative (negative entries count as 0)
) -> tuple[torch.Tensor, torch.Tensor]:  # ids [n] ascending int64, masses [n] (float32 or wider)
    """The entries a draw chooses among: token ids and their masses.

    Every entry of a vector of at most ``DENSE_MAX`` entries (a dense draw), else only
    the nonzero ones.
    """
    if probs.dtype in (torch.float16, torch.bfloat16):
        probs = probs.float()
    if probs.numel() <= DENSE_MAX:
        return torch.arange(probs.numel(), device=probs.device), probs.clamp_min(0)
    ids = torch.nonzero(probs > 0).flatten()
    return ids, probs[ids]


def draw(
    ids: torch.Tensor,  # [n] token ids
    vals: torch.Tensor,  # [n] their (unnormalised) masses, not all zero
    generator: torch.Generator,
    num: int = 1,
    replacement: bool = False,
) -> torch.Tensor:  # [num] token ids
    """``num`` multinomial draws over a support given by ``support``."""
    return ids[torch.multinomial(vals, num, replacement=replacement, generator=generator)]


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from a probability vector [V] (explicit generator, no global RNG)."""
    ids, vals = support(probs)
    return int(draw(ids, vals, generator)[0])


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); falls back to p when the residual has no mass in floating point."""
    r = (p - q).clamp_min(0)
    s = r.sum()
    return r / s if s > 0 else p

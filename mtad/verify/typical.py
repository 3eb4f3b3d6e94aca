"""Typical acceptance (Cai et al., "Medusa", 2024; from eta-sampling, Hewitt et al., 2022).
Not lossless.

A draft chain is checked against the target with an entropy-dependent threshold instead
of speculative sampling; the rule reads only the target's distributions (any chain
proposer fits; the draft's ``q`` is not used):

    target  one pass (``mtad.verify.score``): p_1..p_(g+1) (warped)
    accept  x_i while p_i(x_i) > min(eps, delta * exp(-H(p_i)))   (longest run from x_1)
    emit    x_1..x_a, then y ~ p_(a+1)   (correction, or bonus when a = g)

``H(p) = -sum p log p`` in nats (0 log 0 = 0). At temperature 0 (one-hot p) the threshold
is min(eps, delta) and only the target's argmax passes: greedy decoding.
"""

from __future__ import annotations

import torch

from mtad.core.decoder import StepContext, StepOutput, sample
from mtad.core.knobs import Knob, Rule
from mtad.core.tree import TokenTree
from mtad.verify.score import chain_tokens, score


def entropy(p: torch.Tensor) -> torch.Tensor:  # [..., V] -> [...]
    return -torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(-1)


def candidate_entropy(
    ids: torch.Tensor,  # [R, c] candidate ids of each row (``mtad.core.warping.warp_candidates``)
    probs: torch.Tensor,  # [R, c] their probabilities (every other entry of a row is 0)
    vocab: int,
) -> torch.Tensor:  # [R], bit for bit ``entropy`` of the dense rows
    """``entropy`` of rows given by their candidates: the dense rows' ``p log p`` terms (the same
    values, 0 off the candidates) in their places, summed as ``entropy`` sums them, without the
    logarithm over the vocabulary."""
    terms = torch.where(probs > 0, probs * probs.log(), torch.zeros_like(probs))
    return -torch.zeros(ids.shape[0], vocab, dtype=probs.dtype).scatter_(-1, ids, terms).sum(-1)


def typical_accept_length(
    draft_tokens: list[int],  # [g]
    p: torch.Tensor,  # [>= g, V] target distributions (row i scores draft_tokens[i])
    eps: float,
    delta: float,
    x: torch.Tensor | None = None,  # [g] the tokens on a device (the target pass's own copy)
) -> int:
    """Longest prefix with p_i(x_i) > min(eps, delta * exp(-H(p_i))) at every position."""
    g = len(draft_tokens)
    if g == 0:
        return 0
    x = x.to(p.device) if x is not None else torch.tensor(draft_tokens, device=p.device)
    return _first_atypical(p[torch.arange(g, device=p.device), x], entropy(p[:g]), eps, delta)


def _first_atypical(px: torch.Tensor, h: torch.Tensor, eps: float, delta: float) -> int:
    """The accepted length: the first i with p_i(x_i) <= min(eps, delta * exp(-H_i)), else g."""
    thresh = torch.clamp(delta * torch.exp(-h), max=eps)  # [g]
    ok = (px > thresh).tolist()  # one transfer
    return next((i for i, v in enumerate(ok) if not v), len(ok))


class TypicalAcceptance:
    """Typical acceptance of a chain tree (rows 1..g)."""

    target_pass = "chain"
    lossless = False
    knobs = (
        Knob("eps", Rule("number", 0, 1, low_open=True, example="0.09"), 0.09),
        Knob("delta", Rule("number", 0, low_open=True, high_open=True, example="0.3"), 0.3),
    )
    needs = ("chain",)

    def __init__(self, eps: float, delta: float):
        self.eps, self.delta = eps, delta

    def verify(self, ctx: StepContext, tree: TokenTree) -> StepOutput:
        tokens = chain_tokens(tree, "typical acceptance")
        g = len(tokens)
        scores = score(ctx, tree)
        x, _ = scores.fed()
        cand = scores.candidates() if g else None
        if cand is not None:  # the CPU with a sparse warping: p by its candidates
            px = scores.masses(torch.arange(g), x)  # [g] on the host
            if ctx.warping.greedy:  # one-hot rows: entropy exactly 0, as the dense rows give
                h = torch.zeros(g, dtype=px.dtype)
            else:
                h = candidate_entropy(cand[0][:g], cand[1][:g], scores.body.shape[-1])
            a = _first_atypical(px, h, self.eps, self.delta)
            y = scores.sample(a, ctx.generator)
        else:
            p = scores.p  # [g+1, V]
            a = typical_accept_length(tokens, p, self.eps, self.delta, x)
            y = sample(p[a], ctx.generator, ctx.warping.support_bound)
        return StepOutput(tokens=tokens[:a] + [y], drafted=g, accepted=a, tree_size=g)

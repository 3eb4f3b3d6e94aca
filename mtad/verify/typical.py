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
from mtad.core.sampling import sizes_first, support_sizes
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
    return _typical_on_rows(draft_tokens, p, eps, delta, x)[0]


def _typical_on_rows(
    draft_tokens: list[int], p: torch.Tensor, eps: float, delta: float, x: torch.Tensor | None,
    sizes: torch.Tensor | None = None,  # [n] support sizes on p's device, read in the same transfer
) -> tuple[int, list[int]]:  # (accepted length, the sizes read)
    x = x.to(p.device) if x is not None else torch.tensor(draft_tokens, device=p.device)
    g = len(draft_tokens)
    return _first_atypical(p[torch.arange(g, device=p.device), x], entropy(p[:g]), eps, delta, sizes)


def _first_atypical(px: torch.Tensor, h: torch.Tensor, eps: float, delta: float,
                    extra: torch.Tensor | None = None) -> tuple[int, list[int]]:
    """The accepted length: the first i with p_i(x_i) <= min(eps, delta * exp(-H_i)), else g;
    with ``extra``'s integer values (support sizes), read in the same transfer."""
    thresh = torch.clamp(delta * torch.exp(-h), max=eps)  # [g]
    ok = px > thresh
    if extra is None:
        flags, read = ok.tolist(), []  # one transfer
    else:
        host = torch.cat([ok.long(), extra.long()]).tolist()  # one transfer
        flags, read = [bool(v) for v in host[: ok.numel()]], host[ok.numel() :]
    return next((i for i, v in enumerate(flags) if not v), len(flags)), read


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
            a = _first_atypical(px, h, self.eps, self.delta)[0]
            y = scores.sample(a, ctx.generator)
        else:
            p = scores.p  # [g+1, V]
            # top-p alone on an accelerator: every row's support size with the flags (one read),
            # so a long final support is drawn on the device without a read of its hint first
            hinted = g and sizes_first(p, ctx.warping.support_hinted)
            a, sizes = _typical_on_rows(tokens, p, self.eps, self.delta, x, support_sizes(p) if hinted else None)
            y = sample(p[a], ctx.generator, ctx.warping.support_bound, sizes[a] if sizes else None)
        return StepOutput(tokens=tokens[:a] + [y], drafted=g, accepted=a, tree_size=g)

"""Verification of one chain: the target pass over it and speculative sampling (SpD).

Speculative sampling (Leviathan et al., ICML 2023; Chen et al., 2023), lossless for a chain
drawn autoregressively from the warped draft (``mtad.propose.chain.Chain``): one target pass
gives p1..p(g+1); accept xi while U <= min(1, pi(xi)/qi(xi)); after the first rejection
emit a correction y ~ norm(max(0, p - q)); if all g were accepted emit a bonus
y ~ p(g+1). At temperature 0 (one-hot p and q) this is exactly greedy decoding.

``target_chain`` (one target pass over the endpoint and a chain) and ``chain_masses`` (a
chain's masses under several distributions, one transfer) serve the other chain rules too
(``mtad.verify.threshold``, ``mtad.verify.typical``, ``mtad.verify.rollback``).

Devices: verification gathers every p_i(x_i), q_i(x_i) on the target's device (indexed with
the target pass's own copy of the tokens, ``mtad.core.runner.fed_tensors``) and crosses
once, draws the uniforms on the host, then crosses once more with the correction's (or
bonus's) support.
"""

from __future__ import annotations

import torch

from mtad.core.decoder import StepContext, StepOutput, residual, sample
from mtad.core.runner import fed_tensors
from mtad.core.tree import TokenTree


def chain_masses(
    draft_tokens: list[int],  # [g]
    *dists: torch.Tensor,  # each [>= g, V]: row i scores draft_tokens[i]
    x: torch.Tensor | None = None,  # [g] the tokens already on a device (a pass's own copy)
) -> list[list[float]]:  # per dist: [g] masses p_i(x_i)
    """Every dist's mass at the chain's tokens, gathered on the first dist's device: one
    transfer (and one host-to-device copy of the tokens unless ``x`` is given)."""
    g = len(draft_tokens)
    if g == 0:
        return [[] for _ in dists]
    dev = dists[0].device
    dtype = dists[0].dtype
    for d in dists[1:]:
        dtype = torch.promote_types(dtype, d.dtype)
    rows = torch.arange(g, device=dev)
    x = x.to(dev) if x is not None else torch.tensor(draft_tokens, dtype=torch.long, device=dev)
    gathered = torch.stack([d.to(dev)[rows, x].to(dtype) for d in dists])  # [len(dists), g]
    return gathered.cpu().tolist()


def verify_chain(
    draft_tokens: list[int],  # [g]
    p: torch.Tensor,  # [g+1, V] warped target distributions (row i scores draft_tokens[i])
    q: torch.Tensor,  # [g, V] warped draft distributions the tokens were drawn from
    generator: torch.Generator,
    bound: int | None = None,  # Warping.support_bound of p and q (a transfer hint)
    x: torch.Tensor | None = None,  # [g] the tokens on a device (the target pass's own copy)
) -> tuple[int, int]:
    """Speculative-sampling verification of one chain: (number accepted, correction/bonus token)."""
    g = len(draft_tokens)
    q = q.to(p.device)
    pxs, qxs = chain_masses(draft_tokens, p, q, x=x)
    for i in range(g):
        px, qx = pxs[i], qxs[i]
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if qx > 0 and u * qx <= px:  # U <= min(1, px / qx) without dividing
            continue
        return i, sample(residual(p[i], q[i]), generator, bound)
    return g, sample(p[g], generator, bound)


def target_chain(ctx: StepContext, tokens: list[int]) -> torch.Tensor:
    """One target pass over the endpoint and a chain; warped p [len(tokens) + 1, V]."""
    logits = ctx.target.forward(tokens, list(range(len(tokens))))  # rows: chain node i+1 under row i
    return ctx.warping(torch.cat([ctx.target.root_logits[None], logits]))


class SpeculativeChain:
    """Speculative sampling of a chain tree (rows 1..g) with its draft rows ``tree.q``."""

    target_pass = "chain"
    lossless = True
    knobs = ()
    needs = ("chain", "chain_q")

    def verify(self, ctx: StepContext, tree: TokenTree) -> StepOutput:
        tokens = tree.tokens[1:]
        g = len(tokens)
        p = target_chain(ctx, tokens)
        x, _ = fed_tensors(ctx.target, tokens, None, p.device)
        n, y = verify_chain(tokens, p, tree.q, ctx.generator, ctx.warping.support_bound, x)
        return StepOutput(tokens=tokens[:n] + [y], drafted=g, accepted=n, tree_size=g)

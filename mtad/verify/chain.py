"""Speculative sampling of one chain (SpD): the rule, on the target pass's output.

Speculative sampling (Leviathan et al., ICML 2023; Chen et al., 2023), lossless for a chain
drawn autoregressively from the warped draft (``mtad.propose.chain.Chain``): one target pass
gives p1..p(g+1); accept xi while U <= min(1, pi(xi)/qi(xi)); after the first rejection
emit a correction y ~ norm(max(0, p - q)); if all g were accepted emit a bonus
y ~ p(g+1). At temperature 0 (one-hot p and q) this is exactly greedy decoding.

The target pass is ``mtad.verify.score.score`` (shared by every verifier); ``verify_chain`` is
the rule, on its output.

Devices: verification gathers every p_i(x_i), q_i(x_i) on the target's device (indexed with
the target pass's own copy of the tokens, ``mtad.core.runner.fed_tensors``) and crosses
once, draws the uniforms on the host, then crosses once more with the correction's (or
bonus's) support (with top-p alone, where that support may be long, the masses' transfer
also brings every candidate final row's support size, and a long one is drawn on the device
instead: ``verify_chain``'s ``hinted``). On the CPU with a sparse warping (a chain drafted with host supports,
``mtad.propose.chain``), the masses and the bonus come from the target's candidates
(``Scores.candidates``) instead of the dense rows; a correction at temperature 0 is p_i itself
(both rows one-hot, x_i not p_i's argmax), otherwise it is computed on the two rows made dense
from the very values the dense path holds: the same draws either way. At plain temperature and
with top-p alone on the CPU the target's rows are warped one at a time up to the first rejection
(``_verify_row_by_row``): the rows after a rejection are not read, and no ``[g+1, V]`` copy of the
logits is made for the whole ``p``.
"""

from __future__ import annotations

import torch

from mtad.core.decoder import StepContext, StepOutput, residual, sample
from mtad.core.sampling import Rows, Support, sizes_first, support_sizes
from mtad.core.tree import TokenTree
from mtad.verify.score import Scores, chain_masses, chain_tokens, score


def verify_chain(
    draft_tokens: list[int],  # [g]
    p: torch.Tensor,  # [g+1, V] warped target distributions (row i scores draft_tokens[i])
    q: torch.Tensor,  # [g, V] warped draft distributions the tokens were drawn from
    generator: torch.Generator,
    bound: int | None = None,  # Warping.support_bound of p and q (a transfer hint)
    x: torch.Tensor | None = None,  # [g] the tokens on a device (the target pass's own copy)
    hinted: bool = False,  # Warping.support_hinted: read the final rows' support sizes first
) -> tuple[int, int]:
    """Speculative-sampling verification of one chain: (number accepted, correction/bonus token).

    With ``hinted`` on an accelerator (top-p alone, where a nucleus may run far past the
    hint), every row the final draw may come from (each position's residual, the bonus row)
    has its support size read with the masses, and a long one is drawn on the device at once
    (``sample``'s ``size``): two reads, where reading the drawn row's hint first made three."""
    g = len(draft_tokens)
    if isinstance(q, Rows):  # host supports (mtad.propose.chain on the CPU): the dense rows
        q = torch.stack([q[i].dense() for i in range(g)]) if g else torch.empty(0, p.shape[-1])
    q = q.to(p.device)
    sizes = _final_sizes(p, q, g) if g and sizes_first(p, hinted) else None
    pxs, qxs, *read = chain_masses(draft_tokens, p, q, x=x, extra=sizes)
    size = read[0] if read else [None] * (g + 1)
    n = accepted_prefix(pxs, qxs, generator)
    if n < g:
        return n, sample(residual(p[n], q[n]), generator, bound, size[n])
    return g, sample(p[g], generator, bound, size[g])


def _final_sizes(p: torch.Tensor, q: torch.Tensor, g: int) -> torch.Tensor:  # [g + 1] on p's device
    """The support size of each row the final draw may come from: ``residual(p_i, q_i)``'s for
    i < g (``max(0, p_i - q_i) > 0``, whatever the normaliser; ``p_i``'s where that has none, the
    fallback), then ``p_g``'s (the bonus row)."""
    res = support_sizes(p[:g] - q[:g])
    return torch.cat([torch.where(res > 0, res, support_sizes(p[:g])), support_sizes(p[g : g + 1])])


def accepted_prefix(pxs: list[float], qxs: list[float], generator: torch.Generator) -> int:
    """Speculative sampling's acceptances: one uniform per position until the first rejection
    (U <= min(1, p_i(x_i) / q_i(x_i)), tested without dividing); the number accepted."""
    for i, (px, qx) in enumerate(zip(pxs, qxs)):
        if not _accepts(px, qx, generator):
            return i
    return len(pxs)


def _accepts(px: float, qx: float, generator: torch.Generator) -> bool:
    """One position's test: its uniform, then U <= min(1, px / qx) without dividing."""
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    return qx > 0 and u * qx <= px


class SpeculativeChain:
    """Speculative sampling of a chain tree (rows 1..g) with its draft rows ``tree.q``."""

    target_pass = "chain"
    lossless = True
    knobs = ()
    needs = ("chain", "chain_q")

    def verify(self, ctx: StepContext, tree: TokenTree) -> StepOutput:
        tokens = chain_tokens(tree, "speculative sampling")
        g = len(tokens)
        scores = score(ctx, tree)  # p: [g+1, V]
        x, _ = scores.fed()
        if isinstance(tree.q, Rows) and scores.candidates() is not None:
            n, y = _verify_on_candidates(ctx, tokens, scores, tree.q, x)
        elif scores.lazy_rows():
            n, y = _verify_row_by_row(ctx, tokens, scores, tree.q)
        else:
            n, y = verify_chain(tokens, scores.p, tree.q, ctx.generator, ctx.warping.support_bound, x,
                                ctx.warping.support_hinted)
        return StepOutput(tokens=tokens[:n] + [y], drafted=g, accepted=n, tree_size=g)


def _verify_on_candidates(ctx: StepContext, tokens: list[int], scores: Scores, q: Rows,
                          x: torch.Tensor) -> tuple[int, int]:
    """``verify_chain`` with p read from its candidates and q from its host supports (the same
    masses, uniforms and draws; see the module docstring)."""
    g = len(tokens)
    pxs = scores.masses(torch.arange(g), x).tolist()  # [g] p_i(x_i), exactly the dense rows' values
    i = accepted_prefix(pxs, [q[j].mass(t) for j, t in enumerate(tokens)], ctx.generator)
    if i == g:
        return g, scores.sample(g, ctx.generator)
    if ctx.warping.greedy:  # one-hot p_i and q_i, x_i not p_i's argmax: the residual is p_i
        return i, scores.sample(i, ctx.generator)
    ids, probs = scores.candidates()
    p_i = torch.zeros(scores.body.shape[-1], dtype=probs.dtype).scatter_(-1, ids[i], probs[i])
    return i, sample(residual(p_i, q[i].dense()), ctx.generator, ctx.warping.support_bound)


def _verify_row_by_row(ctx: StepContext, tokens: list[int], scores: Scores,
                       q: torch.Tensor | Rows) -> tuple[int, int]:
    """``verify_chain`` with p's rows warped one at a time, up to the first rejection (row-wise
    warping on the CPU, ``Scores.lazy_rows``: plain temperature and top-p alone; the rows after a
    rejection are never warped, and the logits are not concatenated for a whole ``p``), q's rows
    read as they are (vectors, or host supports): the same masses (a warped row is ``p``'s row bit
    for bit), uniforms, in the same order, and draws."""
    g = len(tokens)
    for i, t in enumerate(tokens):
        qi = q[i]
        qx = qi.mass(t) if isinstance(qi, Support) else float(qi[t])
        if not _accepts(float(scores.p_row(i)[t]), qx, ctx.generator):
            dense = qi.dense() if isinstance(qi, Support) else qi
            return i, sample(residual(scores.p_row(i), dense), ctx.generator, ctx.warping.support_bound)
    return g, scores.sample(g, ctx.generator)

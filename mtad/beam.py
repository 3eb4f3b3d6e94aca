"""Beam sampling on the draft model: the proposal stage of MTAD and tree-MTAD.

MTAD (Qin et al., "Optimized Multi-Token Joint Decoding with Auxiliary Model
for LLM Inference") drafts by *beam sampling*: a beam search whose top-W
selection is replaced by W multinomial draws.

    depth 1: draw W tokens from q(.|ctx); weight_i = q(x_i) / sum_j q(x_j)
    depth t: score(i, v) = weight_i * q(v | beam_i) over W x V; draw W entries;
             new weights = chosen scores / their sum (plain renormalisation)
    carry each beam's raw cumulative draft log-likelihood log Q(x_1..x_t) = sum log q
    temperature 0: the W draws become top-W (ordinary beam search)
    draft = the final beam with the largest weight

Glossary:

* *slot*: a beam's index at one depth (``0 .. n_t - 1``). ``parents[t][i]`` is the slot
  at depth ``t - 1`` that slot ``i`` at depth ``t`` extends (``-1`` at depth 0);
  following it back gives a beam's *ancestry*, which slot numbers alone do not
  (the draws re-permute the beams at every depth).
* *weight*: the renormalised beam score, used only to draw and to rank beams.
* *cumulative log Q*: the raw draft log-likelihood of a beam's prefix, the Q in
  MTAD's acceptance ratio P / Q.
* *scoring distribution*: the warped draft ``q`` (``ctx.warping``). At temperature 0
  the warped ``q`` is one-hot and cannot rank W beams, so beams are scored with the
  draft's plain softmax (temperature 1, no top-k/top-p) and selected by top-W, as
  in the authors' code; Q then is that softmax's likelihood.

Weights are renormalised as ``p_i / sum_j p_j`` among the chosen entries. The
authors' chain variant applies ``log_softmax`` to probabilities instead, which
makes the weights nearly uniform; that is a bug and is not reproduced here.

With replacement the same (beam, token) entry may be drawn twice; the copies are
separate slots (they share a draft tree node). Without replacement, or when
top-k/top-p leaves fewer than W entries with nonzero score, fewer than W beams
are kept, never duplicates.

Draft passes: the root logits, then one ``ctx.draft.forward`` per depth ``2..gamma``
over the previous depth's beams as tree nodes (W rows in one pass). The runner's
``end`` keeps the committed path in the draft cache; nothing is pruned here.

This module knows nothing about verification: it returns beams and their
likelihoods.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtad.protocols import StepContext
from mtad.runner import ROOT
from mtad.sampling import draw, support
from mtad.warping import Warping


@dataclass
class Beams:
    """The beam-sampling history of one step (depths 0-based: ``t = 0 .. gamma - 1``)."""

    tokens: list[torch.Tensor]  # per depth t: [n_t] long, token of each slot
    parents: list[torch.Tensor]  # per depth t: [n_t] long, slot at depth t-1 (-1 at t = 0)
    cum_logq: list[torch.Tensor]  # per depth t: [n_t] raw cumulative draft log-likelihood
    weights: torch.Tensor  # [n_{gamma-1}] final renormalised beam weights

    @property
    def gamma(self) -> int:
        return len(self.tokens)

    def best(self) -> int:
        """Slot of the final beam with the largest weight (first on ties)."""
        return int(torch.argmax(self.weights))

    def ancestry(self, slot: int) -> list[int]:
        """Slots, depth 0 .. gamma-1, of the final beam ``slot`` and its ancestors."""
        slots = [slot]
        for t in range(self.gamma - 1, 0, -1):
            slots.append(int(self.parents[t][slots[-1]]))
        return slots[::-1]

    def path_tokens(self, slot: int) -> list[int]:
        return [int(self.tokens[t][s]) for t, s in enumerate(self.ancestry(slot))]

    def path_cum_logq(self, slot: int) -> torch.Tensor:  # [gamma]
        return torch.stack([self.cum_logq[t][s] for t, s in enumerate(self.ancestry(slot))])


def scoring_probs(warping: Warping, logits: torch.Tensor) -> torch.Tensor:  # [..., V]
    """The draft distribution beams are scored with: warped q, or plain softmax at temperature 0."""
    if warping.greedy:
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        return logits.to(dtype).softmax(-1)
    return warping(logits)


def select_entries(
    scores: torch.Tensor,  # [n * V] flattened beam scores (nonnegative)
    width: int,
    greedy: bool,
    replacement: bool,
    generator: torch.Generator,
) -> torch.Tensor:  # [k] indices into scores, k <= width
    """Top-W (greedy) or W multinomial draws over the flattened W x V scores."""
    if greedy:
        # the first k of a stable descending sort, without sorting all W x V entries
        k = min(width, scores.numel())
        cand = torch.nonzero(scores >= torch.topk(scores, k).values[-1]).flatten()  # ascending index
        return cand[torch.sort(scores[cand], descending=True, stable=True).indices][:k]
    ids, vals = support(scores)  # a long vector: its nonzero entries only (same distribution)
    nonzero = int((vals > 0).sum())
    if nonzero == 0:
        raise RuntimeError("beam sampling: every draft score is zero (check the warping settings)")
    k = width if replacement else min(width, nonzero)
    return draw(ids, vals, generator, k, replacement)


def beam_sample(ctx: StepContext, gamma: int, width: int, replacement: bool = True) -> Beams:
    """Run beam sampling for ``gamma`` depths on ``ctx.draft`` (one draft pass per depth)."""
    greedy = ctx.warping.greedy
    rows = scoring_probs(ctx.warping, ctx.draft.root_logits)[None]  # [1, V]
    vocab = rows.shape[-1]
    weights = torch.ones(1, dtype=rows.dtype)  # [n] the root is one beam of weight 1
    cum_prev = torch.zeros(1, dtype=rows.dtype)
    nodes_prev = [ROOT]  # draft tree row per slot of the previous depth (ROOT before depth 0)
    out = Beams(tokens=[], parents=[], cum_logq=[], weights=weights)
    for t in range(gamma):
        if t > 0:
            rows, nodes_prev = _expand(ctx, out.tokens[-1], out.parents[-1], nodes_prev)  # [n, V]
        scores = (weights[:, None] * rows).flatten()  # [n * V]
        idx = select_entries(scores, width, greedy, replacement, ctx.generator)  # [k]
        parent, token = idx // vocab, idx % vocab
        chosen = scores[idx]
        weights = (
            chosen / chosen.sum() if chosen.sum() > 0 else torch.full_like(chosen, 1 / len(idx))
        )
        cum = cum_prev[parent] + rows[parent, token].log()
        out.tokens.append(token)
        out.parents.append(parent if t > 0 else torch.full_like(parent, -1))
        out.cum_logq.append(cum)
        cum_prev = cum
    out.weights = weights
    return out


def _expand(
    ctx: StepContext,
    tokens: torch.Tensor,  # [n] tokens of the previous depth's slots
    parents: torch.Tensor,  # [n] their parent slots (-1 at depth 0)
    parent_nodes: list[int],  # draft tree row of each slot one depth further up (or [ROOT])
) -> tuple[torch.Tensor, list[int]]:
    """Feed one depth of beams to the draft as tree nodes; scoring rows [n, V] and tree rows [n].

    Slots with the same (parent node, token) share one node (drawn with replacement).
    """
    keys = [
        (parent_nodes[int(p)] if int(p) >= 0 else ROOT, int(tok)) for p, tok in zip(parents, tokens)
    ]
    unique: dict[tuple[int, int], int] = {}
    for k in keys:
        unique.setdefault(k, len(unique))
    first = ctx.draft.num_nodes
    logits = ctx.draft.forward([k[1] for k in unique], [k[0] for k in unique])  # [u, V]
    probs = scoring_probs(ctx.warping, logits)
    which = torch.tensor([unique[k] for k in keys])
    return probs[which], [first + 1 + unique[k] for k in keys]  # new rows first+1 ..

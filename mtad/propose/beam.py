"""Beam sampling on the draft model: the proposal stage of MTAD, tree-MTAD and beam drafts
for the multi-draft rules (``Beam``, the proposer).

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

Devices: the draft's rows and scores stay on the draft's device; the selected entries (ids,
scores and the draft probabilities there) cross to the host once per depth, where the draws
happen; tokens, parents, weights and cumulative log Q are host tensors (the cumulative log Q
adds the same logarithms of the same values as on the device). Nothing is copied to the
device but the draft pass's inputs: weights scale the rows as scalar arguments, and a
depth's rows are gathered with integer views.

The token tree (``mtad.core.tree.TokenTree``): one row per slot, depth by depth, slots in
order; slots with the same path share a canonical row (the one (parent, token) merge of the
tree type), so the draft is fed each distinct node once and ``TokenTree.dedup`` gives the beam
tree of distinct nodes (tree-MTAD). The tree carries the beams (``tree.beams``, a
``mtad.core.tree.Beams``: slots, their rows, ancestry, cumulative log Q and weights, what MTAD's
rules read) and ``q``: the warped draft
distribution after every row, read lazily (``mtad.core.tree.warped_rows``; at temperature > 0
the very rows the beams were scored with), what the multi-draft rules read. Given its parent
slot, a draw with replacement is an i.i.d. draw from the parent's ``q`` and a slot's number of
children does not depend on the children's tokens: SpecInfer's rule is lossless on these trees
(``mtad.verify.multidraft``); without replacement it is not (nor is MCSS's).

This module knows nothing about verification: it returns beams and their
likelihoods.
"""

from __future__ import annotations

import torch

from mtad.core.decoder import plain_probs
from mtad.core.knobs import GAMMA, WIDTH, Knob, Rule
from mtad.core.protocols import ROOT, StepContext
from mtad.core.sampling import host_supports_with
from mtad.core.tree import Beams, TokenTree, warped_rows
from mtad.core.warping import Warping


def scoring_probs(warping: Warping, logits: torch.Tensor) -> torch.Tensor:  # [..., V]
    """The draft distribution beams are scored with: warped q, or plain softmax at temperature 0."""
    if warping.greedy:
        return plain_probs(logits)
    return warping(logits)


def add_depth(tree: TokenTree, beams: Beams, t: int) -> list[int]:
    """Add depth ``t``'s slots to ``tree`` (one row each, under their parent slot's row)."""
    rows = [
        tree.add(ROOT if t == 0 else beams.rows[t - 1][int(p)], int(tok))
        for p, tok in zip(beams.parents[t], beams.tokens[t])
    ]
    beams.rows.append(rows)
    return rows


def slot_tree(beams: Beams) -> TokenTree:
    """The token tree of a finished ``Beams`` (what ``beam_sample`` builds as it draws)."""
    tree = TokenTree(depth=beams.gamma, beams=beams)
    beams.rows = []
    for t in range(beams.gamma):
        add_depth(tree, beams, t)
    return tree


def select_entries(
    scores: torch.Tensor,  # [n * V] flattened beam scores (nonnegative)
    width: int,
    greedy: bool,
    replacement: bool,
    generator: torch.Generator,
) -> torch.Tensor:  # [k] indices into scores, k <= width, on the host
    """Top-W (greedy) or W multinomial draws over the flattened W x V scores."""
    return _select(scores, width, greedy, replacement, generator)[0]


def _select(
    scores: torch.Tensor,  # [n * V] flattened beam scores (nonnegative), on the draft's device
    width: int,
    greedy: bool,
    replacement: bool,
    generator: torch.Generator,
    bound: int | None = None,  # at most this many nonzero scores (a transfer hint)
    other: torch.Tensor | None = None,  # [n * V] values to read at the chosen entries too
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # host: [k] indices, scores, ``other``
    """``select_entries`` with the chosen scores (and ``other`` there); one device-to-host
    transfer (rarely two)."""
    if greedy:
        return _top_entries(scores, min(width, scores.numel()), other)
    # a long vector: its nonzero entries only (same distribution)
    s, comp = host_supports_with(scores[None], None if other is None else other[None], bound)[0]
    nonzero = int((s.vals > 0).sum())
    if nonzero == 0:
        raise RuntimeError("beam sampling: every draft score is zero (check the warping settings)")
    k = width if replacement else min(width, nonzero)
    pos = torch.multinomial(s.vals, k, replacement=replacement, generator=generator)
    return s.ids[pos], s.vals[pos], None if comp is None else comp[pos]


_TIE_MARGIN = 64  # greedy: entries read past the k-th, so ties with it rarely need a second read


def _top_entries(
    scores: torch.Tensor, k: int, other: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The first k of a stable descending sort of ``scores`` (ties: lower index first), on the
    host, with ``other`` (same shape and dtype as ``scores``) at those entries.

    Without sorting all W x V entries: the top ``k + 64`` cross to the host; every entry
    tied with the k-th is read in a second transfer only if the ties may go on past those.
    """
    n = scores.numel()
    comp = None
    odt = None if other is None else other.dtype
    if scores.device.type == "cpu":
        cand = torch.nonzero(scores >= torch.topk(scores, k).values[-1]).flatten()  # ascending index
        vals = scores[cand]
        comp = None if other is None else other[cand]
    else:
        if other is not None:
            other = other.to(scores.dtype)  # crosses with the scores (exact), back to its dtype below
        m = min(n, k + _TIE_MARGIN)
        top_vals, top_idx = torch.topk(scores, m)
        parts = [top_vals, top_idx.to(top_vals.dtype)] + ([other[top_idx]] if other is not None else [])
        host = torch.stack(parts).cpu()  # one transfer
        kth = host[0, k - 1]
        if m < n and bool(host[0, -1] >= kth):  # ties may go on: every entry >= the k-th
            cand = torch.nonzero(scores >= float(kth)).flatten()
            parts = [cand.to(scores.dtype), scores[cand]] + ([other[cand]] if other is not None else [])
            both = torch.stack(parts).cpu()
            cand, vals = both[0].long(), both[1]
            comp = both[2] if other is not None else None
        else:
            keep = host[0] >= kth
            cand, vals = host[1][keep].long(), host[0][keep]
            order = torch.argsort(cand)
            cand, vals = cand[order], vals[order]
            comp = host[2][keep][order] if other is not None else None
    order = torch.sort(vals, descending=True, stable=True).indices[:k]
    return cand[order], vals[order], None if comp is None else comp[order].to(odt)


def beam_sample(ctx: StepContext, gamma: int, width: int, replacement: bool = True) -> Beams:
    """Run beam sampling for ``gamma`` depths on ``ctx.draft`` (one draft pass per depth).

    Device-to-host transfers: one per depth (the selected entries, their scores and their
    draft probabilities); the beams' tokens, parents, weights and cumulative log Q live on
    the host. Host-to-device copies: the draft pass's inputs only (the weights scale the
    rows as scalars). The step's token tree is ``propose``'s (``Beams`` alone: ``slot_tree``).
    """
    return _beam_sample(ctx, gamma, width, replacement).beams


def _beam_sample(ctx: StepContext, gamma: int, width: int, replacement: bool) -> TokenTree:
    greedy = ctx.warping.greedy
    bound = None if greedy else ctx.warping.support_bound
    root = ctx.draft.root_logits
    rows = scoring_probs(ctx.warping, root)[None]  # [1, V]
    vocab = rows.shape[-1]
    weights = torch.ones(1, dtype=rows.dtype)  # [n] on the host: the root is one beam of weight 1
    cum_prev = torch.zeros(1, dtype=rows.dtype)  # [n] on the host
    out = Beams(tokens=[], parents=[], cum_logq=[], weights=weights)
    tree = TokenTree(depth=gamma, beams=out)
    fed = _Fed()
    for t in range(gamma):
        if t > 0:
            rows = _expand(ctx, tree, out.rows[-1], fed)  # [n, V]
        # weight_i * row_i, each weight a scalar argument (no copy to the device)
        wide = rows.to(torch.promote_types(rows.dtype, weights.dtype))  # as weights * rows promotes
        scores = torch.cat([wide[i] * float(w) for i, w in enumerate(weights.tolist())])  # [n * V]
        idx, chosen, q_chosen = _select(scores, width, greedy, replacement, ctx.generator,
                                        bound * len(weights) if bound else None,
                                        rows.reshape(-1))  # [k] each, host
        parent, token = idx // vocab, idx % vocab
        weights = (
            chosen / chosen.sum() if chosen.sum() > 0 else torch.full_like(chosen, 1 / len(idx))
        )
        cum = cum_prev[parent] + q_chosen.log()  # q(token | beam) read with the selection
        out.tokens.append(token)
        out.parents.append(parent if t > 0 else torch.full_like(parent, -1))
        out.cum_logq.append(cum)
        add_depth(tree, out, t)
        cum_prev = cum
    out.weights = weights
    logits = torch.cat(fed.logits) if fed.logits else root[None][:0]
    tree.q = warped_rows(tree, ctx.warping, root, logits, fed.pos)  # read only by tree rules
    return tree


class _Fed:
    """The canonical rows fed to the draft: their draft runner rows and logits."""

    def __init__(self):
        self.node = {ROOT: ROOT}  # canonical tree row -> draft runner row
        self.pos: dict[int, int] = {}  # canonical tree row -> row of cat(logits)
        self.logits: list[torch.Tensor] = []


class Beam:
    """Beam sampling as a proposer: ``depth`` levels of ``width`` beams (``beam_sample``).

    ``replacement``: draws with replacement (the authors' runs; what SpecInfer's rule needs
    for a lossless pairing) or without.
    """

    kind = "beam"
    knobs = (GAMMA, WIDTH, Knob("replacement", Rule("bool", example="true"), True))  # draws with replacement

    @staticmethod
    def provides(replacement: bool = True, **_) -> tuple[str, ...]:
        # with replacement, a slot's children are i.i.d. draws from its q, as many as its draws
        return ("node_q", "beam_history", *(("iid_children",) if replacement else ()))

    def __init__(self, replacement: bool = True):
        self.replacement = replacement

    def propose(self, ctx: StepContext, depth: int, width: int = 1) -> TokenTree:
        return _beam_sample(ctx, depth, width, self.replacement)


def _expand(
    ctx: StepContext,
    tree: TokenTree,
    slots: list[int],  # [n] tree rows of the previous depth's slots
    fed: _Fed,
) -> torch.Tensor:  # [n, V] scoring rows of the slots
    """Feed one depth of beams to the draft as tree nodes; the slots' scoring rows [n, V].

    Slots with the same path share one node (their canonical row; drawn with replacement).
    """
    todo = list(dict.fromkeys(tree.canon[r] for r in slots))
    first = ctx.draft.num_nodes
    parents = [fed.node[tree.canon[tree.parents[r]]] for r in todo]
    logits = ctx.draft.forward([tree.tokens[r] for r in todo], parents)  # [u, V]
    base = sum(len(x) for x in fed.logits)
    for i, r in enumerate(todo):
        fed.node[r] = first + 1 + i  # new draft rows first+1 ..
        fed.pos[r] = base + i
    fed.logits.append(logits)
    probs = scoring_probs(ctx.warping, logits)
    index = {r: i for i, r in enumerate(todo)}
    which = [index[tree.canon[r]] for r in slots]
    if which == list(range(len(todo))):
        return probs
    return torch.stack([probs[i] for i in which])  # integer views: no index copied to the device

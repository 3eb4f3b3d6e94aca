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

Draws by inverse CDF (plain temperature and top-p alone, ``mtad.core.warping.default_draws``)
with replacement take two uniforms each: a slot by its weight (on the host), then a token from
that slot's warped row (``_slot_then_row``): the flattened scores' distribution, since a slot's
share of them is its weight (its warped row sums to 1), with only the picked rows warped and
summed instead of every slot's ``V`` scores. Their points name these draws in their identity
(``draw_version`` ``2+slot_then_row``: ``Beam.cdf_draws``). The exponential race (greedy, top-k,
and ``draws: race``) and draws without replacement draw from the flattened scores as below.

Devices: the draft's rows and scores stay on the draft's device; the selected entries (ids,
scores and the draft probabilities there) cross to the host once per depth, where the draws
happen (at plain temperature, where every entry has mass, the draws are made on the device
with the CPU generator's numbers: ``mtad.core.sampling.device_multinomial``); tokens, parents,
weights and cumulative log Q are host tensors (the cumulative log Q adds the same logarithms
of the same values as on the device). Nothing is copied to the
device but the draft pass's inputs: weights scale the rows as scalar arguments, and a
depth's rows are gathered with integer views. On the CPU the scores are read on the rows'
candidates only (``_sparse_select``: the warped rows' top-k candidates when sampling, each
slot's top ``W + 8`` plain-softmax entries when greedy), scaled by the weights on the host
with the tensor's float product: no ``W x V`` score vector, the same entries, values and
order, so the same draws (the dense path runs where that does not hold: no top-k, few
entries, ties past a slot's top entries).

On the CPU the beams' bookkeeping after each depth's draws (parents and tokens, the chosen
scores, the renormalised weights, the cumulative log Q) is made on Python floats and ints
(``_HostBeams``; ``mtad.core.hostfloat``: a product, quotient or sum of two values rounded once to
the tensor's dtype, the weights' total by ``torch.sum`` and the logarithms by ``torch.log`` of the
same vectors), and slot-then-row's draws read their rows' cumulative masses through numpy
(``_slot_then_row_host``): the tensor form's values bit for bit, with a few torch calls a depth
instead of a few dozen (``HOST_BEAMS``; ``tests/propose/test_host_beams.py``). ``Beams`` then
holds them as lists (``Beams.on_host``), their tensors made only if read. With slot-then-row
draws the whole step is one loop (``_host_loop``): per depth the draft pass, a chain's calls for
the draws (uniforms, the picked rows' warping and cumulative sums) and the bookkeeping's two
(the weights' total, the logarithms).

The token tree (``mtad.core.tree.TokenTree``): one row per slot, depth by depth, slots in
order; slots with the same path share a canonical row (the one (parent, token) merge of the
tree type), so the draft is fed each distinct node once and ``TokenTree.dedup`` gives the beam
tree of distinct nodes (tree-MTAD). The tree carries the beams (``tree.beams``, a
``mtad.core.tree.Beams``: slots, their rows, ancestry, cumulative log Q and weights, what MTAD's
rules read) and ``q``: the warped draft
distribution after every row, read lazily (``mtad.core.tree.warped_rows``, built on the
first read; at temperature > 0 the very rows the beams were scored with), what the multi-draft
rules read (MTAD's rules read none). Given its parent
slot, a draw with replacement is an i.i.d. draw from the parent's ``q`` and a slot's number of
children does not depend on the children's tokens: SpecInfer's rule is lossless on these trees
(``mtad.verify.multidraft``); without replacement it is not (nor is MCSS's).

This module knows nothing about verification: it returns beams and their
likelihoods.
"""

from __future__ import annotations

import math
import weakref
from typing import NamedTuple

import torch

from mtad.core import cdf_blocks, hostfloat
from mtad.core.decoder import plain_probs
from mtad.core.knobs import GAMMA, WIDTH, Knob, Rule
from mtad.core.protocols import ROOT, StepContext
from mtad.core.sampling import (
    DENSE_MAX,
    EmptySupport,
    Rows,
    cdf_index,
    cdf_list_indices,
    device_drawn,
    device_multinomial,
    inverse_cdf,
    multinomial,
    read_supports,
    top_entries,
    uniforms,
)
from mtad.core.topk import topk_rows
from mtad.core.tree import Beams, TokenTree, warped_rows
from mtad.core.warping import Warping

#: the walk's q reads the rows slot-then-row draws warped instead of warping them again (the CPU;
#: the same values: ``tests/propose/test_beam_q_reuse.py``); ``bench/draw_paths.py`` times it on / off
REUSE_DRAWN_ROWS = True
#: on the CPU the beams' bookkeeping (weights, cumulative log Q, parents, tokens) is made on Python
#: floats and ints, and slot-then-row's draws read on the host (``_HostBeams``, ``_slot_then_row_host``):
#: the same bits (``tests/propose/test_host_beams.py``); ``bench/draw_paths.py`` times it on / off
HOST_BEAMS = True


def scoring_probs(warping: Warping, logits: torch.Tensor) -> torch.Tensor:  # [..., V]
    """The draft distribution beams are scored with: warped q, or plain softmax at temperature 0."""
    if warping.greedy:
        return plain_probs(logits)
    return warping(logits)


def add_depth(tree: TokenTree, beams: Beams, t: int, tokens: list[int] | None = None,
              parents: list[int] | None = None) -> list[int]:
    """Add depth ``t``'s slots to ``tree`` (one row each, under their parent slot's row);
    ``tokens`` and ``parents``: the depth's as lists, where the caller has them."""
    tokens = beams.tokens[t].tolist() if tokens is None else tokens
    if t == 0:
        rows = [tree.add(ROOT, tok) for tok in tokens]
    else:
        above = beams.rows[t - 1]
        parents = beams.parents[t].tolist() if parents is None else parents
        rows = [tree.add(above[p], tok) for p, tok in zip(parents, tokens)]
    beams.rows.append(rows)
    return rows


def slot_tree(beams: Beams) -> TokenTree:
    """The token tree of a finished ``Beams`` (what ``beam_sample`` builds as it draws)."""
    tree = TokenTree(depth=beams.gamma, beams=beams)
    beams.rows = []
    for t in range(beams.gamma):
        add_depth(tree, beams, t)
    return tree


_NO_SCORE = "beam sampling: every draft score is zero (check the warping settings)"


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
    note: dict | None = None,  # set note["long"] = True where the scores' support ran past ``bound``
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # host: [k] indices, scores, ``other``
    """``select_entries`` with the chosen scores (and ``other`` there); one device-to-host
    transfer (rarely two)."""
    if greedy:
        return top_entries(scores, min(width, scores.numel()), other)
    length = None
    # an inverse-CDF draw reads no support: it is made where the scores are, on any device
    if not inverse_cdf(generator) and not device_drawn(scores, bound):
        # a long vector: its nonzero entries only (same distribution)
        got, length = read_supports(scores[None], bound, None if other is None else other[None])
        if got is not None:
            return _host_select(*got[0], width, replacement, generator)
        if note is not None:
            note["long"] = True
    elif note is not None and inverse_cdf(generator) and scores.device.type != "cpu":
        note["long"] = True  # no support read: the tree's rows stay there too
    # plain temperature on an accelerator, or a support past the bound: drawn there, nothing
    # but the draws read back
    try:
        return device_multinomial(scores, width, replacement, generator, other, length=length, nonneg=True)
    except EmptySupport:
        raise RuntimeError(_NO_SCORE) from None


def _host_select(s, comp, width: int, replacement: bool, generator: torch.Generator):
    """``_select``'s draws on a host support (``comp``: ``other`` at its ids)."""
    nonzero = int((s.vals > 0).sum())
    if nonzero == 0:
        raise RuntimeError(_NO_SCORE)
    k = width if replacement else min(width, nonzero)
    pos = multinomial(s.vals, k, replacement, generator)
    return s.ids[pos], s.vals[pos], None if comp is None else comp[pos]


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
    vocab = root.shape[-1]
    sparse = root.device.type == "cpu"  # scores on the rows' candidates (see _sparse_select)
    dtype = torch.float64 if root.dtype == torch.float64 else torch.float32  # the scoring rows'
    weights = torch.ones(1, dtype=dtype)  # [n] on the host: the root is one beam of weight 1
    cum_prev = None  # [n] on the host (None at the root: log Q of the empty prefix, 0)
    host = _host_book(root)  # the CPU: the beams' bookkeeping on Python floats (``_HostBeams``)
    out = Beams(tokens=[], parents=[], cum_logq=[], weights=weights) if host is None else Beams.on_host()
    tree = TokenTree(depth=gamma, beams=out)
    fed = _Fed()
    note: dict = {}  # _select's: whether a depth's support ran past the hint
    slot_first = replacement and not greedy and inverse_cdf(ctx.generator)  # ``_slot_then_row``
    if host is not None and slot_first:  # the CPU's slot-then-row draws: the lean loop
        return _host_loop(ctx, gamma, width, root, tree, out, fed, host)
    for t in range(gamma):
        keep = slot_first and sparse and REUSE_DRAWN_ROWS  # (the CPU: the rows its draws warp, for the walk)
        if t == 0:
            logits, which = root, None  # the root: one row (a vector here)
        else:
            logits, which = _expand(ctx, tree, out.rows[-1], fed)  # [u, V], slot -> row (None: same)
        picked = None
        if slot_first:  # inverse CDF with replacement: a slot by its weight, then a token of its row
            kept: dict[int, torch.Tensor] | None = {} if keep else None
            picked = _slot_then_row(ctx.warping, logits, which, weights, width, ctx.generator, kept)
            if kept:
                fed.warped.update((fed.owner[i], row) for i, row in kept.items())
            if root.device.type != "cpu":
                note["long"] = True  # no support read: the tree's rows stay there too
        probs = scoring_probs(ctx.warping, logits) if greedy else None  # plain softmax at T = 0
        if host is not None and picked is None:
            weights = host.weights()  # the other paths read the weights as a tensor
        if sparse and picked is None:
            picked = _sparse_select(ctx.warping, logits, probs, which, weights, width, replacement,
                                    ctx.generator)
        if picked is None:
            if probs is None:
                probs = scoring_probs(ctx.warping, logits)
            rows = (probs[None] if t == 0 else probs if which is None
                    else torch.stack([probs[i] for i in which]))  # [n, V] integer views: no index copy
            wide = rows.to(torch.promote_types(rows.dtype, weights.dtype))  # as weights * rows promotes
            if wide.device.type == "cpu":  # weight_i * row_i in one product (the same floats)
                scores = (wide * weights.to(wide.dtype)[:, None]).reshape(-1)  # [n * V]
            else:  # each weight a scalar argument (no copy to the device)
                scores = torch.cat([wide[i] * float(w) for i, w in enumerate(weights.tolist())])  # [n * V]
            picked = _select(scores, width, greedy, replacement, ctx.generator,
                             bound * len(weights) if bound else None, rows.reshape(-1), note)  # [k] each, host
        if host is not None:
            host.depth(tree, out, t, picked, vocab)
            continue
        idx, chosen, q_chosen = picked
        parent, token = idx // vocab, idx % vocab
        total = chosen.sum()
        weights = chosen / total if float(total) > 0 else torch.full_like(chosen, 1 / len(idx))
        log_q = q_chosen.log()  # q(token | beam) read with the selection
        cum = log_q if cum_prev is None else cum_prev[parent] + log_q
        out.tokens.append(token)
        out.parents.append(parent if t > 0 else torch.full_like(parent, -1))
        out.cum_logq.append(cum)
        add_depth(tree, out, t)
        cum_prev = cum
    if host is None:
        out.weights = weights
    else:
        out.set_weights(host.w, host.wdtype)
    # read only by tree rules; where a depth's scores ran past the hint (a wide nucleus on an
    # accelerator), the rows stay there as vectors without a read of their hints
    tree.q = _lazy_q(tree, ctx.warping, root, fed, stay=note.get("long", False))
    return tree


def _host_loop(ctx: StepContext, gamma: int, width: int, root: torch.Tensor, tree: TokenTree, out: Beams,
               fed: _Fed, host: _HostBeams) -> TokenTree:
    """``_beam_sample`` on the CPU with slot-then-row draws (``HOST_BEAMS``): per depth the draft
    pass (``_expand``), the draws read on the host (``_slot_then_row_host``) and the bookkeeping on
    Python floats (``_HostBeams``), nothing else: per depth a chain's calls (its uniforms, the
    picked rows' warping and cumulative sums, their searches) and the weights' total, one
    logarithm call and the depth's host tensors. The tensor form's values bit for bit
    (``tests/propose/test_host_beams.py``)."""
    warped = fed.warped if REUSE_DRAWN_ROWS else None  # the walk's q reads the rows the draws warp
    vocab = root.shape[-1]
    lg, which = root[None], None
    for t in range(gamma):
        if t:
            lg, which = _expand(ctx, tree, out.rows[-1], fed)  # [u, V], slot -> row (None: same)
        picked = _slot_then_row_host(ctx.warping, lg, which, host.w, width, ctx.generator, warped, fed.owner)
        host.depth(tree, out, t, picked, vocab)
    out.set_weights(host.w, host.wdtype)
    tree.q = _lazy_q(tree, ctx.warping, root, fed)
    return tree


def _slots(
    w: list[float],  # [n] the slots' weights
    which: list[int] | None,  # [n] row of each slot (None: slot i is row i)
    width: int,
    generator: torch.Generator,
) -> tuple[list[float], list[int], dict[int, list[int]]]:
    """Slot-then-row's first half: its ``2 W`` uniforms (``u[j]`` draw j's slot, ``u[W + j]`` its
    token), each draw's slot by the weights' float64 sums on the host, and the picked rows with
    their draws (row -> draw indices, rows in the order of their first draw)."""
    u = uniforms(2 * width, generator).tolist()
    try:
        slots = cdf_list_indices(w, u[:width])
    except EmptySupport:
        raise RuntimeError(_NO_SCORE) from None
    draws: dict[int, list[int]] = {}
    for j, s in enumerate(slots):
        draws.setdefault(s if which is None else which[s], []).append(j)
    return u, slots, draws


def _slot_then_row(
    warping: Warping,
    logits: torch.Tensor,  # [u, V] (or the root's [V]) draft logits, on the draft's device
    which: list[int] | None,  # [n] row of ``logits`` of each slot (None: slot i is row i)
    weights: torch.Tensor,  # [n] the slots' weights, on the host
    width: int,
    generator: torch.Generator,  # an inverse-CDF generator (``mtad.core.sampling.inverse_cdf``)
    keep: dict[int, torch.Tensor] | None = None,  # given: row of ``logits`` -> its warped row, for each picked
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # host: [W] flattened ids, scores, q there
    """W draws with replacement from the flattened scores ``weight_i * q_i(v)``, each made as a
    slot drawn by its weight, then a token drawn from that slot's warped row (``Beam.cdf_draws``):
    2 uniforms per draw (``u[j]`` its slot, ``u[W + j]`` its token, both by inverse CDF).

    The same distribution: a slot's share of the flattened scores is its weight times its
    row's total, and a warped row sums to 1 (up to rounding, which the row's own float64 total
    absorbs: the token is drawn from the row normalised by it). What it saves is vocabulary
    work: only the rows some draw picks are warped and summed (a row picked twice once), where
    the flattened form warps every slot's row, scales it and sums all ``n x V`` scores. On an
    accelerator the rows are warped and searched there; the token uniforms cross in one copy
    and the draws come back in one read."""
    from mtad.core.devices import to_device

    w = weights.tolist()
    u, slots, draws = _slots(w, which, width, generator)
    lg = logits if logits.dim() == 2 else logits[None]
    picked = list(draws)  # the picked rows, each once, in the order of their first draw
    k = max(len(js) for js in draws.values())
    ut = torch.tensor([[u[width + j] for j in js] + [0.0] * (k - len(js)) for js in draws.values()],
                      dtype=torch.float64)  # [d, k] each row's token uniforms (padding unread)
    if picked == list(range(lg.shape[0])):  # every row, in order: no gather
        (ut,) = to_device([ut], lg.device)
        sel = lg
    else:  # the uniforms and the rows' indices in one copy
        ut, at = to_device([ut, torch.tensor(picked)], lg.device)
        sel = lg.index_select(0, at)
    q = scoring_probs(warping, sel)  # [d, V] the picked warped rows (a softmax reads row by row)
    if keep is not None:
        keep.update(zip(picked, q))
    idx, total = cdf_index(q, ut, nonneg=True)  # [d, k], [d, 1]
    if q.device.type == "cpu":  # no transfer to save: read each part (fewer torch calls)
        host = idx.reshape(-1).tolist() + q.gather(1, idx).reshape(-1).tolist() + total.reshape(-1).tolist()
    else:
        host = torch.cat([idx.double().reshape(-1), q.gather(1, idx).double().reshape(-1),
                          total.reshape(-1)]).cpu().tolist()  # one read
    row_dtype, vocab, n = q.dtype, lg.shape[-1], len(picked) * k
    if not all(0 < t < float("inf") for t in host[2 * n :]):
        raise RuntimeError(_NO_SCORE)
    ids, qs = [0] * width, [0.0] * width
    for i, js in enumerate(draws.values()):
        for c, j in enumerate(js):
            ids[j] = slots[j] * vocab + int(host[i * k + c])
            qs[j] = host[n + i * k + c]
    q_chosen = torch.tensor(qs, dtype=row_dtype)  # exact: the row's own values
    dt = torch.promote_types(row_dtype, weights.dtype)  # as the flattened scores' product promotes
    chosen = q_chosen.to(dt) * torch.tensor([w[s] for s in slots], dtype=dt)  # weight_i * q_i(v), rounded once
    return torch.tensor(ids, dtype=torch.long), chosen, q_chosen


class _HostPick(NamedTuple):
    """``_slot_then_row_host``'s draws: per draw its slot, token and ``q`` there (a Python float,
    exactly the row's value), and the rows' dtype."""

    slots: list[int]
    tokens: list[int]
    q: list[float]
    dtype: torch.dtype


def _slot_then_row_host(
    warping: Warping,
    logits: torch.Tensor,  # [u, V] draft logits (the root's as [1, V]), on the CPU
    which: list[int] | None,  # [n] row of ``logits`` of each slot (None: slot i is row i)
    w: list[float],  # [n] the slots' weights
    width: int,
    generator: torch.Generator,  # an inverse-CDF generator
    warped: dict[int, torch.Tensor] | None = None,  # given: owner[row] -> its warped row, for each picked
    owner: list[int] | None = None,  # [u] the key of each row of ``logits`` in ``warped``
) -> _HostPick:
    """``_slot_then_row`` on the CPU with its reads on the host: the same uniforms, slots, warped
    rows and tokens, and no tensor made for a handful of numbers. Each picked row's float64
    cumulative masses are ``cdf_index``'s (``q.double().cumsum(-1)``: the same sums); the search
    is its definition on them, through numpy (``searchsorted`` to the right of
    ``min(u * total, nextafter(total, 0))``, that product and that bound in Python's doubles,
    which are the tensor's). Where ``cdf_blocks.SITES`` searches a beam's rows by blocks
    (``rows``), ``cdf_index`` does it, as in ``_slot_then_row``. Picked rows that are a run of
    ``logits``' rows are warped as that slice (a view: each row is warped and summed on its own,
    so the same values), others gathered first."""
    u, slots, draws = _slots(w, which, width, generator)
    picked = list(draws)  # the picked rows, each once, in the order of their first draw
    lo = min(picked)
    if max(picked) - lo + 1 == len(picked):  # a run of rows
        q = scoring_probs(warping, logits[lo : lo + len(picked)])  # [d, V] the picked warped rows
        at = [r - lo for r in picked]  # each picked row's row of q
    else:
        q = scoring_probs(warping, logits.index_select(0, torch.tensor(picked)))
        at = range(len(picked))
    if warped is not None:
        rows = q.unbind()
        for r, i in zip(picked, at):
            warped[owner[r]] = rows[i]
    tokens, qs = [0] * width, [0.0] * width
    qn = q.numpy()
    if cdf_blocks.used(q, "rows"):
        k = max(len(js) for js in draws.values())
        ut = torch.tensor([[u[width + j] for j in js] + [0.0] * (k - len(js)) for js in draws.values()],
                          dtype=torch.float64)
        idx, total = cdf_index(q if list(at) == list(range(len(q))) else q[list(at)], ut, nonneg=True)  # in picked order
        if not all(0 < x < math.inf for x in total.view(-1).tolist()):
            raise RuntimeError(_NO_SCORE)
        found = [row[: len(js)] for row, js in zip(idx.tolist(), draws.values())]
    else:
        c = q.double().cumsum(-1).numpy()  # [d, V] cdf_index's cumulative masses (a warped row: >= 0)
        found = []  # per picked row, its draws' tokens in draw order
        for i, js in zip(at, draws.values()):
            ci = c[i]
            total = float(ci[-1])
            if not 0 < total < math.inf:
                raise RuntimeError(_NO_SCORE)
            top = math.nextafter(total, 0.0)
            found.append(ci.searchsorted([min(u[width + j] * total, top) for j in js], side="right").tolist())
    for i, js, ts in zip(at, draws.values(), found):
        for j, t, x in zip(js, ts, qn[i, ts].tolist()):
            tokens[j], qs[j] = t, x
    return _HostPick(slots, tokens, qs, q.dtype)


def _host_book(root: torch.Tensor) -> _HostBeams | None:
    """The host bookkeeping for a step whose draft rows are on the CPU (``HOST_BEAMS``), else None."""
    return _HostBeams(torch.float64 if root.dtype == torch.float64 else torch.float32) \
        if HOST_BEAMS and root.device.type == "cpu" else None


class _HostBeams:
    """``_beam_sample``'s bookkeeping after each depth's draws, on Python floats and ints: the
    tensor form's values bit for bit (``mtad.core.hostfloat``: a product, quotient or sum of two
    values in double rounded once to the tensor's dtype; the weights' total by ``torch.sum`` of
    the same vector and the logarithms by ``torch.log``, whose orders and roundings are the
    kernel's). ``Beams`` gets the same values as lists (its host form, ``Beams.on_host``)."""

    def __init__(self, dtype: torch.dtype):
        self.w = [1.0]  # the slots' weights (the root: one beam of weight 1)
        self.wdtype = dtype
        self.cum: list[float] | None = None  # cumulative log Q of the slots (None at the root)
        self.cdtype: torch.dtype | None = None

    def weights(self) -> torch.Tensor:  # [n] on the host, as the tensor form holds them
        return torch.tensor(self.w, dtype=self.wdtype)

    def depth(self, tree: TokenTree, out: Beams, t: int, picked, vocab: int) -> None:
        if isinstance(picked, _HostPick):
            slots, tokens, q, qdtype = picked
            dt = torch.promote_types(qdtype, self.wdtype)  # as the flattened scores' product promotes
            chosen = _products(q, [self.w[s] for s in slots], dt)  # weight_i * q_i(v), rounded once
            total = float(torch.tensor(chosen, dtype=dt).sum())
            log_q = torch.tensor(q, dtype=qdtype).log().tolist()
        else:  # the other paths' host tensors
            idx, chosen_t, q_t = picked
            ids = idx.tolist()
            slots, tokens = [i // vocab for i in ids], [i % vocab for i in ids]
            dt, qdtype = chosen_t.dtype, q_t.dtype
            chosen, total, log_q = chosen_t.tolist(), float(chosen_t.sum()), q_t.log().tolist()
        one, many = hostfloat.rounding(dt)
        self.w = many([c / total for c in chosen]) if total > 0 else [one(1 / len(chosen))] * len(chosen)
        self.wdtype = dt
        if self.cum is None:
            cum, cdtype = log_q, qdtype
        else:
            cdtype = torch.promote_types(self.cdtype, qdtype)
            cum = hostfloat.rounding(cdtype)[1]([self.cum[p] + x for p, x in zip(slots, log_q)])
        self.cum, self.cdtype = cum, cdtype
        out.add(tokens, slots if t > 0 else [-1] * len(slots), cum, cdtype)
        add_depth(tree, out, t, tokens, slots)


def _lazy_q(tree: TokenTree, warping: Warping, root: torch.Tensor, fed: _Fed, stay: bool = False) -> Rows:
    """``warped_rows`` of the draft after every row of ``tree``, built on the first read (a
    rule that reads no ``q`` pays for no concatenation of the fed logits); ``stay``: its
    ``stay`` (a depth's support already ran past the hint).

    The rows reach the tree by a weak reference: ``tree.q`` holding them and they holding
    ``tree`` would be a reference cycle, which keeps the step's fed logits (``W x gamma``
    vocabulary rows) alive until Python's garbage collector runs instead of freeing them when
    the step ends (on the CPU, fresh pages for the next step's rows, at 151,936 tokens several
    MB a step)."""
    inner: list[Rows] = []
    ref = weakref.ref(tree)

    def rows() -> Rows:
        if not inner:
            tree = ref()
            if tree is None:
                raise RuntimeError("beam drafting's q was read after its step's token tree was dropped; "
                                   "read tree.q while the tree is alive")
            if root.device.type == "cpu":  # read row by row there: the fed logits as they are
                logits = _Stacked(fed.logits)
            else:
                logits = torch.cat(fed.logits) if fed.logits else root[None][:0]
            inner.append(warped_rows(tree, warping, root, logits, fed.pos, stay=stay, done=fed.warped))
        return inner[0]

    def row(r: int):
        return rows()[r]

    def device_row(r: int):  # an accelerator's: the row as a vector (``Rows.device_row``)
        return rows().device_row(r)

    # ``stay``: every row stays on the device, so a walk learns that without a read
    return Rows(len(tree.tokens), row, device_row if root.device.type != "cpu" else None, ready=stay)


def _sparse_select(
    warping: Warping,
    logits: torch.Tensor,  # [u, V] (or the root's [V]) draft logits, on the CPU
    probs: torch.Tensor | None,  # [u, V] (or [V]) scoring rows at T = 0 (plain softmax), else None
    which: list[int] | None,  # [n] row of ``logits`` of each slot (None: slot i is row i)
    weights: torch.Tensor,  # [n] the slots' weights, on the host
    width: int,
    replacement: bool,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:  # as ``_select``; None: take the dense path
    """``_select`` over the flattened scores ``weight_i * row_i`` read on the rows' candidates
    only (no [n * V] score vector): the same entries, values and order, so the same draws.

    A score is computed on the host as the dense path computes it on the tensor: the product
    of two floats of the scores' dtype, exact in double precision and rounded once to that
    dtype (``_products``; many candidates: on tensors, ``_sample_tensors``). Sampling: the warped rows' candidates (``Warping.candidates``: the
    top-k fast path), each scaled by its slot's weight; the nonzero ones by ascending
    flattened id ``i * V + token`` are exactly the dense scores' host support, and the
    multinomial reads them in that order. Only where the flattened scores are longer than
    ``DENSE_MAX`` (else their support is every entry: dense path). Greedy: each slot's top
    ``W + 8`` entries of its plain softmax; every entry scoring at least the W-th largest
    score is among them when the last of them scores strictly less than the slot's own W-th
    (checked; else the dense path), so the candidates at or above the W-th largest score are
    the dense path's, ordered as it orders them (descending score, then ascending index).
    """
    vocab = logits.shape[-1]
    n = len(weights)
    if probs is None:  # sampling
        if n * vocab <= DENSE_MAX:
            return None
        cand = warping.candidates(logits if logits.dim() == 2 else logits[None])
        if cand is None:
            return None
        ids, vals = cand  # [u, c] each
    else:  # greedy: top-W by score
        m = min(vocab, width + _ROW_MARGIN)
        if m < width:
            return None
        vals, ids = topk_rows(probs if probs.dim() == 2 else probs[None], m)  # [u, m], as torch.topk
    dt = torch.promote_types(vals.dtype, weights.dtype)
    if dt not in _HOST_FLOAT:
        return None
    if probs is None and n * ids.shape[-1] > _HOST_ENTRIES:  # long supports: on tensors
        return _sample_tensors(ids, vals, which, weights.to(dt), vocab, width, replacement, generator)
    id_rows, val_rows = ids.tolist(), vals.tolist()
    rows = range(n) if which is None else which
    w = weights.tolist()
    flat, q = [], []
    for i, r in enumerate(rows):
        flat.extend(i * vocab + t for t in id_rows[r])
        q.extend(val_rows[r])
    c = len(id_rows[0])
    scores = _products(q, [w[i] for i in range(n) for _ in range(c)], dt)
    if probs is None:
        keep = sorted((f, s, v) for f, s, v in zip(flat, scores, q) if s > 0)  # ascending id
        if not keep:
            raise RuntimeError(_NO_SCORE)
        k = width if replacement else min(width, len(keep))
        s = torch.tensor([e[1] for e in keep], dtype=dt)
        pos = multinomial(s, k, replacement, generator).tolist()
        chosen = [keep[j] for j in pos]
    else:
        if m < vocab and any(scores[i * c + m - 1] >= scores[i * c + width - 1] for i in range(n)):
            return None  # ties (or zeros) may go on past a slot's top m
        kth = sorted(scores, reverse=True)[width - 1]
        if not kth > 0:
            return None  # the dense path's ties at zero take every entry
        keep = [(f, s, v) for f, s, v in zip(flat, scores, q) if s >= kth]
        chosen = sorted(keep, key=lambda e: (-e[1], e[0]))[:width]
    return (torch.tensor([e[0] for e in chosen], dtype=torch.long),
            torch.tensor([e[1] for e in chosen], dtype=dt),
            torch.tensor([e[2] for e in chosen], dtype=vals.dtype))


def _sample_tensors(
    ids: torch.Tensor,  # [u, c] candidate ids of each row
    vals: torch.Tensor,  # [u, c] their warped probabilities
    which: list[int] | None,  # [n] row of each slot (None: slot i is row i)
    weights: torch.Tensor,  # [n] in the scores' dtype
    vocab: int,
    width: int,
    replacement: bool,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_sparse_select``'s sampling on tensors (many candidates): the same entries, values and
    order (a tensor product of the same two floats is the dense score)."""
    if which is not None:
        at = torch.tensor(which)
        ids, vals = ids[at], vals[at]  # [n, c] per slot
    n = len(weights)
    scores = vals.to(weights.dtype) * weights[:, None]  # = wide[i] * float(w)
    flat = ids + torch.arange(0, n * vocab, vocab)[:, None]
    keep = scores > 0  # the host support: nonzero entries (top-p's removed candidates are 0)
    flat, scores, vals = flat[keep], scores[keep], vals[keep]
    order = torch.argsort(flat)  # ascending flattened id (ids are distinct)
    flat, scores, vals = flat[order], scores[order], vals[order]
    if len(scores) == 0:
        raise RuntimeError(_NO_SCORE)
    k = width if replacement else min(width, len(scores))
    pos = multinomial(scores, k, replacement, generator)
    return flat[pos], scores[pos], vals[pos]


_ROW_MARGIN = 8  # greedy: entries read per slot past the W-th
_HOST_ENTRIES = 2048  # sampling: candidate entries past which the scores are read on tensors
_HOST_FLOAT = hostfloat.HOST_DTYPES  # score dtypes whose products the host computes exactly


def _products(a: list[float], b: list[float], dtype: torch.dtype) -> list[float]:
    """``a * b`` entry by entry as a tensor of ``dtype`` computes it: float64 natively; float32
    as the double product (exact: 24 + 24 significand bits) rounded once to float32."""
    return hostfloat.rounding(dtype)[1]([x * y for x, y in zip(a, b)])


class _Stacked:
    """Row ``i`` of ``torch.cat(parts)`` without the concatenation (a CPU reader of a few rows,
    ``warped_rows``, pays for no copy of the others)."""

    def __init__(self, parts: list[torch.Tensor]):  # each [m_j, V]
        self.parts = parts

    def __getitem__(self, i: int) -> torch.Tensor:  # [V]
        for part in self.parts:
            if i < len(part):
                return part[i]
            i -= len(part)
        raise IndexError("row past the fed logits")


class _Fed:
    """The canonical rows fed to the draft: their draft runner rows and logits."""

    def __init__(self):
        self.node = {ROOT: ROOT}  # canonical tree row -> draft runner row
        self.pos: dict[int, int] = {}  # canonical tree row -> row of cat(logits)
        self.logits: list[torch.Tensor] = []
        self.count = 0  # rows of cat(logits)
        self.owner = [ROOT]  # the canonical tree row of each row of the last depth's logits (the root's first)
        # canonical tree row -> its warped row where a draw already made it (the CPU's slot-then-row
        # draws: the rows they pick), which the walk's q then reads instead of warping it again
        self.warped: dict[int, torch.Tensor] = {}


class Beam:
    """Beam sampling as a proposer: ``depth`` levels of ``width`` beams (``beam_sample``).

    ``replacement``: draws with replacement (the authors' runs; what SpecInfer's rule needs
    for a lossless pairing) or without.
    """

    kind = "beam"
    knobs = (GAMMA, WIDTH, Knob("replacement", Rule("bool", example="true"), True))  # draws with replacement

    @staticmethod
    def cdf_draws(replacement: bool = True, **_) -> str | None:
        """Its own inverse-CDF draws (``_slot_then_row``: with replacement, a slot then a token of
        its row), named in the identity of every point they draw (``draw_version``)."""
        return "slot_then_row" if replacement else None

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
) -> tuple[torch.Tensor, list[int] | None]:  # [u, V] logits of the distinct slots; slot -> row
    """Feed one depth of beams to the draft as tree nodes; their logits and each slot's row
    of them (None when slot i is row i).

    Slots with the same path share one node (their canonical row; drawn with replacement).
    """
    canon = [tree.canon[r] for r in slots]
    todo = list(dict.fromkeys(canon))
    first = ctx.draft.num_nodes
    parents = [fed.node[tree.canon[tree.parents[r]]] for r in todo]
    logits = ctx.draft.forward([tree.tokens[r] for r in todo], parents)  # [u, V]
    base = fed.count
    for i, r in enumerate(todo):
        fed.node[r] = first + 1 + i  # new draft rows first+1 ..
        fed.pos[r] = base + i
    fed.logits.append(logits)
    fed.count += len(todo)
    fed.owner = todo
    if len(todo) == len(canon):
        return logits, None
    index = {r: i for i, r in enumerate(todo)}
    return logits, [index[c] for c in canon]

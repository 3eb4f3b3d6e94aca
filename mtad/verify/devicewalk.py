"""The multi-draft walk with rows that stay on an accelerator (plain temperature; wide nuclei).

At plain temperature (no top-k, no top-p) every token has mass, so a warped row's host support
is the whole row: the host walk (``mtad.verify.multidraft._walk``) would bring every visited
``p`` and ``q`` row across. So would top-p alone with a wide nucleus (a support longer than the
warping's bound: ``mtad.core.sampling.read_supports``); there the rows that stayed on the device
are one model's, and the other's come as vectors too (``Rows.device_row``). This walk reads
scalars instead, in two transfers a step:

1. For every node the walk could visit (one per node: with merged prefixes, SpecTr's alive
   drafts, a node's candidates are fixed by its path), the rule's arithmetic over the
   vocabulary runs on the device, on the very vectors the host rule runs on (a node's
   ``compress_support`` columns are its rows' nonzero entries, and a row is 0 elsewhere):
   SpecInfer's and MCSS's residual updates, MCNS's leftover mass, SpecTr's bracket for rho.
   Every node's candidate masses (and SpecTr's bracket) cross in one read, with the sizes the
   final draw can take (a node's ``p`` or ``q`` support, a leaf's ``p`` support), so that draw
   takes only as many exponentials as its entries.
2. The host finishes each rule on those scalars with the host rule's own tensor operations
   (``_accept_ratio``, ``reach * a``: the same bits) and walks down, drawing each node's outcome
   from the same vector with the same generator (``mtad.core.sampling.sample``). The
   correction (from the residual at the node where every candidate was rejected, over the
   entries the host rule's compressed vector holds) or the bonus (from ``p`` after a leaf) is
   drawn on the device (``mtad.core.sampling.device_draws``): the exponentials cross, the
   token comes back.

The same tokens and generator state as the host walk, up to the order of floating-point sums:
a sum over a row with zeros in it (underflow) may differ in its last bit from the host's sum of
the nonzero entries, and SpecTr's bracket sums ``q`` and ``p`` by masks where the host sums
slices. On the float64 test pair, where rows have no zeros, the draws are the host walk's
(``tests/verify/test_device_walk.py``). Host-to-device: the correction's exponentials (one
pinned copy); candidates index the rows as Python integers (views, no copy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from mtad.core import sampling
from mtad.core.sampling import Rows, device_draws
from mtad.verify import multidraft as md

__all__ = ["RULES", "device_rows", "device_walk"]


def _vector(x) -> bool:  # a row that is a vector on an accelerator, longer than DENSE_MAX
    return isinstance(x, torch.Tensor) and x.dim() == 1 and sampling.device_drawn(x, None)


def _stays(x) -> bool:
    """Whether some row of ``x`` stayed on the device: its root (a tensor; ``Rows`` of host
    supports on the CPU), or any row (``Rows`` with ``device_row``: an accelerator's, where
    every row is already warped and read at once)."""
    if isinstance(x, Rows) and x.device_row is not None:
        return any(_vector(x[i]) for i in range(len(x)))
    return _vector(x[0])


def _vectors(x):
    """``x``'s rows as vectors on the device, or None."""
    if isinstance(x, Rows) and x.device_row is not None:
        return Rows(len(x), x.device_row)
    return x if _vector(x[0]) else None


def device_rows(p, q) -> tuple | None:
    """(p, q) as vectors on the device where a walk over them (``[N+1, V]`` tensors or ``Rows``)
    runs here, else None: some row of either stayed on an accelerator, longer than ``DENSE_MAX``."""
    # rows that cost no read to ask first (``Rows.ready``: a drawn tree's q, read when its children
    # were drawn): when one of them stayed, the walk runs here whatever the others are, and p's
    # hints are never read (a read fewer: the walk's scalars and its final draw are the
    # verification's). Else p first, as a walk on the host reads p's rows anyway.
    first, second = (q, p) if isinstance(q, torch.Tensor) or getattr(q, "ready", False) else (p, q)
    if not (_stays(first) or _stays(second)):
        return None
    P, Q = _vectors(p), _vectors(q)
    return None if P is None or Q is None else (P, Q)


# ------------------------------------------------------------------ per-node device arithmetic
# Each returns (device scalars to read, state kept for the correction). Candidates are Python
# integers (token ids); ``P`` and ``Q`` are [V] rows on the device.


def _sequential(P, Q, cands, update):
    reads = []
    for c in cands:
        reads += [P[c], Q[c]]
        drawable = Q[c] > 0
        P2, Q2 = update(P, Q, c)
        P = torch.where(drawable, P2, P)  # a candidate that could not have been drawn: skipped
        Q = torch.where(drawable, Q2, Q)
    return reads, P


def _specinfer(P, Q, cands):
    return _sequential(P, Q, cands, lambda P, Q, c: (md._normalise_or((P - Q).clamp_min(0), P), Q))


def _mcss(P, Q, cands):
    def update(P, Q, c):
        P = md._normalise_or((P - Q).clamp_min(0), P)
        Q = Q.clone()
        Q[c] = 0
        return P, md._normalise_or(Q, torch.zeros_like(Q))

    return _sequential(P, Q, cands, update)


def _mcns(P, Q, cands):
    rest = P.clone()
    for c in dict.fromkeys(cands):
        rest[c] = 0
    return [P[c] for c in cands] + [rest.sum()], md._normalise_or(rest, P)


def _spectr(P, Q, cands):
    """``spectr_rho``'s bracket without a read: (any q > p, f(1), f(k), lo, hi, qs, pc), and the
    candidates' masses. The ratios are sorted with undrawable tokens last (ratio inf)."""
    k = len(cands)
    reads = [x for c in cands for x in (P[c], Q[c])]
    if k <= 1:
        return reads, None
    drawable = Q > 0
    ratio = torch.where(drawable, P / torch.where(drawable, Q, torch.ones_like(Q)), math.inf)
    r, order = ratio.sort()
    qd, pd = Q[order], torch.where(drawable, P, torch.zeros_like(P))[order]
    q_in = qd.sum() - qd.cumsum(0) + qd
    p_out = pd.cumsum(0) - pd

    def f(rho, beta):
        return 1 - (1 - beta) ** k - rho * beta

    f1 = f(1.0, torch.minimum(Q, P / 1.0).sum())
    fk = f(float(k), torch.minimum(Q, P / float(k)).sum())
    inside = (r > 1) & (r < k)
    hit = inside & (f(r, q_in + p_out / torch.where(inside, r, torch.ones_like(r))) <= 0)
    has = hit.any()
    first = hit.to(r.dtype).argmax()  # the first inside breakpoint with f <= 0
    hi = torch.where(has, r[first], torch.full_like(r[0], float(k)))
    pos = torch.arange(len(r), device=r.device)
    before = inside & (pos < torch.where(has, first, torch.full_like(first, len(r))))
    lo = torch.where(before.any(), torch.where(before, r, torch.full_like(r, -math.inf)).max(),
                     torch.ones_like(r[0]))
    qs = torch.where(r >= hi, qd, torch.zeros_like(qd)).sum()
    pc = torch.where(r < hi, pd, torch.zeros_like(pd)).sum()
    return reads + [(Q > P).any(), f1, fk, lo, hi, qs, pc], None


RULES = {md.specinfer_position: _specinfer, md.mcss_position: _mcss, md._mcns_rule: _mcns,
           md.spectr_position: _spectr, md.spectr_position_select: _spectr}
_SPECTR = (md.spectr_position, md.spectr_position_select)  # (the device's bracket sorts either way)


# ------------------------------------------------------------------ the host's side of a node


def _outcome(rule, vals: list[float], k: int, pdt: torch.dtype, qdt: torch.dtype):
    """(acceptance of each candidate [k], rejection [], SpecTr's rho or None) on the host, by the
    host rule's tensor operations (``_sequential``'s) on the read scalars: SpecInfer, MCSS, SpecTr."""
    t = lambda x, dt: torch.tensor(x, dtype=dt)  # noqa: E731 (a float64 read: exact)
    pcs, qcs = vals[0 : 2 * k : 2], vals[1 : 2 * k : 2]
    rho = None
    if rule in _SPECTR:
        rho = 1.0
        if k > 1:
            anyq, f1, fk, lo, hi, qs, pc = vals[2 * k :]
            if anyq and f1 > 0:
                rho = float(k) if fk >= 0 else md._bisect_rho(lo, hi, qs, pc, k)
    accept, reach = torch.zeros(k, dtype=pdt), torch.ones((), dtype=pdt)
    for i in range(k):
        qc = t(qcs[i], qdt)
        a = md._accept_ratio(t(pcs[i], pdt), qc if rho is None else rho * qc)
        accept[i] = reach * a
        reach = reach * (1 - a)
    return accept, reach, rho


def _duplicates(cands: list[int]) -> list[int]:
    """MCNS: position i accepts only at a token's first occurrence."""
    seen, out = set(), []
    for i, c in enumerate(cands):
        if c in seen:
            out.append(i)
        seen.add(c)
    return out


def device_walk(
    parents: Sequence[int],
    tokens: Sequence[int],
    p: torch.Tensor | Rows,  # [N+1] rows on the device
    q: torch.Tensor | Rows,
    generator: torch.Generator,
    rule,
    merge_equal_prefixes: bool = False,
) -> tuple[list[int], int]:
    """``mtad.verify.multidraft._walk`` for device rows (see the module docstring)."""
    kids = md._children(parents, len(p))
    # every state the walk can reach: (node, its candidate nodes)
    states: dict[int, list[int]] = {}
    todo = [(0, [0])]
    while todo:
        node, alive = todo.pop()
        cand_nodes = [c for a in alive for c in kids[a]]
        states[node] = cand_nodes
        for c in cand_nodes:
            todo.append((c, [x for x in cand_nodes if tokens[x] == tokens[c]] if merge_equal_prefixes else [c]))
    dev = RULES[rule]
    reads, spans, kept, sizes = [], {}, {}, {}
    for n in sorted(states):
        if not states[n]:  # a leaf: the bonus's entries
            sizes[n] = len(reads)
            reads.append((p[n] > 0).sum())
            continue
        P = p[n]
        Q = q[n].to(P.device)  # where p and q meet, q moves (a draft on another device)
        cands = [tokens[c] for c in states[n]]
        r, residual = dev(P, Q, cands)
        spans[n] = (len(reads), len(r))
        reads += r
        union = (P > 0) | (Q > 0)  # the correction's entries: these, or fewer (its support)
        for c in cands:
            union[c] = True
        sizes[n] = len(reads)
        reads.append(union.sum())
        kept[n] = (P, Q, cands, residual, union)
    host = torch.stack([x.reshape(()).double() for x in reads]).cpu().tolist() if reads else []  # read 1
    node = 0
    while True:
        cand_nodes = states[node]
        if not cand_nodes:  # a leaf (or an empty tree): the bonus from p
            token = device_draws(p[node][None], generator, length=int(host[sizes[node]])).commit(0, generator)
            break
        P, Q, cands, residual, union = kept[node]
        a, n_r = spans[node]
        vals = host[a : a + n_r]
        if rule is md._mcns_rule:
            dup = set(_duplicates(cands))
            vals = [0.0 if i in dup else v for i, v in enumerate(vals[:-1])] + vals[-1:]
            accept, reject = torch.tensor(vals[:-1], dtype=P.dtype), torch.tensor(vals[-1], dtype=P.dtype)
            rho = None
        else:
            accept, reject, rho = _outcome(rule, vals, len(cands), P.dtype, Q.dtype)
        j = sampling.sample(torch.cat([accept, reject.reshape(1)]), generator)
        if j == len(cand_nodes):  # every candidate rejected: the correction, drawn on the device
            if rule in _SPECTR:
                residual = md._normalise_or((P - rho * Q).clamp_min(0), P)
            entries = union if host[sizes[node]] <= sampling.DENSE_MAX else residual > 0
            token = device_draws(residual[None], generator, entries=entries[None],
                                 length=int(host[sizes[node]])).commit(0, generator)
            break
        node = cand_nodes[j]
    path = []
    while node != 0:
        path.append(node)
        node = parents[node]
    return path[::-1], token

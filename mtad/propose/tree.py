"""Drafting i.i.d. token trees and chains on the draft model (SpecInfer, MCSS, MCNS, SpecTr).

Proposers: ``Tree`` (every node at depth d gets ``branching[d]`` children, drawn i.i.d. or
without replacement) and ``Chains`` (k i.i.d. chains as k branches under the root). They
build ``mtad.core.tree.TokenTree`` rows (row 0 is the root, the endpoint; rows 1..N in the
order drafted, ``parents[r] < r``). A tree may hold rows with equal token paths (i.i.d.
siblings); only their canonical rows are fed to the models, so a runner's rows are this
tree's canonical rows, renumbered (``TokenTree.feed_rows``).

Devices: the draft's warped rows of one depth cross to the host together (one transfer
per depth, ``mtad.core.sampling.host_supports``), where children are drawn; the tree keeps
those host supports as its ``q``. At plain temperature on an accelerator (a support is the
whole row), or where a depth's first read shows a support longer than the warping's bound
(top-p alone with a wide nucleus: ``mtad.core.sampling.read_supports``), the rows stay there,
as the tree's ``q``, and the children are drawn there (``device_level_draws``: the same
draws, one more read for that depth, no row crosses). On an accelerator the tree also keeps
every depth's warped rows as vectors (``Rows.device_row``) for a walk on the device. On the CPU, where the warping gives its rows by their
candidates (greedy, top-k: ``mtad.core.warping.Warping.candidates``), the supports are read
from the candidates (``mtad.core.sampling.candidate_supports``, the same supports) without
building or scanning the dense rows. Children are the draws successive ``torch.multinomial``
calls on the host support would make (``mtad.core.sampling.draw``), their exponentials taken
from the generator in one call (``_draws``): the same tokens and generator state. The target
pass (``mtad.verify.score``) brings the target's warped rows across in one transfer on an
accelerator (on the CPU it warps the rows a walk reads, lazily).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from mtad.core import cdf_blocks, hostfloat
from mtad.core.decoder import StepContext
from mtad.core.knobs import GAMMA, Knob, Rule
from mtad.core.protocols import ROOT
from mtad.core.sampling import (
    Rows,
    Support,
    as_support,
    candidate_supports,
    cdf_index,
    cdf_positions,
    cdf_search,
    check_total,
    device_drawn,
    host_supports,
    inverse_cdf,
    read_supports,
    uniforms,
)
from mtad.core.tree import TokenTree
from mtad.core.warping import Warping

# (q [V] or its host support, k, generator) -> child tokens
ChildSampler = Callable[[torch.Tensor | Support, int, torch.Generator], list[int]]


_SHORT = 512  # supports up to this long are drawn on Python lists (fewer torch calls)


def exponentials(vals: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:  # [k, n]
    """The exponentials that k successive ``torch.multinomial(vals, 1, generator=generator)``
    calls take from the generator, drawn at once (``mtad.core.hostfloat``: row i is the i-th
    call's; ``tests/propose/test_tree_draws.py``)."""
    return hostfloat.exponentials((k, vals.numel()), vals.dtype, generator)


def _plan(s: Support, k: int, replacement: bool) -> tuple[int, list[float] | None]:
    """How many draws ``_draws`` makes on ``s`` and, for a short support, its masses as a list.

    The masses are checked as ``torch.multinomial`` checks them (no draw: no check)."""
    if s.vals.numel() <= _SHORT and s.vals.dtype in hostfloat.HOST_DTYPES:
        vals = s.vals.tolist()
        m = k if replacement else min(k, sum(v > 0 for v in vals))  # no more than the nonzero ones
        if m > 0 and (not all(0.0 <= v < math.inf for v in vals) or not any(v > 0 for v in vals)):
            raise RuntimeError("invalid multinomial distribution (masses must be >= 0, finite, not all 0)")
        return max(m, 0), vals
    m = k if replacement else min(k, int((s.vals > 0).sum()))
    if m > 0:
        tot = float(s.vals.sum())  # a support's masses are >= 0: this catches nan, inf and no mass
        if not 0 < tot < math.inf:
            raise RuntimeError(f"invalid multinomial distribution (sum of probabilities {tot})")
    return max(m, 0), None


def _pick(s: Support, vals: list[float] | None, exps: Callable[[], torch.Tensor],
          rows: list[list[float]] | None, replacement: bool) -> list[int]:
    """The token ids drawn on ``s`` with the exponentials ``exps()`` [m, n] (``rows``: the same
    as lists, for a short support): each draw the first maximum of ``masses / e[i]`` (``argmax``)."""
    n = s.vals.numel()
    picks: list[int] = []
    if vals is not None and rows is not None and not any(0.0 in row for row in rows):  # (x / 0: tensors)
        vals = list(vals)
        for row in rows:
            j = hostfloat.multinomial_pick(vals, row, s.vals.dtype)
            picks.append(j)
            if not replacement:
                vals[j] = 0.0
        if n == s.size:  # dense: position i is token i
            return picks
        ids = s.ids.tolist()
        return [ids[j] for j in picks]
    e = exps()
    if replacement:
        pos = (s.vals / e).argmax(-1)
    else:
        masses = s.vals.clone()
        for i in range(len(e)):
            j = int((masses / e[i]).argmax())
            picks.append(j)
            masses[j] = 0
        pos = torch.tensor(picks)
    return (pos if n == s.size else s.ids[pos]).tolist()


def _draws(s: Support, k: int, generator: torch.Generator, replacement: bool) -> list[int]:
    """k successive ``torch.multinomial`` draws on a host support (``mtad.core.sampling.draw``),
    each from the masses left after the previous ones unless ``replacement``: their token ids.

    A short support is drawn on the host as Python floats: ``masses / e`` rounded to the
    masses' dtype (one IEEE division, exact after rounding the float64 quotient of two float32
    numbers), the first maximum (``argmax``)."""
    if inverse_cdf(generator):  # k uniforms over the support's cumulative masses
        pos = cdf_positions(s.vals, k, replacement, generator, positive=s.whole())
        return pos if len(s.ids) == s.size else s.ids[pos].tolist()
    m, vals = _plan(s, k, replacement)
    if m == 0:
        return []
    e = exponentials(s.vals, m, generator)
    return _pick(s, vals, lambda: e, e.tolist() if vals is not None else None, replacement)


def _level_draws(supports: list[Support], k: int, generator: torch.Generator,
                 replacement: bool) -> list[list[int]]:
    """``_draws`` on each support in turn; the exponentials of every draw in one call when the
    supports are short and of one dtype (the generator's stream is sequential: the same ones)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if inverse_cdf(generator):
        whole = k > 0 and len(supports) > 1 and all(s.whole() for s in supports) and len(
            {s.vals.dtype for s in supports}) == 1
        if whole and replacement:
            return _whole_level_cdf([s.vals for s in supports], k, generator)
        if whole and cdf_blocks.used(supports[0].vals, "without"):
            return _whole_level_siblings([s.vals for s in supports], k, generator)
        return [_draws(s, k, generator, replacement) for s in supports]
    plans = [_plan(s, k, replacement) for s in supports]
    dtypes = {s.vals.dtype for s in supports}
    if len(dtypes) != 1 or any(vals is None for _, vals in plans):
        return [_draws(s, k, generator, replacement) for s in supports]
    sizes = [m * s.vals.numel() for s, (m, _) in zip(supports, plans)]
    e = torch.empty(sum(sizes), dtype=dtypes.pop()).exponential_(1, generator=generator)
    flat, out, at = e.tolist(), [], 0
    for s, (m, vals), size in zip(supports, plans, sizes):
        n = s.vals.numel()
        rows = [flat[at + i * n : at + (i + 1) * n] for i in range(m)]
        out.append(_pick(s, vals, lambda a=at, z=size, n=n, m=m: e[a : a + z].view(m, n), rows, replacement)
                   if m else [])
        at += size
    return out


def _whole_level_cdf(rows: list[torch.Tensor], k: int, generator: torch.Generator) -> list[list[int]]:
    """``_draws`` with replacement by inverse CDF on whole rows (every entry positive: plain
    temperature), for a level's rows at once: their float64 cumulative masses in one [F, V]
    block, the ``F k`` uniforms in one call (the generator's stream is sequential: the ones the
    rows take in turn), one search and one read. The same positions as row after row
    (``mtad.core.sampling.cdf_positions``), bit for bit; a few torch calls per level instead of
    per row (``tests/propose/test_level_cdf.py``). Rows of at least ``cdf_blocks.MIN_LENGTH``
    entries are searched by their blocks instead (``mtad.core.cdf_blocks``: the same positions,
    a read of each row in place of its float64 copy and cumulative sum)."""
    f, v = len(rows), rows[0].numel()
    if cdf_blocks.used(rows[0], "level"):
        j, totals = cdf_blocks.Blocks(rows).index(uniforms(f * k, generator).view(f, k).tolist())
        for t in totals:
            check_total(t)
        return j
    c = torch.empty(f, v, dtype=torch.float64)
    for i, r in enumerate(rows):
        c[i].copy_(r)  # (float32 -> float64: exact)
    c = c.cumsum_(-1)
    j, total = cdf_search(c, uniforms(f * k, generator).view(f, k))
    for t in total.view(-1).tolist():
        check_total(t)
    return j.tolist()


def _whole_level_siblings(rows: list[torch.Tensor], k: int, generator: torch.Generator) -> list[list[int]]:
    """``_draws`` without replacement by inverse CDF on whole rows of at least
    ``cdf_blocks.MIN_LENGTH`` entries (MCSS's siblings at plain temperature), for a level's rows
    at once: one ``cdf_blocks.Blocks`` for the level (each drop sums one block again), the ``F k``
    uniforms in one call (the ones the rows take in turn). The same positions and generator state
    as row after row (``cdf_positions``; ``tests/propose/test_level_cdf.py``)."""
    m = min(k, rows[0].numel())
    u = uniforms(len(rows) * k, generator).view(len(rows), k).tolist()
    blocks, out = cdf_blocks.Blocks(rows), []
    for r, ur in enumerate(u):
        picks = []
        for i in range(m):
            j, total = blocks.draw(r, ur[i])
            check_total(total)
            picks.append(j)
            if i + 1 < m:
                blocks.drop(r, j)
        out.append(picks)
    return out


def device_level_draws(rows: list[torch.Tensor], k: int, generator: torch.Generator,
                       replacement: bool, length: int | None = None) -> list[list[int]]:
    """``_level_draws`` on rows that stay on an accelerator (plain temperature: a support is the
    whole row), computed there: the same tokens and generator state, one read for the level.

    The host draws parent after parent, ``m`` draws each (``k``; without replacement at most the
    support's size ``n``), each taking ``n`` exponentials: the i-th nonzero entry of a row meets
    the i-th of its draw's exponentials. Every row's ``n`` is known only on the device, so the
    host takes ``F k V`` exponentials (an upper bound) and they cross in one pinned copy; each
    draw finds its own on the device from the sizes (a cumulative sum) and the tokens and sizes
    cross back; the host then rewinds the generator and takes exactly the ``sum m n`` the host
    draws take (host work only). ``length`` (at least every row's support size, read by
    ``mtad.core.sampling.read_supports``) replaces V in that bound."""
    from mtad.core.devices import to_device

    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    x = torch.stack(rows)  # [F, V] (views of the level's warped rows)
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()  # as ``support`` does
    f, v = x.shape
    if k == 0 or f == 0:
        return [[] for _ in rows]
    if inverse_cdf(generator):
        return _device_cdf_level(x, k, generator, replacement)
    state = generator.get_state()
    e = hostfloat.exponentials(f * k * (v if length is None else min(length, v)), x.dtype, generator)
    (e_dev,) = to_device([e], x.device)
    mask = x > 0
    n = mask.sum(-1)  # [F] support sizes
    m = n.clamp_max(k) if not replacement else torch.full_like(n, k)  # draws per row
    size = m * n
    off = size.cumsum(0) - size  # [F] where each row's draws start in the stream
    rank = (mask.cumsum(-1) - 1).clamp_min(0)  # [F, V] i-th nonzero entry -> i
    masses = x.clamp_min(0)
    picks = []
    for i in range(k):
        at = (off + i * n)[:, None] + rank
        j = (masses / e_dev[at.clamp_max(e.numel() - 1)]).argmax(-1)  # [F]
        picks.append(j)
        if not replacement:
            masses = masses.scatter(1, j[:, None], 0)
    host = torch.cat(picks + [n]).cpu().tolist()  # one read: [k * F] tokens, [F] sizes
    sizes = host[k * f :]
    if length is not None and max(sizes) > length:  # a caller's length too short
        generator.set_state(state)
        raise ValueError(f"length {length} is shorter than a support ({max(sizes)} entries)")
    draws = [min(k, s) if not replacement else k for s in sizes]
    if any(s == 0 and d > 0 for s, d in zip(sizes, draws)):
        generator.set_state(state)
        raise RuntimeError("invalid multinomial distribution (masses must be >= 0, finite, not all 0)")
    taken = sum(d * s for d, s in zip(draws, sizes))
    if taken != e.numel():  # the host draws take exactly these
        generator.set_state(state)
        hostfloat.exponentials(taken, x.dtype, generator)
    return [[host[i * f + r] for i in range(d)] for r, d in enumerate(draws)]


def _device_cdf_level(x: torch.Tensor, k: int, generator: torch.Generator,
                      replacement: bool) -> list[list[int]]:  # x [F, V] on its device
    """``device_level_draws`` by inverse CDF: ``k`` uniforms per row, parent after parent (the
    host draws' order), cross in one copy; each row's draws (without replacement: over the masses
    left) and its support's size come back in one read."""
    from mtad.core.devices import to_device

    f = x.shape[0]
    (u,) = to_device([uniforms(f * k, generator)], x.device)
    u = u.view(f, k)
    masses = x.clamp_min(0)
    if replacement:
        j, total = cdf_index(masses, u, nonneg=True)  # [F, k]
    else:
        masses, picks = masses.clone(), []
        for i in range(k):
            ji, t = cdf_index(masses, u[:, i : i + 1], nonneg=True)
            total = t if i == 0 else total
            picks.append(ji)
            masses.scatter_(1, ji, 0)
        j = torch.cat(picks, 1)
    n = torch.where(total > 0, (x > 0).sum(-1, keepdim=True), 0)  # [F, 1]: no mass, no draw
    host = torch.cat([j, n], 1).cpu().tolist()  # one read
    out = []
    for row in host:
        size = row[-1]
        d = k if replacement else min(k, size)
        if size == 0 and d > 0:
            raise RuntimeError("invalid multinomial distribution (masses must be >= 0, finite, not all 0)")
        out.append(row[:d])
    return out


def iid_children(q: torch.Tensor | Support, k: int, generator: torch.Generator) -> list[int]:
    """k i.i.d. draws from q (duplicates allowed) on q's host support: k successive
    ``torch.multinomial`` draws (``mtad.core.sampling.draw``), their exponentials drawn at once."""
    return _draws(as_support(q), k, generator, replacement=True)


class Warped(NamedTuple):
    """``warped_supports``' answer for rows ``[R, V]``."""

    qs: list[Support] | torch.Tensor  # [R] what children are drawn from: host supports, or device rows
    length: int | None  # device rows: the exponentials a draw needs at most (None: V)
    rows: torch.Tensor | None  # the warped rows on an accelerator (None on the CPU)


def warped_supports(warping: Warping, logits: torch.Tensor, cdf: bool = False) -> Warped:  # logits [R, V]
    """The host supports of the warped rows (``host_supports(warping(logits), warping.support_bound)``):
    from the warping's candidates on the CPU where it has them (no dense [R, V] rows, no
    scan), else the dense rows in one transfer. On an accelerator, where the supports are
    whole rows (plain temperature: ``device_drawn``) or some goes on past the bound
    (``mtad.core.sampling.read_supports``), the warped rows themselves, left on the device
    (``device_level_draws`` draws from them), with the exponentials a draw needs at most.
    ``cdf`` (draws by inverse CDF read no support): on an accelerator the rows stay there."""
    bound = warping.support_bound
    if logits.device.type == "cpu":
        cand = warping.candidates(logits)
        if cand is not None:
            return Warped(candidate_supports(*cand, logits.shape[-1]), None, None)
        return Warped(host_supports(warping(logits), bound), None, None)
    rows = warping(logits)
    if cdf or device_drawn(rows, bound):
        return Warped(rows, None, rows)
    got, length = read_supports(rows, bound)
    if got is None:
        return Warped(rows, length, rows)
    return Warped([s for s, _ in got], None, rows)


def _draw_level(qs: list, k: int, generator: torch.Generator, replacement: bool,
                length: int | None = None) -> list[list[int]]:
    """A level's children: on the device where its rows stay there (``length``: the
    exponentials a draw needs at most, None: V), else on host supports; parent after parent
    where a level holds both (the same stream either way)."""
    on_device = [isinstance(q, torch.Tensor) for q in qs]
    if qs and all(on_device):
        return device_level_draws(qs, k, generator, replacement, length)
    if any(on_device):
        return [_draw_level([q], k, generator, replacement, length)[0] for q in qs]
    return _level_draws([as_support(q) for q in qs], k, generator, replacement)


class _TreeBuilder:
    """Adds rows to a ``TokenTree`` (which merges equal paths) and feeds new canonical rows to the draft."""

    def __init__(self, ctx: StepContext):
        self.ctx = ctx
        self.t = TokenTree()
        self.parents, self.tokens, self.canon = self.t.parents, self.t.tokens, self.t.canon
        self._draft_node: dict[int, int] = {0: ROOT}  # canonical row -> draft runner row
        root = ctx.draft.root_logits
        self.vocab = root.shape[-1]
        # canonical row -> q after it: a host support, or a device row (``warped_supports``)
        self.qs: dict[int, Support | torch.Tensor] = {}
        self.dense: dict[int, torch.Tensor] = {}  # canonical row -> its warped row, on an accelerator
        self.length: int | None = None  # the exponentials a device draw needs at most (None: V)
        self._keep([0], root[None])

    def _keep(self, rows: Sequence[int], logits: torch.Tensor) -> None:
        w = warped_supports(self.ctx.warping, logits, inverse_cdf(self.ctx.generator))
        if w.length is not None:
            self.length = max(self.length or 0, w.length)
        self.qs.update(zip(rows, w.qs))
        if w.rows is not None:  # the rows as vectors too (the walk may run on the device)
            self.dense.update(zip(rows, w.rows))

    def add(self, parent: int, token: int) -> int:
        return self.t.add(parent, token)

    def q(self, row: int) -> Support | torch.Tensor:
        return self.qs[self.canon[row]]

    def expand(self, rows: Sequence[int]) -> None:
        """One draft pass over the canonical rows among ``rows`` not fed yet; one transfer."""
        todo = [r for r in dict.fromkeys(self.canon[r] for r in rows) if r not in self._draft_node]
        if not todo:
            return
        parents = [self._draft_node[self.canon[self.parents[r]]] for r in todo]
        logits = self.ctx.draft.forward([self.tokens[r] for r in todo], parents)
        for i, r in enumerate(todo):
            self._draft_node[r] = self.ctx.draft.num_nodes - len(todo) + 1 + i
        self._keep(todo, logits)

    def tree(self, depth: int) -> TokenTree:
        qs, canon = self.qs, self.canon
        empty = Support(torch.zeros(0, dtype=torch.long), torch.zeros(0), self.vocab)
        dense = self.dense
        self.t.q = Rows(len(self.tokens), lambda r: qs.get(canon[r], empty),  # leaves: no children
                        (lambda r: dense[canon[r]]) if dense else None, ready=True)  # read when drawn
        self.t.depth = depth
        return self.t


def draft_tree(ctx: StepContext, branching: Sequence[int], sampler: ChildSampler) -> TokenTree:
    """Grow a tree level by level: every node at depth d gets ``branching[d]`` children.

    One draft forward pass per level (all distinct frontier nodes at once); the last
    level is not fed to the draft (its distributions are not needed).
    """
    b = _TreeBuilder(ctx)
    frontier = [0]
    replacement = {iid_children: True, without_replacement: False}.get(sampler)
    for d, k in enumerate(branching):
        if replacement is None:
            kids = [sampler(b.q(r), k, ctx.generator) for r in frontier]
        else:  # the same draws, parent after parent, their exponentials in one call
            kids = _draw_level([b.q(r) for r in frontier], k, ctx.generator, replacement, b.length)
        new_rows = [b.add(r, t) for r, ts in zip(frontier, kids) for t in ts]
        if not new_rows:
            break
        if d < len(branching) - 1:
            b.expand(new_rows)
        frontier = new_rows
    return b.tree(len(branching))


def draft_chains(ctx: StepContext, k: int, gamma: int) -> TokenTree:
    """k i.i.d. chain drafts of length gamma as k branches under the root (one draft pass per depth)."""
    b = _TreeBuilder(ctx)
    last = [0] * k
    for d in range(gamma):  # one draw per chain, chain after chain (exponentials in one call)
        kids = _draw_level([b.q(r) for r in last], 1, ctx.generator, replacement=True, length=b.length)
        last = [b.add(r, t[0]) for r, t in zip(last, kids)]
        if d < gamma - 1:
            b.expand(last)
    return b.tree(gamma)


def draw_without_replacement(
    q: torch.Tensor | Support,  # [V] draft distribution, or its host support
    k: int,
    generator: torch.Generator,
) -> torch.Tensor:  # [min(k, nnz(q))] distinct token ids, int64, on the host
    """k sequential draws from q, each from q renormalised after removing the tokens drawn.

    Returns fewer than k tokens when q has fewer than k nonzero entries; never
    a duplicate (Yang et al., arXiv:2401.06706, candidates without replacement).
    """
    return torch.tensor(without_replacement(q, k, generator), dtype=torch.long)


def without_replacement(q: torch.Tensor | Support, k: int, generator: torch.Generator) -> list[int]:
    """``draw_without_replacement`` as a child sampler (MCSS's siblings), as a list."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    # sequential draws on the host support (same distribution), their exponentials at once
    return _draws(as_support(q), k, generator, replacement=False)


SAMPLERS: dict[str, ChildSampler] = {"iid": iid_children, "without_replacement": without_replacement}


class Tree:
    """A tree with ``branching[d]`` children per node at depth d (``draft_tree``).

    ``sampler``: ``"iid"`` (SpecInfer, MCNS) or ``"without_replacement"`` (MCSS). A shorter
    depth (the near-end clip) keeps the first levels.
    """

    kind = "tree"  # one draft pass per depth over every node of the level
    knobs = (Knob("k_config", Rule("integers", 1, means="children per node at each depth", example="[4,2,2]"),
                  (4, 2, 2), arg="branching"),)
    depth_from = "k_config"  # the draft's depth (a decoder's gamma) is len(k_config)

    @staticmethod
    def provides(sampler: str = "iid", **_) -> tuple[str, ...]:
        return ("node_q", "iid_children" if sampler == "iid" else "siblings_without_replacement")

    def __init__(self, branching: Sequence[int], sampler: str = "iid"):
        self.branching = list(branching)
        self.sampler = SAMPLERS[sampler]

    def propose(self, ctx: StepContext, depth: int, width: int = 1) -> TokenTree:
        return draft_tree(ctx, self.branching[:depth], self.sampler)


class Chains:
    """``num_drafts`` i.i.d. chains of ``depth`` tokens under the root (``draft_chains``)."""

    kind = "chains"  # one draft pass per depth over the k chains
    knobs = (GAMMA, Knob("num_drafts", Rule("integer", 1, means="i.i.d. chains", example="4"), 4))
    provides = ("node_q", "iid_children", "iid_chains")

    def __init__(self, num_drafts: int):
        self.num_drafts = num_drafts

    def propose(self, ctx: StepContext, depth: int, width: int = 1) -> TokenTree:
        return draft_chains(ctx, self.num_drafts, depth)

"""The token tree of one decoding step: the one type proposers build, runners are fed and
verifiers walk.

Rows follow the code base's convention (``mtad.core.runner``): row 0 (``ROOT``) is the root,
the committed endpoint; nodes are rows ``1..N`` in the order added; a node's parent row is
smaller than its own (``parents[r] < r``, ``parents[0] = -1``; ``tokens[0] = -1``).

A tree may hold rows with equal token paths: i.i.d. siblings that drew the same token (and
their subtrees), beam slots drawn twice. ``canon[r]`` is the first row with row ``r``'s
path. Rows with equal paths have equal model outputs, so only canonical rows are fed to a
model (``feed_rows``); a verifier still sees every row (for the multi-draft rules the
multiset of candidates is what makes them lossless). The (parent, token) merge is written
once, in ``add``: a new row's canonical row is the first row under the same canonical parent
with the same token. ``node`` adds a row only when its path is new (a deduplicated tree:
beam trees, enumeration trees), ``dedup`` keeps the canonical rows of a tree, renumbered.

Besides the rows a tree carries what its proposer knows about it: ``q`` (the warped draft
distribution each row's children were drawn from, as ``[N+1, V]`` rows: a tensor or
``mtad.core.sampling.Rows``, row ``i`` for row ``i``; ``None`` when the proposer has none),
``depth`` (the depth drafted), ``beams`` (``Beams``: beam sampling's slots, their tree rows,
cumulative draft log-likelihoods and ancestry; ``None`` unless a beam proposer made the tree)
and ``info`` (a proposer's notes, e.g. BiLD's fallback).

``Beams`` is defined here, beside the tree that carries it, because two layers meet through
it: the beam proposer (``mtad.propose.beam.Beam``) fills it and MTAD's threshold rules
(``mtad.verify.threshold``) read it; neither imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from mtad.core.protocols import ROOT
from mtad.core.sampling import (
    Rows,
    Support,
    candidate_supports,
    device_drawn,
    host_support,
    read_supports,
)
from mtad.core.warping import Warping


class Beams:
    """The beam-sampling history of one step (depths 0-based: ``t = 0 .. gamma - 1``).

    Glossary (``mtad.propose.beam`` has the sampling itself): a *slot* is a beam's index at
    one depth (``0 .. n_t - 1``); ``parents[t][i]`` is the slot at depth ``t - 1`` that slot
    ``i`` at depth ``t`` extends (``-1`` at depth 0), and following it back gives a beam's
    *ancestry* (the draws re-permute the beams at every depth, so slot numbers alone do not);
    the *weight* is the renormalised beam score (it ranks the final beams); the *cumulative
    log Q* is the raw draft log-likelihood of a beam's prefix.

    Two forms, the same values: host tensors per depth (``Beams(tokens=..., ...)``: the tensor
    paths append to the lists), or Python lists added depth by depth (``Beams.on_host()`` and
    ``add``: the CPU's host bookkeeping, ``mtad.propose.beam._HostBeams``), whose tensors
    (``tokens``, ``parents``, ``cum_logq``, ``weights``) are made only when read. The rules' reads
    (``best``, ``ancestry``, ``path_tokens``, ``path_cum_logq``) take the lists where there are,
    and make no tensor but the path's cumulative log Q.
    """

    def __init__(self, tokens: list[torch.Tensor], parents: list[torch.Tensor], cum_logq: list[torch.Tensor],
                 weights: torch.Tensor | None, rows: list[list[int]] | None = None):
        self._tokens = tokens  # per depth t: [n_t] long, token of each slot (host)
        self._parents = parents  # per depth t: [n_t] long, slot at depth t-1 (-1 at t = 0) (host)
        self._cum_logq = cum_logq  # per depth t: [n_t] raw cumulative draft log-likelihood (host)
        self._weights = weights  # [n_{gamma-1}] final renormalised beam weights (host)
        self.rows: list[list[int]] = [] if rows is None else rows  # per depth t: [n_t] tree row of each slot
        self._host: _HostLists | None = None

    @classmethod
    def on_host(cls) -> Beams:
        """An empty history in the host form (``add`` per depth, ``set_weights`` at the end)."""
        b = cls(None, None, None, None)
        b._host = _HostLists([], [], [], [], None, None)
        return b

    def add(self, tokens: list[int], parents: list[int], cum: list[float], cdtype: torch.dtype) -> None:
        """The host form's next depth: its slots' tokens, parents (-1 at depth 0) and cumulative
        log Q (Python floats holding values of ``cdtype``)."""
        h = self._host
        h.tokens.append(tokens)
        h.parents.append(parents)
        h.cum.append(cum)
        h.cdtypes.append(cdtype)
        self._tokens = self._parents = self._cum_logq = None  # tensors made again on a read

    def set_weights(self, weights: list[float], dtype: torch.dtype) -> None:
        self._host.weights, self._host.wdtype = weights, dtype
        self._weights = None

    @property
    def tokens(self) -> list[torch.Tensor]:
        if self._tokens is None:
            self._tokens = [torch.tensor(x) for x in self._host.tokens]
        return self._tokens

    @property
    def parents(self) -> list[torch.Tensor]:
        if self._parents is None:
            self._parents = [torch.tensor(x) for x in self._host.parents]
        return self._parents

    @property
    def cum_logq(self) -> list[torch.Tensor]:
        if self._cum_logq is None:
            self._cum_logq = [torch.tensor(x, dtype=d) for x, d in zip(self._host.cum, self._host.cdtypes)]
        return self._cum_logq

    @property
    def weights(self) -> torch.Tensor:
        if self._weights is None:
            self._weights = torch.tensor(self._host.weights, dtype=self._host.wdtype)
        return self._weights

    @weights.setter
    def weights(self, value: torch.Tensor) -> None:  # the tensor paths' final weights
        self._weights = value

    @property
    def gamma(self) -> int:
        return len(self._host.tokens) if self._host is not None else len(self._tokens)

    def best(self) -> int:
        """Slot of the final beam with the largest weight (first on ties): ``torch.argmax``'s."""
        if self._host is None:
            return int(torch.argmax(self.weights))
        w = self._host.weights
        nan = [i for i, x in enumerate(w) if x != x]  # torch.argmax takes a NaN as the largest
        return nan[0] if nan else w.index(max(w))

    def ancestry(self, slot: int) -> list[int]:
        """Slots, depth 0 .. gamma-1, of the final beam ``slot`` and its ancestors."""
        par = self._host.parents if self._host is not None else None
        slots = [slot]
        for t in range(self.gamma - 1, 0, -1):
            slots.append((par[t] if par is not None else self._parents[t].tolist())[slots[-1]])
        return slots[::-1]

    def path_tokens(self, slot: int) -> list[int]:
        if self._host is not None:
            return [self._host.tokens[t][s] for t, s in enumerate(self.ancestry(slot))]
        return [self.tokens[t].tolist()[s] for t, s in enumerate(self.ancestry(slot))]

    def path_cum_logq(self, slot: int) -> torch.Tensor:  # [gamma]
        if self._host is not None:
            cum, dtypes = self._host.cum, self._host.cdtypes
        else:
            cum, dtypes = [c.tolist() for c in self._cum_logq], [c.dtype for c in self._cum_logq]
        return torch.tensor([cum[t][s] for t, s in enumerate(self.ancestry(slot))],
                            dtype=dtypes[0] if dtypes else torch.float32)  # the same values (exact)


@dataclass
class _HostLists:
    """``Beams``' host form: per depth its slots' tokens, parents, cumulative log Q and that
    depth's dtype; the final weights and their dtype."""

    tokens: list[list[int]]
    parents: list[list[int]]
    cum: list[list[float]]
    cdtypes: list[torch.dtype]
    weights: list[float] | None
    wdtype: torch.dtype | None


@dataclass
class TokenTree:
    parents: list[int] = field(default_factory=lambda: [-1])  # [N+1], parents[0] = -1
    tokens: list[int] = field(default_factory=lambda: [-1])  # [N+1], tokens[0] = -1 (the endpoint)
    canon: list[int] = field(default_factory=lambda: [0])  # [N+1] first row with the same path
    depths: list[int] = field(default_factory=lambda: [0])  # [N+1] 0 for the root
    q: torch.Tensor | Rows | None = None  # row r: the warped draft row r's children came from
    depth: int = 0  # depth drafted (a chain's length)
    beams: Beams | None = None  # beam sampling's history, when a beam proposer made the tree
    info: dict = field(default_factory=dict)
    _index: dict = field(default_factory=dict, repr=False)  # (canonical parent, token) -> row

    # ------------------------------------------------------------------ building
    def add(self, parent: int, token: int) -> int:
        """Append a row under ``parent``; its canonical row is found by the (parent, token) merge."""
        token = int(token)
        r = len(self.tokens)
        self.parents.append(int(parent))
        self.tokens.append(token)
        self.depths.append(self.depths[parent] + 1)
        self.canon.append(self._index.setdefault((self.canon[parent], token), r))
        return r

    def node(self, parent: int, token: int) -> int:
        """The canonical row of (parent, token), added when the path is new."""
        r = self._index.get((self.canon[parent], int(token)))
        return r if r is not None else self.add(parent, token)

    @classmethod
    def chain(cls, tokens: Sequence[int], q: torch.Tensor | Rows | None = None) -> TokenTree:
        """A chain: token ``i`` is row ``i + 1`` under row ``i``."""
        tree = cls(q=q, depth=len(tokens))
        for i, t in enumerate(tokens):
            tree.add(i, t)
        return tree

    # ------------------------------------------------------------------ reading
    @property
    def size(self) -> int:
        return len(self.tokens) - 1

    @property
    def unique_rows(self) -> list[int]:
        return [r for r in range(1, len(self.tokens)) if self.canon[r] == r]

    def path(self, row: int) -> list[int]:
        """Rows from the root's child down to ``row`` (empty for the root)."""
        out = []
        while row != ROOT:
            out.append(row)
            row = self.parents[row]
        return out[::-1]

    def path_tokens(self, path: Sequence[int]) -> list[int]:
        return [self.tokens[r] for r in path]

    def feed_rows(self) -> tuple[list[int], list[int], list[int]]:
        """(canonical rows, their tokens, their parents' rows) for a runner fed only the
        canonical rows: they become its rows ``1..U`` in order (``ROOT`` stays 0)."""
        rows = self.unique_rows
        node = {ROOT: ROOT}
        for i, r in enumerate(rows):
            node[r] = i + 1
        return rows, [self.tokens[r] for r in rows], [node[self.canon[self.parents[r]]] for r in rows]

    def dedup(self) -> tuple[TokenTree, list[int]]:
        """The tree of the canonical rows, renumbered in order, and each row's row in it."""
        out = TokenTree(depth=self.depth, beams=self.beams, info=self.info)
        new = {ROOT: ROOT}
        for r in self.unique_rows:
            new[r] = out.add(new[self.canon[self.parents[r]]], self.tokens[r])
        return out, [new[c] for c in self.canon]


def warped_rows(
    tree: TokenTree,
    warping: Warping,
    root: torch.Tensor,  # [V] logits after the root (row 0)
    logits: torch.Tensor,  # [M, V] logits after the canonical rows in ``pos`` (on the CPU: any rows by index)
    pos: dict[int, int],  # canonical row -> its row of ``logits``
    stay: bool = False,  # an accelerator: keep the rows there as vectors without reading their hints
    done: dict[int, torch.Tensor] | None = None,  # canonical row -> its warped row already made (the CPU)
) -> Rows:  # [N+1] host supports of the warped rows; a row without logits (a leaf) is empty
    """A model's warped distribution after every row of ``tree``, read lazily onto the host.

    On the CPU a row is warped when first read (a verifier reads only the rows on its
    path); on an accelerator the first read warps every row and brings their supports to
    the host in one transfer, or, where the supports are whole rows (plain temperature:
    ``mtad.core.sampling.device_drawn``) or that read shows one longer than the warping's
    bound (``mtad.core.sampling.read_supports``: top-p alone with a wide nucleus), or where
    ``stay`` says so without that read (beam drafting: a depth's scores already ran past the
    hint), keeps the warped rows on the device as vectors (the multi-draft walk then reads scalars:
    ``mtad.verify.devicewalk``). On an accelerator the rows are also there as vectors
    (``Rows.device_row``) for a walk on the device. Rows with equal paths share their
    canonical row's support. On the CPU a row in ``done`` (a beam's draws warped it already:
    ``mtad.propose.beam._slot_then_row``, the same warping of the same logits) is not warped again.
    """
    bound = warping.support_bound
    done = done or {}
    canon = tree.canon  # read, not ``tree``: the rows hold no reference to the tree (no cycle
    # through ``tree.q``, which would keep the step's logits until a garbage collection)
    warped: dict[int, Support | torch.Tensor] = {}  # canonical row -> host support (or device row)
    dense: dict[int, torch.Tensor] = {}  # canonical row -> its warped row, on an accelerator
    vocab = root.shape[-1]

    def empty() -> Support:
        return Support(torch.zeros(0, dtype=torch.long), torch.zeros(0), vocab)

    full: list[torch.Tensor] = []  # [N'+1, V] on an accelerator, once warped

    def warp() -> torch.Tensor:  # an accelerator: every row at once, as vectors (no read)
        if not full:
            full.append(warping(torch.cat([root[None], logits])))
            dense.update(zip([ROOT, *pos], full[0]))
        return full[0]

    def every() -> None:  # their host supports, or the vectors where a support is long
        rows = warp()
        got = None
        if not (stay or device_drawn(rows, bound)):
            got, _ = read_supports(rows, bound)  # one transfer
        warped.update(zip([ROOT, *pos], rows if got is None else [s for s, _ in got]))

    def row(r: int) -> Support | torch.Tensor:
        c = canon[r]
        if c != ROOT and c not in pos:
            return empty()
        if c not in warped:
            if root.device.type == "cpu":
                x = root if c == ROOT else logits[pos[c]]
                cand = warping.candidates(x[None])  # no dense row where the warping is sparse
                warped[c] = (candidate_supports(*cand, x.shape[-1])[0] if cand is not None
                             else host_support(done[c] if c in done else warping(x), bound))
            else:
                every()
        return warped[c]

    def device_row(r: int) -> torch.Tensor:
        warp()
        c = canon[r]
        if c != ROOT and c not in pos:
            return torch.zeros_like(dense[ROOT])  # a row without logits (a leaf): no mass
        return dense[c]

    return Rows(len(tree.tokens), row, device_row if root.device.type != "cpu" else None)

"""The target's pass over a drafted token tree, written once: one pass, logits after every node.

Every verifier in ``mtad.verify`` is this scorer and an acceptance rule, kept apart as vLLM
keeps its scorer apart from its rejection sampler: ``score(ctx, tree)`` feeds the tree's
distinct nodes to the target in one pass (``ctx.target.forward``) and returns ``Scores``; the
rule reads from it what it needs and decides what to emit:

* ``Scores.p``: the warped target distributions ``[U+1, V]`` on the logits' device (SpD,
  typical acceptance, MTAD's thresholds; for a chain, row ``i`` scores draft token ``i``);
* ``Scores.candidates()``: on the CPU, ``p`` by its candidates without the dense rows
  (``Warping.candidates``), and what reads through them: ``Scores.masses`` (``p`` at given
  rows and tokens, on the host) and ``Scores.sample`` (one draw from a row); both read ``p``
  itself on an accelerator or where the warping has no candidates (MTAD's thresholds);
* ``Scores.rows()``: the same per row of the drafted tree, as host supports read lazily
  (``mtad.core.tree.warped_rows``; the multi-draft walks);
* ``Scores.logits``: the raw logits ``[U+1, V]`` (BiLD's rollback reads a plain softmax);
* ``Scores.fed()``: the scored tokens (and parent rows) on the logits' device, the pass's own
  copy (``mtad.core.runner.fed_tensors``: no host-to-device copy);
* ``Scores.then(row, token)``: one more target pass, ``token`` under a scored row (BiLD's
  rollback runs the target once more).

Numbering: the target scores the tree's distinct nodes (``TokenTree.dedup``: rows with equal
paths have equal logits), ``Scores.nodes``, in row order; scored row 0 is the root (the
committed endpoint) and ``Scores.node[r]`` is the scored row of tree row ``r``. A chain is its
own node tree. Which of a tree's rows a verifier scores is the rule's: a tree rule scores the
drafted tree, MTAD's chain rule the best beam's path (``TokenTree.chain``).

Devices: the pass's logits stay on the target's (last) device; ``p`` is warped there; nothing
crosses to the host here except through ``rows()`` (one transfer for the whole tree on an
accelerator, lazily per visited row on the CPU), ``masses`` (one transfer) and ``sample``
(``mtad.core.sampling.sample``'s reads). Host-to-device: the runner's one pinned copy
per pass.

This module knows the runner protocol (``mtad.core.protocols.TreeRunner``) and the token tree,
nothing of how a tree was drafted or how a rule accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mtad.core.protocols import StepContext
from mtad.core.runner import fed_tensors
from mtad.core.sampling import Rows, candidate_supports, sample, sizes_first, support_sizes
from mtad.core.tree import TokenTree, warped_rows


@dataclass
class Scores:
    """The target's pass over a tree (see the module docstring)."""

    ctx: StepContext
    tree: TokenTree  # the tree scored (its rows, with duplicates)
    nodes: TokenTree  # its distinct nodes: the target's rows 1..U, in order
    node: list[int]  # [N+1] scored row of each tree row (0 for the root)
    root: torch.Tensor  # [V] logits after the root
    body: torch.Tensor  # [U, V] logits after nodes 1..U
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def device(self) -> torch.device:
        return self.body.device

    @property
    def logits(self) -> torch.Tensor:  # [U+1, V] row 0: the root
        if "logits" not in self._cache:  # no scored node (a BiLD run that fell back at once): the root, no copy
            self._cache["logits"] = torch.cat([self.root[None], self.body]) if len(self.body) else self.root[None]
        return self._cache["logits"]

    @property
    def p(self) -> torch.Tensor:  # [U+1, V] warped, on the logits' device
        if "p" not in self._cache:
            parts = self._cache.get("p_parts")
            self._cache["p"] = torch.cat(parts) if parts else self.ctx.warping(self.logits)
        return self._cache["p"]

    def row_wise(self) -> bool:
        """Whether the warping is a softmax row by row (plain temperature: no top-k, no top-p),
        so the root's and the body's rows warp apart into the very values ``p`` holds (a
        softmax reads one row at a time; ``tests/verify/test_score.py`` compares them) and no
        ``[U+1, V]`` concatenation of the logits is made."""
        w = self.ctx.warping
        return not w.greedy and w.top_k == 0 and w.top_p >= 1.0 and "p" not in self._cache and len(self.body) > 0

    def _parts(self) -> tuple[torch.Tensor, torch.Tensor]:  # [1, V] after the root, [U, V] after the body
        if "p_parts" not in self._cache:
            self._cache["p_parts"] = (self.ctx.warping(self.root[None]), self.ctx.warping(self.body))
        return self._cache["p_parts"]

    def _warped_row(self, row: int) -> torch.Tensor:  # [V] ``p[row]`` warped alone, kept (row-wise, CPU)
        rows = self._cache.setdefault("p_rows", {})
        if row not in rows:
            rows[row] = self.ctx.warping((self.root if row == 0 else self.body[row - 1])[None])[0]
        return rows[row]

    def _warp_rows(self, wanted: list[int]) -> None:
        """``_warped_row`` of every row in ``wanted`` (row-wise, CPU), in as few warping calls as
        the rows allow: the root alone, the body's from the first wanted row to the last in one
        call on that slice of the logits (a view: no copy), where that span holds no more than
        twice the wanted rows (its rows in between are kept too), else row by row. With top-p
        (``nucleus_rows``: a row's nucleus costs many passes over it, and a call's own work is
        more than a softmax's) no row in between is warped and every wanted row, the root's
        included, is warped in one call: the body's as a slice where they follow one another and
        the root's is not wanted, else gathered. The same values: a softmax, and a nucleus, read
        one row at a time (``tests/verify/test_score.py``)."""
        rows = self._cache.setdefault("p_rows", {})
        todo = sorted({r for r in wanted if r not in rows})
        if len(todo) > 1 and self.nucleus_rows():
            body = [r for r in todo if r > 0]
            if todo[0] > 0 and body[-1] - body[0] + 1 == len(body):
                x = self.body[body[0] - 1 : body[-1]]  # a view
            else:
                x = self.body.index_select(0, torch.tensor(body) - 1)
                x = torch.cat([self.root[None], x]) if todo[0] == 0 else x
            rows.update(zip(todo, self.ctx.warping(x).unbind(0)))
            return
        if 0 in wanted and 0 not in rows:
            rows[0] = self.ctx.warping(self.root[None])[0]
        body = sorted({r for r in wanted if r > 0 and r not in rows})
        if len(body) > 1 and body[-1] - body[0] + 1 <= 2 * len(body):
            lo, hi = body[0], body[-1]
            for r, row in enumerate(self.ctx.warping(self.body[lo - 1 : hi]).unbind(0), start=lo):
                rows.setdefault(r, row)
        for r in body:
            self._warped_row(r)

    def nucleus_rows(self) -> bool:
        """Whether the warping is top-p alone (no top-k), whose rows warp one at a time into the
        very values ``p`` holds (each row's own nucleus, then its softmax: no value of one row
        depends on another's; ``tests/verify/test_score.py`` compares them)."""
        w = self.ctx.warping
        return not w.greedy and w.top_k == 0 and w.top_p < 1.0 and "p" not in self._cache and len(self.body) > 0

    def lazy_rows(self) -> bool:
        """Row-wise warping on the CPU: each row of ``p`` is warped when a rule first reads it
        (``_warped_row``), so a tree rule that reads its edges' masses normalises the rows
        of its nodes' parents and the row it draws from, not its leaves' (the same values:
        a softmax, and at top-p alone a nucleus, read one row at a time). On an accelerator the
        root and the body warp in two calls (``_parts``) at plain temperature, and every row at
        once at top-p: no host read of which rows are wanted."""
        return self.device.type == "cpu" and (self.row_wise() or self.nucleus_rows())

    def p_row(self, row: int) -> torch.Tensor:  # [V] ``p[row]``
        if self.lazy_rows():
            return self._warped_row(row)
        if self.row_wise():
            root, body = self._parts()
            return root[0] if row == 0 else body[row - 1]
        return self.p[row]

    def candidates(self) -> tuple[torch.Tensor, torch.Tensor] | None:  # ids, probs [U+1, c]
        """``p`` by its candidates on the CPU, without the dense rows: ``Warping.candidates`` of
        the same ``[U+1, V]`` logits (``p`` is zero outside ``ids`` and equals ``probs`` there,
        the very values ``p`` holds). None on an accelerator or where the warping has none
        (no top-k, many ties): read ``p`` then."""
        if "candidates" not in self._cache:
            warping, cand = self.ctx.warping, None
            if not warping.greedy and not 0 < warping.top_k < self.root.shape[-1]:
                pass  # no top-k: none (``warp_candidates``), read without concatenating the logits
            elif self.device.type == "cpu" and warping.greedy and "logits" not in self._cache:
                # the argmax of each row: row by row, so the root and the body need no concatenation
                root, body = warping.candidates(self.root[None]), warping.candidates(self.body)
                cand = torch.cat([root[0], body[0]]), torch.cat([root[1], body[1]])
            elif self.device.type == "cpu":
                cand = warping.candidates(self.logits)
            self._cache["candidates"] = cand
        return self._cache["candidates"]

    def row_candidates(self, row: int) -> tuple[torch.Tensor, torch.Tensor]:  # ids, probs [1, c]
        """``Warping.candidates`` of row ``row`` alone, kept: greedy on the CPU, where a row's
        candidates do not depend on the rows warped with it (its argmax, probability 1), so a
        rule that reads a few rows of a tree pays for those rows only."""
        rows = self._cache.setdefault("row_candidates", {})
        if row not in rows:
            rows[row] = self.ctx.warping.candidates((self.root if row == 0 else self.body[row - 1])[None])
        return rows[row]

    def argmax(self, row: int) -> int:
        """Greedy on the CPU: ``p[row]``'s one token (``row_candidates``)."""
        return int(self.row_candidates(row)[0][0, 0])

    def sample(self, row: int, generator: torch.Generator) -> int:
        """One draw from ``p[row]`` (``mtad.core.sampling.sample``): on the host support read from
        the candidates where there are some (the same support, so the same token), else from
        ``p`` (on an accelerator as ``sample`` draws there). Greedy on the CPU, unless every
        row's candidates were taken already: that row's own (``row_candidates``)."""
        if self.device.type == "cpu" and self.ctx.warping.greedy and "candidates" not in self._cache:
            ids, probs = self.row_candidates(row)
            return sample(candidate_supports(ids, probs, self.body.shape[-1])[0], generator)
        cand = self.candidates()
        if cand is not None:
            return sample(candidate_supports(cand[0][row : row + 1], cand[1][row : row + 1],
                                             self.body.shape[-1])[0], generator)
        sizes = self._cache.get("sizes")  # read with the masses (top-p alone on an accelerator)
        return sample(self.p_row(row), generator, self.ctx.warping.support_bound, sizes[row] if sizes else None)

    def masses(self, rows: torch.Tensor, tokens: torch.Tensor, log: bool = False) -> torch.Tensor:
        """``p[rows, tokens]`` (their logarithms if ``log``) on the host: gathered from the
        candidates on the CPU, else on the logits' device (``rows`` / ``tokens`` there, e.g.
        ``fed()``'s), the logarithms taken there, crossing in one transfer. With top-p alone
        on an accelerator (``Warping.support_hinted``: a nucleus may run far past the hint)
        every row's support size crosses in that transfer too, kept for ``sample``: a rule's
        final draw from a long support then needs no read of its hint first."""
        cand = self.candidates()
        if cand is None and self.lazy_rows():  # plain temperature or top-p alone on the CPU: the rows read only
            pairs = list(zip(rows.tolist(), tokens.tolist()))
            if not pairs:
                return torch.empty(0, dtype=torch.float64 if self.root.dtype == torch.float64 else torch.float32)
            self._warp_rows([r for r, _ in pairs])
            # read through numpy (a warped row is float32 or float64: ``warp_probs``): no torch call per mass
            arrays = {r: self._warped_row(r).numpy() for r in dict.fromkeys(r for r, _ in pairs)}
            m = torch.tensor([float(arrays[r][t]) for r, t in pairs], dtype=self._warped_row(pairs[0][0]).dtype)
            return m.log() if log else m
        if cand is None and self.row_wise():  # plain temperature: gathered from the two parts
            root, body = self._parts()
            m = torch.where(rows == 0, root[0, tokens], body[(rows - 1).clamp_min(0), tokens])
            return (m.log() if log else m).cpu()
        if cand is None:
            m = self.p[rows, tokens]
            m = m.log() if log else m
            if not sizes_first(self.body, self.ctx.warping.support_hinted):
                return m.cpu()
            host = torch.cat([m.reshape(-1), support_sizes(self.p).to(m.dtype)]).cpu()  # one transfer
            self._cache["sizes"] = [int(v) for v in host[m.numel() :].tolist()]
            return host[: m.numel()].reshape(m.shape)
        ids, probs = cand[0][rows], cand[1][rows]  # [n, c]: each row's candidates
        m = torch.where(ids == tokens[:, None], probs, 0).sum(-1)  # one match at most: exact
        return m.log() if log else m

    def rows(self) -> Rows:  # [N+1] host supports of the warped p after every tree row
        """``p`` per row of the drafted tree, read lazily onto the host (``warped_rows``)."""
        pos = {r: self.node[r] - 1 for r in self.tree.unique_rows}
        return warped_rows(self.tree, self.ctx.warping, self.root, self.body, pos)

    def fed(self, parents: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The scored nodes' tokens [U] (and parent rows [U]) on the logits' device: the pass's
        own copy while it is the target's last pass (read it before ``then``)."""
        return fed_tensors(self.ctx.target, self.nodes.tokens[1:],
                           self.nodes.parents[1:] if parents else None, self.device)

    def then(self, row: int, token: int) -> torch.Tensor:  # [V]
        """One more target pass: the logits after ``token`` placed under scored row ``row``."""
        return self.ctx.target.forward([token], [row])[0]


def score(ctx: StepContext, tree: TokenTree) -> Scores:
    """One target pass over the distinct nodes of ``tree``; its logits after every node."""
    nodes, node = tree.dedup()
    body = ctx.target.forward(nodes.tokens[1:], nodes.parents[1:])  # [U, V], rows 1..U
    return Scores(ctx, tree, nodes, node, ctx.target.root_logits, body)  # root after the pass


def chain_tokens(tree: TokenTree, rule: str) -> list[int]:
    """The tokens of a chain tree (row ``i + 1`` under row ``i``); ValueError for another shape."""
    g = len(tree.tokens) - 1
    if tree.parents != [-1, *range(g)]:
        raise ValueError(
            f"{rule} verifies a chain (one row per depth, as mtad.propose.chain drafts); "
            f"got a tree of {g} rows over {tree.depth} depths")
    return tree.tokens[1:]


def chain_masses(
    draft_tokens: list[int],  # [g]
    *dists: torch.Tensor,  # each [>= g, V]: row i scores draft_tokens[i]
    x: torch.Tensor | None = None,  # [g] the tokens already on a device (a pass's own copy)
    extra: torch.Tensor | None = None,  # [n] integer values on the first dist's device, read along
) -> list[list[float]]:  # per dist: [g] masses p_i(x_i); then ``extra``'s values, if given
    """Every dist's mass at the chain's tokens, gathered on the first dist's device: one
    transfer (and one host-to-device copy of the tokens unless ``x`` is given). ``extra``
    (support sizes: counts below 2**24, exact in any float dtype of the masses) crosses in
    the same transfer and comes last, as Python ints."""
    g = len(draft_tokens)
    if g == 0:
        return [[] for _ in dists] + ([[int(v) for v in extra.tolist()]] if extra is not None else [])
    dev = dists[0].device
    dtype = dists[0].dtype
    for d in dists[1:]:
        dtype = torch.promote_types(dtype, d.dtype)
    rows = torch.arange(g, device=dev)
    x = x.to(dev) if x is not None else torch.tensor(draft_tokens, dtype=torch.long, device=dev)
    gathered = torch.stack([d.to(dev)[rows, x].to(dtype) for d in dists])  # [len(dists), g]
    if extra is None:
        return gathered.cpu().tolist()
    host = torch.cat([gathered.flatten(), extra.to(dtype)]).cpu().tolist()  # one transfer
    n = len(dists) * g
    return [host[i * g : (i + 1) * g] for i in range(len(dists))] + [[int(v) for v in host[n:]]]

"""Drafting token trees on the draft model and scoring them with one target pass.

Shared by the tree decoders (SpecInfer, MCSS, MCNS, SpecTr). Rows follow the code
base's token-tree convention (``mtad.core.runner``): row 0 is the root (the endpoint),
rows 1..N are nodes in the order drafted, ``parents[r] < r``. A tree may hold rows
with equal token paths (i.i.d. siblings); only their canonical rows are fed to the
models, so a runner's rows are this tree's canonical rows, renumbered.

Devices: the draft's warped rows of one depth cross to the host together (one transfer
per depth, ``mtad.core.sampling.host_supports``), where children are drawn; the tree keeps
those host supports as its ``q``. ``score_tree`` brings the target's warped rows across
in one transfer on an accelerator (on the CPU it warps the rows a walk reads, lazily).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from mtad.core.decoder import StepContext, sample
from mtad.core.protocols import ROOT
from mtad.core.sampling import Rows, Support, as_support, draw, host_support, host_supports

# (q [V] or its host support, k, generator) -> child tokens
ChildSampler = Callable[[torch.Tensor | Support, int, torch.Generator], list[int]]


def iid_children(q: torch.Tensor | Support, k: int, generator: torch.Generator) -> list[int]:
    """k i.i.d. draws from q (duplicates allowed), one draw at a time on q's host support."""
    ids, vals = as_support(q)[:2]
    return [int(draw(ids, vals, generator)[0]) for _ in range(k)]


@dataclass
class TokenTree:
    parents: list[int]  # [N+1], parents[0] = -1
    tokens: list[int]  # [N+1], tokens[0] = -1 (the root is the committed endpoint)
    q: Rows  # [N+1] host supports of the warped draft rows each row's children were drawn from (empty for leaves)
    depth: int
    # canon[r]: the first row with the same token path as row r. Rows with equal paths (i.i.d.
    # siblings that drew the same token, and their subtrees) have equal model outputs, so only
    # canonical rows are fed to the models; the verifiers still see every row (the multiset of
    # candidates is what makes them lossless).
    canon: list[int] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.tokens) - 1

    @property
    def unique_rows(self) -> list[int]:
        return [r for r in range(1, len(self.tokens)) if self.canon[r] == r]

    def path_tokens(self, path: Sequence[int]) -> list[int]:
        return [self.tokens[r] for r in path]


class _TreeBuilder:
    """Adds rows, maps each to its canonical row, and feeds new canonical rows to the draft."""

    def __init__(self, ctx: StepContext):
        self.ctx = ctx
        self.bound = ctx.warping.support_bound
        self.parents, self.tokens, self.canon = [-1], [-1], [0]
        self._by_key: dict[tuple[int, int], int] = {}
        self._draft_node: dict[int, int] = {0: ROOT}  # canonical row -> draft runner row
        q_root = ctx.warping(ctx.draft.root_logits)
        self.vocab = q_root.shape[-1]
        self.qs: dict[int, Support] = {0: host_support(q_root, self.bound)}  # canonical row -> q after it

    def add(self, parent: int, token: int) -> int:
        self.parents.append(parent)
        self.tokens.append(int(token))
        r = len(self.tokens) - 1
        key = (self.canon[parent], int(token))
        self.canon.append(self._by_key.setdefault(key, r))
        return r

    def q(self, row: int) -> Support:
        return self.qs[self.canon[row]]

    def expand(self, rows: Sequence[int]) -> None:
        """One draft pass over the canonical rows among ``rows`` not fed yet; one transfer."""
        todo = [r for r in dict.fromkeys(self.canon[r] for r in rows) if r not in self._draft_node]
        if not todo:
            return
        parents = [self._draft_node[self.canon[self.parents[r]]] for r in todo]
        logits = self.ctx.draft.forward([self.tokens[r] for r in todo], parents)
        supports = host_supports(self.ctx.warping(logits), self.bound)
        for i, r in enumerate(todo):
            self._draft_node[r] = self.ctx.draft.num_nodes - len(todo) + 1 + i
            self.qs[r] = supports[i]

    def tree(self, depth: int) -> TokenTree:
        qs, canon = self.qs, self.canon
        empty = Support(torch.zeros(0, dtype=torch.long), torch.zeros(0), self.vocab)
        q = Rows(len(self.tokens), lambda r: qs.get(canon[r], empty))  # leaves: no children
        return TokenTree(self.parents, self.tokens, q, depth, self.canon)


def draft_tree(ctx: StepContext, branching: Sequence[int], sampler: ChildSampler) -> TokenTree:
    """Grow a tree level by level: every node at depth d gets ``branching[d]`` children.

    One draft forward pass per level (all distinct frontier nodes at once); the last
    level is not fed to the draft (its distributions are not needed).
    """
    b = _TreeBuilder(ctx)
    frontier = [0]
    for d, k in enumerate(branching):
        new_rows = [b.add(r, t) for r in frontier for t in sampler(b.q(r), k, ctx.generator)]
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
    for d in range(gamma):
        last = [b.add(r, sample(b.q(r), ctx.generator)) for r in last]
        if d < gamma - 1:
            b.expand(last)
    return b.tree(gamma)


def score_tree(ctx: StepContext, tree: TokenTree) -> Rows:  # [N+1] host supports of warped p
    """One target pass over the tree's distinct nodes; warped p for every row (row 0 = root).

    On the CPU a row is warped when first read (a verifier reads only the rows on its
    path); on an accelerator the first read warps every row and brings their supports to
    the host in one transfer.
    """
    rows = tree.unique_rows
    node = {0: ROOT}
    for i, r in enumerate(rows):
        node[r] = i + 1  # target runner row
    logits = ctx.target.forward([tree.tokens[r] for r in rows],
                                [node[tree.canon[tree.parents[r]]] for r in rows])
    root = ctx.target.root_logits
    bound = ctx.warping.support_bound
    pos = {r: i for i, r in enumerate(rows)}
    warped: dict[int, Support] = {}  # canonical row -> host support of warped p

    def row(r: int) -> Support:
        c = tree.canon[r]
        if c not in warped:
            if root.device.type == "cpu":
                warped[c] = host_support(ctx.warping(root if c == 0 else logits[pos[c]]), bound)
            else:  # every row at once: one transfer
                every = host_supports(ctx.warping(torch.cat([root[None], logits])), bound)
                warped.update(zip([0, *rows], every))
        return warped[c]

    return Rows(len(tree.tokens), row)


def check_branching(field_name: str, value) -> list[int]:
    try:
        ks = [int(k) for k in value]
    except TypeError as e:
        raise ValueError(f"{field_name} must be a list of positive integers, e.g. [4, 2, 2]; got {value!r}") from e
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"{field_name} must be a non-empty list of integers >= 1, e.g. [4, 2, 2]; got {value!r}")
    return ks

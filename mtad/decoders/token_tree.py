"""Drafting token trees on the draft model and scoring them with one target pass.

Shared by the tree decoders (SpecInfer, MCSS, MCNS, SpecTr). Rows follow the
layout of ``mtad.multidraft``: row 0 is the root (the endpoint), rows 1..N are
nodes in the order drafted, ``parents[r] < r``; runner node ids are ``row - 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from mtad.decoders.base import StepContext, sample
from mtad.runner import ROOT

# (q [V], k, generator) -> child tokens
ChildSampler = Callable[[torch.Tensor, int, torch.Generator], list[int]]


def iid_children(q: torch.Tensor, k: int, generator: torch.Generator) -> list[int]:
    """k i.i.d. draws from q (duplicates allowed)."""
    return [sample(q, generator) for _ in range(k)]


@dataclass
class TokenTree:
    parents: list[int]  # [N+1], parents[0] = -1
    tokens: list[int]  # [N+1], tokens[0] = -1 (the root is the committed endpoint)
    q: torch.Tensor  # [N+1, V] warped draft distribution each row's children were drawn from (0 for leaves)
    depth: int

    @property
    def size(self) -> int:
        return len(self.tokens) - 1

    def path_tokens(self, path: Sequence[int]) -> list[int]:
        return [self.tokens[r] for r in path]


def draft_tree(ctx: StepContext, branching: Sequence[int], sampler: ChildSampler) -> TokenTree:
    """Grow a tree level by level: every node at depth d gets ``branching[d]`` children.

    One draft forward pass per level (all frontier nodes at once); the last
    level is not fed to the draft (its distributions are not needed).
    """
    parents, tokens = [-1], [-1]
    q_root = ctx.warping(ctx.draft.root_logits)
    qs: dict[int, torch.Tensor] = {0: q_root}
    frontier = [0]
    for d, k in enumerate(branching):
        new_rows = []
        for r in frontier:
            for t in sampler(qs[r], k, ctx.generator):
                parents.append(r)
                tokens.append(int(t))
                new_rows.append(len(tokens) - 1)
        if not new_rows:
            break
        if d < len(branching) - 1:
            logits = ctx.draft.forward([tokens[r] for r in new_rows],
                                       [ROOT if parents[r] == 0 else parents[r] - 1 for r in new_rows])
            probs = ctx.warping(logits)
            for i, r in enumerate(new_rows):
                qs[r] = probs[i]
        frontier = new_rows
    q = torch.zeros(len(tokens), q_root.shape[-1], dtype=q_root.dtype)
    for r, v in qs.items():
        q[r] = v
    return TokenTree(parents, tokens, q, depth=len(branching))


def draft_chains(ctx: StepContext, k: int, gamma: int) -> TokenTree:
    """k i.i.d. chain drafts of length gamma as k branches under the root (one draft pass per depth)."""
    parents, tokens = [-1], [-1]
    q_root = ctx.warping(ctx.draft.root_logits)
    qs: dict[int, torch.Tensor] = {0: q_root}
    last = [0] * k
    for d in range(gamma):
        rows = []
        for c in range(k):
            parents.append(last[c])
            tokens.append(sample(qs[last[c]], ctx.generator))
            rows.append(len(tokens) - 1)
        if d < gamma - 1:
            logits = ctx.draft.forward([tokens[r] for r in rows],
                                       [ROOT if parents[r] == 0 else parents[r] - 1 for r in rows])
            probs = ctx.warping(logits)
            for i, r in enumerate(rows):
                qs[r] = probs[i]
        last = rows
    q = torch.zeros(len(tokens), q_root.shape[-1], dtype=q_root.dtype)
    for r, v in qs.items():
        q[r] = v
    return TokenTree(parents, tokens, q, depth=gamma)


def score_tree(ctx: StepContext, tree: TokenTree) -> torch.Tensor:  # [N+1, V]
    """One target pass over the whole tree; warped p for every row (row 0 = root)."""
    logits = ctx.target.forward(tree.tokens[1:], [ROOT if p == 0 else p - 1 for p in tree.parents[1:]])
    return ctx.warping(torch.cat([ctx.target.root_logits[None], logits]))


def check_branching(field_name: str, value) -> list[int]:
    try:
        ks = [int(k) for k in value]
    except TypeError as e:
        raise ValueError(f"{field_name} must be a list of positive integers, e.g. [4, 2, 2]; got {value!r}") from e
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"{field_name} must be a non-empty list of integers >= 1, e.g. [4, 2, 2]; got {value!r}")
    return ks

"""The proposer interface (mtad.core.protocols.Proposer) and the one token-tree type."""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
import typing

import pytest
import torch

import mtad.decoders
import mtad.propose
from mtad.core.decoder import StepContext
from mtad.core.protocols import PROPOSER_KINDS, ROOT, ProposerKind
from mtad.core.runner import ModelRunner
from mtad.core.tree import Beams, TokenTree
from mtad.core.warping import Warping
from mtad.propose.beam import Beam, slot_tree
from mtad.propose.chain import Chain, ConfidenceRun
from mtad.propose.tree import Chains, Tree


def test_the_merge_of_equal_paths_is_the_trees():
    t = TokenTree()
    a, b = t.add(ROOT, 5), t.add(ROOT, 5)  # i.i.d. siblings that drew the same token
    c, d = t.add(a, 1), t.add(b, 1)  # and their children
    assert t.canon == [0, a, a, c, c] and t.unique_rows == [a, c]
    assert t.feed_rows() == ([a, c], [5, 1], [ROOT, 1])
    assert t.node(ROOT, 5) == a and t.node(b, 2) == 5  # a deduplicated add
    nodes, row = t.dedup()
    assert nodes.tokens == [-1, 5, 1, 2] and nodes.parents == [-1, ROOT, 1, 1] and row[d] == 2
    assert t.path(d) == [b, d] and TokenTree.chain([7, 8]).parents == [-1, 0, 1]


def _ctx(toy_pair, warping, seed=0):
    target, draft = toy_pair
    t, d = ModelRunner(target), ModelRunner(draft)
    for r in (t, d):
        r.prefill([2, 3])
        r.begin([2, 3])
    return StepContext([2, 3], t, d, warping, torch.Generator().manual_seed(seed), remaining=10)


@pytest.mark.parametrize("proposer, width", [(Chain(), 1), (Tree([2, 2, 1]), 1), (Chains(3), 1),
                                             (Beam(), 3), (ConfidenceRun("sampling", 0.0), 1)])
def test_every_proposer_drafts_a_token_tree_of_the_asked_depth(toy_pair, proposer, width):
    tree = proposer.propose(_ctx(toy_pair, Warping(1.0)), 3, width)
    assert isinstance(tree, TokenTree) and max(tree.depths) == 3
    assert all(p < r for r, p in enumerate(tree.parents) if r > 0)


def test_beam_tree_q_is_the_warped_draft_after_each_row(toy_pair):
    w = Warping(0.9, top_k=4)
    ctx = _ctx(toy_pair, w)
    tree = Beam().propose(ctx, 2, 3)
    assert tree.beams.gamma == 2 and [len(r) for r in tree.beams.rows] == [3, 3]
    root = w(ctx.draft.root_logits)
    assert torch.allclose(tree.q[0].dense(), root)
    leaf = tree.beams.rows[-1][0]
    assert tree.q[leaf].ids.numel() == 0  # leaves were never fed: no children drawn


def test_beam_tree_q_holds_no_reference_to_its_tree(toy_pair):
    """``tree.q`` reaches the tree weakly (no cycle: the step's logits go when the tree goes);
    a read after the tree was dropped is refused in one line, never answered from stale rows."""
    ctx = _ctx(toy_pair, Warping(0.9, top_k=4))
    tree = Beam().propose(ctx, 2, 3)
    q = tree.q
    assert q[0].ids.numel() > 0  # read while the tree lives
    q = Beam().propose(ctx, 2, 3).q  # its tree is gone at once (reference counting)
    with pytest.raises(RuntimeError, match="after its step's token tree was dropped"):
        q[0]


def test_beam_tree_layout_and_dedup():
    beams = Beams(
        tokens=[torch.tensor([1, 1, 2]), torch.tensor([3, 3, 4])],
        parents=[torch.tensor([-1, -1, -1]), torch.tensor([0, 1, 2])],
        cum_logq=[torch.zeros(3), torch.zeros(3)],
        weights=torch.ones(3) / 3,
    )
    nodes, node = slot_tree(beams).dedup()
    tokens, parents, depth = nodes.tokens, nodes.parents, nodes.depths
    node_of = [[node[r] for r in rows] for rows in beams.rows]
    # slots 0 and 1 at depth 1 are both token 1 under the root: one node; so are their children
    # (rows as in mtad.core.runner: row 0 is the root)
    assert tokens == [-1, 1, 2, 3, 4] and parents == [-1, ROOT, ROOT, 1, 2]
    assert depth == [0, 1, 1, 2, 2]
    assert node_of == [[1, 1, 2], [3, 3, 4]]


def _proposer_classes() -> list[type]:
    """Every class in ``mtad.propose`` and ``mtad.decoders`` with a ``propose`` method."""
    out = []
    for package in (mtad.propose, mtad.decoders):
        for m in pkgutil.iter_modules(package.__path__):
            mod = importlib.import_module(f"{package.__name__}.{m.name}")
            out += [c for _, c in inspect.getmembers(mod, inspect.isclass)
                    if c.__module__ == mod.__name__ and callable(getattr(c, "propose", None))]
    return out


# every proposer of mtad.propose, drafting 4 levels at width 3
KIND_CASES = [Chain(), ConfidenceRun("sampling", 0.0), Beam(), Beam(replacement=False),
              Chains(3), Tree([3, 2, 2, 2])]


def test_every_proposer_declares_a_kind_of_the_vocabulary():
    assert set(PROPOSER_KINDS) == set(typing.get_args(ProposerKind))
    classes = _proposer_classes()
    assert {c for c in classes if c.__module__.startswith("mtad.propose.")} == {
        type(p) for p in KIND_CASES}, "add the new proposer to KIND_CASES"
    for cls in classes:
        assert cls.kind in PROPOSER_KINDS, f"{cls.__qualname__}.kind = {cls.kind!r}"


@pytest.mark.parametrize("proposer", KIND_CASES, ids=lambda p: type(p).__name__)
def test_kind_says_how_the_draft_passes_look(toy_pair, proposer):
    ctx = _ctx(toy_pair, Warping(1.0))
    rows = []  # new rows of each draft pass (the root's own pass has none)
    real = ctx.draft.forward

    def recording(tokens, parents):
        if tokens:
            rows.append(len(tokens))
        return real(tokens, parents)

    ctx.draft.forward = recording
    depth, width = 4, 3
    tree = proposer.propose(ctx, depth, width)
    assert len(rows) <= depth - 1  # the last level is never fed to the draft
    if proposer.kind == "chain":
        assert rows == [1] * len(rows)
    elif proposer.kind == "beam":
        assert rows and max(rows) <= width
    elif proposer.kind == "chains":
        assert rows and max(rows) <= proposer.num_drafts
    else:  # "tree": pass d feeds at most the level's nodes
        assert rows and all(n <= math.prod(proposer.branching[: d + 1]) for d, n in enumerate(rows))
    assert max(tree.depths) == depth

"""The one target pass (``mtad.verify.score``), the verifiers' ``target_pass`` vocabulary, and the
typed beam seam (``TokenTree.beams``, a ``mtad.core.tree.Beams``)."""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
import typing

import pytest
import torch

import mtad.verify
from mtad.autotune.costmodel import PROFILES, profile_kind
from mtad.core.decoder import StepContext
from mtad.core.knobs import sampling_of
from mtad.core.protocols import PROPOSER_KINDS, ROOT, TARGET_PASSES, ProposerKind, TargetPass
from mtad.core.runner import ModelRunner
from mtad.core.tree import Beams, TokenTree
from mtad.core.warping import Warping
from mtad.propose.beam import Beam
from mtad.propose.chain import Chain, ConfidenceRun
from mtad.propose.tree import Chains, Tree
from mtad.verify.chain import SpeculativeChain
from mtad.verify.greedy import GreedyMatch
from mtad.verify.multidraft import MultiDraft
from mtad.verify.rollback import Rollback
from mtad.verify.score import score
from mtad.verify.threshold import JointThreshold, TreeThreshold
from mtad.verify.typical import TypicalAcceptance

COMMITTED = [2, 3]


def _ctx(toy_pair, warping=None, seed=0) -> StepContext:
    target, draft = toy_pair
    t, d = ModelRunner(target), ModelRunner(draft)
    for r in (t, d):
        r.prefill(COMMITTED)
        r.begin(COMMITTED)
    return StepContext(list(COMMITTED), t, d, warping or Warping(0.9, top_k=4),
                       torch.Generator().manual_seed(seed), remaining=10)


def classes_with(package, method: str) -> list[type]:
    """Every class defined in ``package``'s modules that has a ``method``."""
    out = []
    for m in pkgutil.iter_modules(package.__path__):
        mod = importlib.import_module(f"{package.__name__}.{m.name}")
        out += [c for _, c in inspect.getmembers(mod, inspect.isclass)
                if c.__module__ == mod.__name__ and callable(getattr(c, method, None))]
    return out


# ----------------------------------------------------------------------------- the target pass
def test_score_is_one_pass_over_the_distinct_nodes_with_each_paths_logits(toy_pair):
    ctx = _ctx(toy_pair)
    tree = TokenTree()
    a, b = tree.add(ROOT, 4), tree.add(ROOT, 4)  # i.i.d. siblings that drew the same token
    c = tree.add(a, 1)
    tree.add(b, 1), tree.add(b, 5)
    calls = ctx.target.forward_calls
    s = score(ctx, tree)
    assert ctx.target.forward_calls == calls + 1  # one pass, the root's row included
    assert s.nodes.tokens == [-1, 4, 1, 5] and s.nodes.parents == [-1, ROOT, 1, 1]
    assert s.node == [ROOT, 1, 1, 2, 2, 3]
    rows = s.rows()
    for r in range(len(tree.tokens)):
        path = tree.path_tokens(tree.path(r))
        want = ctx.target.score(COMMITTED + path)[-1]  # a full pass over the path alone
        assert torch.allclose(s.logits[s.node[r]], want, atol=1e-10, rtol=0), r
        assert torch.allclose(s.p[s.node[r]], ctx.warping(want), atol=1e-10, rtol=0), r
        assert torch.allclose(rows[r].dense(), s.p[s.node[r]], atol=1e-12, rtol=0), r
    x, par = s.fed(parents=True)
    assert x.tolist() == [4, 1, 5] and par.tolist() == [ROOT, 1, 1] and s.fed()[1] is None
    again = s.then(s.node[c], 2)  # one more pass: token 2 after the path (4, 1)
    assert torch.allclose(again, ctx.target.score(COMMITTED + [4, 1, 2])[-1], atol=1e-10, rtol=0)


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.9), (0.7, 0.5)])
def test_masses_and_draws_read_the_rows_apart(toy_pair, temperature, top_p):
    """At plain temperature and at top-p alone ``masses`` and ``sample`` warp the root's and the
    body's rows apart (no concatenation of the logits): the very floats of ``p``, and the same
    draws."""
    from mtad.core.sampling import generator

    warping = Warping(temperature, 0, top_p)
    tree = TokenTree()
    a = tree.add(ROOT, 4)
    tree.add(a, 1), tree.add(a, 5), tree.add(ROOT, 2)
    apart, whole = score(_ctx(toy_pair, warping), tree), score(_ctx(toy_pair, warping), tree)
    assert whole.p.shape[0] == len(whole.nodes.tokens)  # the whole [U+1, V] warped first: the general path
    x, par = apart.fed(parents=True)
    for log in (False, True):
        assert torch.equal(apart.masses(par, x, log=log), whole.masses(par, x, log=log))
    assert "logits" not in apart._cache  # no [U+1, V] concatenation was made
    for row in range(len(apart.nodes.tokens)):
        for seed in range(20):
            assert (apart.sample(row, generator(warping, seed))
                    == whole.sample(row, generator(warping, seed)))
    assert torch.equal(apart.p, whole.p)  # p read afterwards: built from the same rows


@pytest.mark.parametrize("top_p", [0.9, 0.5])
def test_top_p_rows_are_warped_only_where_a_rule_reads_them(toy_pair, monkeypatch, top_p):
    """At top-p alone (a row's nucleus costs many passes over it) a tree rule's edge masses warp
    the rows of the nodes' parents only, the root's with them, in one call (the body's a slice
    where they follow one another and the root's is not wanted, else gathered), and its draw that
    row alone: no leaf's row, each the very floats of ``p``."""
    tree = TokenTree()
    a = tree.add(ROOT, 4)
    b = tree.add(a, 1)
    tree.add(b, 3), tree.add(a, 5), tree.add(ROOT, 2), tree.add(b, 0)
    warping = Warping(1.0, 0, top_p)
    apart, p = score(_ctx(toy_pair, warping), tree), score(_ctx(toy_pair, warping), tree).p
    n = []
    orig = Warping.__call__
    monkeypatch.setattr(Warping, "__call__", lambda self, x: n.append(len(x)) or orig(self, x))
    x, par = apart.fed(parents=True)
    apart.masses(par, x)
    parents = sorted(set(par.tolist()))
    assert sorted(apart._cache["p_rows"]) == parents  # rows 0, 1 (a), 2 (b): no leaf
    assert n == [3]  # the root and the body's parents in one call
    apart._warp_rows([4, 5])  # one after the other: a slice
    apart._warp_rows([3, 6])  # apart: gathered into one call
    apart._warp_rows([2, 3])  # kept already
    assert n == [3, 2, 2] and sorted(apart._cache["p_rows"]) == [*parents, 3, 4, 5, 6]
    for r, row in apart._cache["p_rows"].items():
        assert torch.equal(row, p[r]), r
    assert "logits" not in apart._cache


@pytest.mark.parametrize("wanted, calls", [([0, 1, 2, 3, 4, 5, 6], 2), ([2, 3, 5], 1), ([1, 6], 2),
                                           ([0, 6], 2), ([3], 1), ([0], 1)])
def test_wanted_rows_warp_in_few_calls_into_the_very_floats_of_p(toy_pair, monkeypatch, wanted, calls):
    """``Scores._warp_rows`` (the threshold rules' masses at plain temperature on the CPU): the
    root alone and the body's wanted span in one call where it holds at most twice the wanted
    rows, else row by row; every row kept is ``p``'s row bit for bit (a planted off-by-one in
    the span's numbering fails it), and a row warped once is not warped again."""
    tree = TokenTree()
    a = tree.add(ROOT, 4)
    b = tree.add(a, 1)
    tree.add(b, 3), tree.add(a, 5), tree.add(ROOT, 2), tree.add(b, 0)
    warping = Warping(1.0)
    apart, p = score(_ctx(toy_pair, warping), tree), score(_ctx(toy_pair, warping), tree).p
    n = []
    orig = Warping.__call__
    monkeypatch.setattr(Warping, "__call__", lambda self, x: n.append(len(x)) or orig(self, x))
    apart._warp_rows(wanted)
    assert len(n) == calls
    kept = apart._cache["p_rows"]
    assert set(wanted) <= set(kept)
    for r, row in kept.items():
        assert torch.equal(row, p[r]), r
    apart._warp_rows(wanted)
    assert len(n) == calls  # kept: nothing warped again


@pytest.mark.parametrize("verifier", [SpeculativeChain(), TypicalAcceptance(0.09, 0.3),
                                      Rollback("sampling", 1.0)])
def test_a_chain_rule_refuses_a_tree_that_is_not_a_chain(toy_pair, verifier):
    tree = Tree([2, 1]).propose(_ctx(toy_pair), 2)
    with pytest.raises(ValueError, match="verifies a chain"):
        verifier.verify(_ctx(toy_pair), tree)


# a fitting proposer for each verifier: (proposer, width, verifier)
PAIRS = [
    (Chain(), 1, SpeculativeChain()),
    (Chain(), 1, TypicalAcceptance(0.09, 0.3)),
    (ConfidenceRun("sampling", 0.0), 1, Rollback("sampling", math.inf)),  # never rolls back
    (Beam(), 3, JointThreshold(0.5)),
    (Beam(), 3, TreeThreshold(0.5)),
    (Tree([2, 2, 2]), 1, MultiDraft("specinfer")),
    (Chains(3), 1, MultiDraft("spectr")),
    (Chain(), 1, GreedyMatch()),
]


def test_every_verifier_declares_a_target_pass_of_the_vocabulary():
    verifiers = classes_with(mtad.verify, "verify")
    assert set(TARGET_PASSES) == set(typing.get_args(TargetPass))
    assert {type(v) for _, _, v in PAIRS} == set(verifiers), "add the new verifier to PAIRS"
    for cls in verifiers:
        assert cls.target_pass in TARGET_PASSES, cls


@pytest.mark.parametrize("proposer, width, verifier", PAIRS,
                         ids=[f"{type(v).__name__}" for _, _, v in PAIRS])
def test_target_pass_says_what_the_one_pass_scores(toy_pair, proposer, width, verifier):
    # plain temperature where the pieces take it, else temperature 0 (a greedy-only verifier)
    plain = all(sampling_of(piece).problem(1.0) is None for piece in (proposer, verifier))
    ctx = _ctx(toy_pair, Warping(1.0 if plain else 0.0))
    tree = proposer.propose(ctx, 3, width)
    fed = []
    real = ctx.target.forward

    def recording(tokens, parents):
        fed.append((list(tokens), list(parents)))
        return real(tokens, parents)

    ctx.target.forward = recording
    out = verifier.verify(ctx, tree)
    assert len(fed) == 1 and len(out.tokens) >= 1
    tokens, parents = fed[0]
    if verifier.target_pass == "chain":  # one path: one row per depth
        assert parents == list(range(len(tokens))) and len(tokens) == tree.depth
    else:  # every distinct node of the tree
        assert len(tokens) == len(tree.unique_rows) > tree.depth


def test_the_cost_models_profiles_speak_the_pieces_vocabularies():
    for proposer_kind, target_pass in PROFILES:
        assert proposer_kind in PROPOSER_KINDS and target_pass in TARGET_PASSES
    assert set(PROPOSER_KINDS) == set(typing.get_args(ProposerKind))
    assert profile_kind(Chain.kind, SpeculativeChain.target_pass) == "spd"
    assert profile_kind(Beam.kind, JointThreshold.target_pass) == "mtad"
    assert profile_kind(Beam.kind, TreeThreshold.target_pass) == "tree_mtad"


# ----------------------------------------------------------------------------- the beam seam
def test_the_tree_carries_beams_as_a_typed_field():
    hints = typing.get_type_hints(TokenTree)
    assert typing.get_args(hints["beams"]) == (Beams, type(None))
    assert typing.Any not in (hints["q"], *typing.get_args(hints["q"]))


def test_the_beam_proposer_fills_the_trees_beams_with_its_rows(toy_pair):
    tree = Beam().propose(_ctx(toy_pair, Warping(1.0)), 3, 3)
    beams = tree.beams
    assert type(beams) is Beams and beams.gamma == 3 == tree.depth
    for t in range(beams.gamma):
        for i, r in enumerate(beams.rows[t]):
            assert tree.tokens[r] == int(beams.tokens[t][i])
            above = ROOT if t == 0 else beams.rows[t - 1][int(beams.parents[t][i])]
            assert tree.parents[r] == above


def _hand_built_beam_tree() -> TokenTree:
    """Two beams over two depths; the best final beam (slot 1) extends slot 0 of depth 0."""
    beams = Beams(
        tokens=[torch.tensor([1, 2]), torch.tensor([3, 4])],
        parents=[torch.tensor([-1, -1]), torch.tensor([1, 0])],
        cum_logq=[torch.tensor([-1.0, -2.0], dtype=torch.float64),
                  torch.tensor([-3.0, -2.5], dtype=torch.float64)],
        weights=torch.tensor([0.2, 0.8]),
    )
    tree = TokenTree(depth=2, beams=beams)
    r1, r2 = tree.add(ROOT, 1), tree.add(ROOT, 2)
    beams.rows = [[r1, r2], [tree.add(r2, 3), tree.add(r1, 4)]]
    return tree


def test_the_threshold_rules_read_the_trees_beams(toy_pair):
    tree = _hand_built_beam_tree()
    out = JointThreshold(1e-30).verify(_ctx(toy_pair, Warping(1.0)), tree)  # every prefix passes
    assert out.tokens[:2] == tree.beams.path_tokens(1) == [1, 4] and out.accepted == 2
    out = TreeThreshold(0.5).verify(_ctx(toy_pair, Warping(1.0)), tree)
    assert out.info["ref"] == tree.beams.path_cum_logq(1).tolist() == [-1.0, -2.5]


@pytest.mark.parametrize("rule", [JointThreshold(0.5), TreeThreshold(0.5)])
def test_a_threshold_rule_refuses_a_tree_without_beams(toy_pair, rule):
    tree = Chain().propose(_ctx(toy_pair), 2)
    with pytest.raises(ValueError, match=r"tree\.beams.*mtad\.propose\.beam\.Beam"):
        rule.verify(_ctx(toy_pair), tree)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
@pytest.mark.parametrize("decoder", ["spd", "tree_mtad", "mtad"])
def test_rows_warped_apart_change_no_token(decoder, top_p, monkeypatch):
    """Generations at plain temperature and at top-p alone with the rows warped apart are those
    of the whole ``p`` (``Scores.lazy_rows`` and ``Scores.row_wise`` forced off), token for token
    and step for step, on a vocabulary past ``DENSE_MAX`` and the bucketed nucleus's length (SpD's
    chain rule row by row, ``_verify_row_by_row``, against ``verify_chain`` on the whole ``p``)."""
    from mtad.core.engine import Engine
    from mtad.models.tiny import tiny_causal_lm
    from mtad.run.cli import load_decoder
    from mtad.verify.score import Scores

    target = tiny_causal_lm("qwen2", vocab_size=5000, hidden_size=16, num_layers=1, num_heads=2, seed=0)
    draft = tiny_causal_lm("qwen2", vocab_size=5000, hidden_size=16, num_layers=1, num_heads=2, seed=1)
    warping = Warping(1.0, 0, top_p)

    def run():
        eng = Engine(target, draft, load_decoder(decoder, gamma=3), warping)
        out = [eng.generate([5, 6, 7], 12, seed=s) for s in range(4)]
        return [(o.output_ids, o.num_steps) for o in out]

    apart = run()
    monkeypatch.setattr(Scores, "row_wise", lambda self: False)
    monkeypatch.setattr(Scores, "lazy_rows", lambda self: False)
    assert run() == apart


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_spd_warps_its_rows_up_to_the_first_rejection(monkeypatch, top_p):
    """SpD at plain temperature and at top-p alone on the CPU (``_verify_row_by_row``): each step
    warps the target rows up to the first rejection (or the bonus row), one at a time, never the
    whole ``p`` (no concatenation of the logits either); a step that rejected early left the rows
    after it unwarped (a random draft rejects some)."""
    from mtad.core.engine import Engine
    from mtad.models.tiny import tiny_causal_lm
    from mtad.run.cli import load_decoder
    from mtad.verify import chain

    target = tiny_causal_lm("qwen2", vocab_size=5000, hidden_size=16, num_layers=1, num_heads=2, seed=0)
    draft = tiny_causal_lm("qwen2", vocab_size=5000, hidden_size=16, num_layers=1, num_heads=2, seed=1)
    seen, steps = [], []
    orig_score, orig_verify = chain.score, chain.SpeculativeChain.verify

    def spy_score(ctx, tree):
        seen.append(orig_score(ctx, tree))
        return seen[-1]

    def spy_verify(self, ctx, tree):
        out = orig_verify(self, ctx, tree)
        s = seen[-1]
        steps.append((out.accepted, out.drafted, sorted(s._cache.get("p_rows", {})), "p" in s._cache))
        return out

    monkeypatch.setattr(chain, "score", spy_score)
    monkeypatch.setattr(chain.SpeculativeChain, "verify", spy_verify)
    eng = Engine(target, draft, load_decoder("spd", gamma=4), Warping(1.0, 0, top_p))
    for seed in range(3):
        eng.generate([5, 6, 7], 16, seed=seed)
    assert steps and not any(whole for *_, whole in steps)
    assert not any("logits" in s._cache for s in seen)
    for accepted, _, rows, _ in steps:
        assert rows == list(range(accepted + 1)), (accepted, rows)
    assert any(accepted < drafted for accepted, drafted, *_ in steps)  # some rows were never warped

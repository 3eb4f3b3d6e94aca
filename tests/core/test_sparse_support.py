"""Sampling and verification on the distributions' support (``mtad.core.sampling``,
``mtad.verify.multidraft.compress_support``) give the same distributions as the dense path.

* draws on a long sparse vector follow it (chi-square) and stay on its support;
* every single-position rule gives the same exact outcome on the compressed columns
  as on the dense vocabulary, and the tree walkers give identical (path, token) for
  identical generator seeds, the token mapped back into the full vocabulary;
* the lossless decoders, forced onto the support path on the toy model
  (``DENSE_MAX = 0``), still reproduce the warped target joint (chi-square, as in
  ``tests/decoders/test_lossless.py``);
* decoders with no closed-form output distribution (tree-MTAD by default; MTAD, beam SpecInfer,
  BiLD and MCNS marked slow) give the same distribution on the support path as on the dense one
  (two-sample chi-square).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy import stats

import mtad.core.sampling
import mtad.verify.multidraft as md
from mtad.core.engine import Engine
from mtad.core.sampling import sample
from mtad.core.warping import Warping
from mtad.propose.beam import select_entries
from mtad.propose.tree import draw_without_replacement
from mtad.run.cli import load_decoder
from mtad.testing import chi_square_gof, exact_joint, homogeneity_test, sample_sequences

F64 = torch.float64
BIG_V = 5000  # > DENSE_MAX: the support path
ALPHA = 1e-4


def sparse_dist(vocab: int, nnz: int, gen: torch.Generator, ids: torch.Tensor | None = None) -> torch.Tensor:
    out = torch.zeros(vocab, dtype=F64)
    if ids is None:
        ids = torch.randperm(vocab, generator=gen)[:nnz]
    out[ids] = torch.rand(len(ids), generator=gen, dtype=F64) + 0.05
    return out / out.sum()


def test_sample_long_vector_follows_it():
    gen = torch.Generator().manual_seed(0)
    p = sparse_dist(BIG_V, 8, gen)
    assert p.numel() > mtad.core.sampling.DENSE_MAX
    n = 4000
    counts = Counter(sample(p, gen) for _ in range(n))
    ids = torch.nonzero(p).flatten().tolist()
    assert set(counts) <= set(ids), "a draw left the support"
    obs = [counts.get(i, 0) for i in ids]
    assert stats.chisquare(obs, [n * float(p[i]) for i in ids]).pvalue > ALPHA


def test_select_entries_long_vector_follows_scores():
    gen = torch.Generator().manual_seed(1)
    scores = sparse_dist(3 * BIG_V, 6, gen)  # flattened W x V beam scores
    n = 3000
    counts = Counter(int(select_entries(scores, 1, False, True, gen)[0]) for _ in range(n))
    ids = torch.nonzero(scores).flatten().tolist()
    assert set(counts) <= set(ids)
    assert stats.chisquare([counts.get(i, 0) for i in ids],
                           [n * float(scores[i]) for i in ids]).pvalue > ALPHA
    wor = select_entries(scores, 10, greedy=False, replacement=False, generator=gen)
    assert sorted(wor.tolist()) == ids, "without replacement: every nonzero entry once, no more"


def random_problem(seed: int, rows: int = 5, vocab: int = BIG_V):
    """p, q [rows, vocab] with small overlapping supports (top-k-like), and a few tokens."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randperm(vocab, generator=gen)[:12]  # shared pool: supports overlap
    p = torch.stack([sparse_dist(vocab, 0, gen, pool[torch.randperm(12, generator=gen)[:6]])
                     for _ in range(rows)])
    q = torch.stack([sparse_dist(vocab, 0, gen, pool[torch.randperm(12, generator=gen)[:5]])
                     for _ in range(rows)])
    return p, q, pool


RULES = {
    "specinfer": md.specinfer_position,
    "mcss": md.mcss_position,
    "spectr": md.spectr_position,
    "mcns": lambda P, Q, cands: md.mcns_position(P, cands),
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", list(RULES))
def test_position_outcome_same_on_compressed_columns(name, seed):
    p, q, pool = random_problem(seed, rows=1)
    p, q = p[0], q[0]
    gen = torch.Generator().manual_seed(100 + seed)
    # candidates: drawn from q (distinct for MCSS), plus one q cannot draw
    cands = draw_without_replacement(q, 3, gen).tolist()
    outside = [int(t) for t in pool if q[int(t)] == 0][:1]
    cands = cands + outside if name != "mcss" else cands
    comp = md.compress_support(p, q, cands)
    assert comp.cols.numel() < 30 and torch.equal(comp.cols, comp.cols.sort().values)
    dense = RULES[name](p, q, cands)
    small = RULES[name](comp.P, comp.Q, comp.cands)
    assert torch.allclose(dense.accept_prob, small.accept_prob, atol=1e-12, rtol=0)
    assert torch.allclose(dense.reject_prob, small.reject_prob, atol=1e-12, rtol=0)
    assert torch.allclose(dense.residual[comp.cols], small.residual, atol=1e-12, rtol=0)
    rest = torch.ones(BIG_V, dtype=torch.bool)
    rest[comp.cols] = False
    assert not bool(dense.residual[rest].any()), "the dense residual has mass outside the columns"


WALKERS = {name: md.MultiDraft(name).walk for name in ("specinfer", "mcss", "spectr", "mcns")}


def tree_for(name: str, q: torch.Tensor, gen: torch.Generator):
    """A small tree whose children are drawn from the rows of q as each rule requires."""
    if name == "spectr":  # 2 chains of depth 2: rows 1, 2 / 3, 4
        parents = [-1, 0, 1, 0, 3]
        tokens = [-1]
        for par in parents[1:]:
            tokens.append(sample(q[par], gen))
        return parents, tokens
    parents, tokens = [-1], [-1]
    for row, k in ((0, 2), (1, 2)):
        kids = (draw_without_replacement(q[row], k, gen).tolist() if name == "mcss"
                else [sample(q[row], gen) for _ in range(k)])
        for t in kids:
            parents.append(row)
            tokens.append(int(t))
    return parents, tokens


@pytest.mark.parametrize("name", list(WALKERS))
def test_walker_compressed_equals_dense_for_each_seed(name, monkeypatch):
    monkeypatch.setattr(mtad.core.sampling, "DENSE_MAX", 0)  # both paths draw on the support
    seen_big = False
    for seed in range(40):
        p, q, _ = random_problem(seed)
        parents, tokens = tree_for(name, q, torch.Generator().manual_seed(seed))
        rows = len(tokens)
        p, q = p[:rows], q[:rows]
        dense = WALKERS[name](parents, tokens, p, q, torch.Generator().manual_seed(seed),
                              compress=False)
        small = WALKERS[name](parents, tokens, p, q, torch.Generator().manual_seed(seed),
                              compress=True)
        assert dense == small, f"seed {seed}: dense {dense} != compressed {small}"
        path, token = small
        last = path[-1] if path else 0
        assert 0 <= token < BIG_V and (p[last, token] > 0 or q[last, token] >= 0)
        seen_big |= token >= 30  # a vocabulary id, not a compressed column index
    assert seen_big


def test_walker_auto_compresses_long_vocabularies():
    p, q, _ = random_problem(7)
    parents, tokens = tree_for("specinfer", q, torch.Generator().manual_seed(7))
    p, q = p[: len(tokens)], q[: len(tokens)]
    outs = Counter(WALKERS["specinfer"](parents, tokens, p, q, torch.Generator().manual_seed(s))[1]
                   for s in range(200))
    support = set(torch.nonzero((p > 0).any(0)).flatten().tolist())
    assert set(outs) <= support and max(outs) >= 30


PROMPT, LENGTH = [2, 3], 3


#: spd and specinfer in the default suite; the rest slow (each decoder's default lossless test is
#: tests/decoders/test_lossless.py's; these are 11-24 s each)
@pytest.mark.parametrize("name", ["spd", "specinfer"] + [pytest.param(n, marks=pytest.mark.slow) for n in
                                                         ("multinomial", "mcss", "spectr", "mcns")])
def test_lossless_on_support_path(toy_pair, name, monkeypatch):
    """The support path (forced on the 6-token toy model) keeps the decoders lossless."""
    monkeypatch.setattr(mtad.core.sampling, "DENSE_MAX", 0)  # the walkers compress too
    target, draft = toy_pair
    warping = Warping(0.8, top_k=4, top_p=0.9)
    joint = exact_joint(target, PROMPT, LENGTH, warping)
    decoder = load_decoder(name, gamma=2, width=2)
    counts = sample_sequences(Engine(target, draft, decoder, warping), PROMPT, LENGTH, 1500, seed0=7)
    _, pval, dof = chi_square_gof(counts, joint)
    assert dof >= 10
    assert pval > ALPHA, f"{name} on the support path differs from the target joint (p={pval:.2e})"


@pytest.mark.parametrize("vocab", [50, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("setting", [(0.0, 0, 1.0), (1.0, 10, 0.9), (0.7, 5, 1.0), (1.3, 20, 0.5)])
def test_candidate_supports_equal_the_dense_rows_supports(vocab, dtype, setting):
    """warp_candidates + candidate_supports == host_supports(warp_probs(.)), entry for entry, with
    ties at the k-th logit (rounded logits) and rows that top-p cuts."""
    from mtad.core.sampling import candidate_supports, host_supports
    from mtad.core.warping import warp_candidates, warp_probs

    g = torch.Generator().manual_seed(vocab)
    logits = (3 * torch.randn(6, vocab, generator=g, dtype=torch.float64))
    logits[:3] = logits[:3].round()  # many ties
    logits = logits.to(dtype)
    got = candidate_supports(*warp_candidates(logits, *setting), vocab)
    want = host_supports(warp_probs(logits, *setting))
    assert len(got) == len(want) == 6
    for a, b in zip(got, want):
        assert a.size == b.size
        assert torch.equal(a.ids, b.ids)
        assert a.vals.dtype == b.vals.dtype and torch.equal(a.vals, b.vals)


def test_warp_candidates_declines_where_the_general_path_runs():
    from mtad.core.warping import warp_candidates

    logits = torch.randn(2, 100)
    assert warp_candidates(logits, 1.0, 0, 0.9) is None  # top-p alone: a sort
    assert warp_candidates(logits, 1.0, 0, 1.0) is None  # plain temperature: every entry


@pytest.mark.slow  # 25-35 s each
@pytest.mark.parametrize("name", ["tree_mtad", "mtad", "beam_specinfer", "bild_sampling", "mcns"])
def test_support_path_keeps_each_decoders_distribution(toy_pair, name, monkeypatch):
    """Decoders with no closed-form output distribution (MTAD's acceptance of a sampled beam,
    tree-MTAD's over every beam): the support path (``DENSE_MAX = 0``) and the dense path give
    the same distribution of the first tokens (two-sample chi-square homogeneity on independent
    seeds). The offline pair's 151,936-token rows always take the support path, the toy pair's
    six-token rows the dense one, so a difference here would separate records by vocabulary."""
    target, draft = toy_pair
    warping = Warping(1.0, top_k=4)
    n = 1500

    def counts(dense_max: int, seed0: int) -> Counter:
        monkeypatch.setattr(mtad.core.sampling, "DENSE_MAX", dense_max)
        decoder = load_decoder(name, gamma=3, width=3)
        return sample_sequences(Engine(target, draft, decoder, warping), PROMPT, LENGTH, n, seed0=seed0)

    pval = homogeneity_test(counts(mtad.core.sampling.DENSE_MAX, 0), counts(0, 10_000))
    assert pval > ALPHA, f"{name}: the support path's distribution differs from the dense path's (p={pval:.2e})"

"""Tree-MTAD's path sums and acceptance decided on the host (``path_log_probs``, ``tree_accept``)
equal the tensor arithmetic they replace, bit for bit: row-by-row 0-d sums of 0-d logarithms,
and the vectorised threshold test (float32 and float64, ties with the threshold included)."""

from __future__ import annotations

import math

import pytest
import torch

from mtad.core.protocols import ROOT
from mtad.verify.threshold import path_log_probs, tree_accept


def _tensor_path_sums(edge_p, parents):
    out = torch.zeros(len(parents), dtype=edge_p.dtype)
    for r in range(1, len(parents)):
        out[r] = out[parents[r]] + edge_p[r - 1].log()
    return out


def _tensor_accept(log_path_p, depth, ref, tau):
    g = ref.numel()
    d_idx = torch.tensor(depth) - 1
    passing = (log_path_p - ref[d_idx.clamp_min(0)]) > math.log(tau)
    passing &= ~torch.isneginf(log_path_p) & (d_idx >= 0)
    per_depth = [bool(passing[d_idx == d].any()) for d in range(g)]
    a = max((d + 1 for d, ok in enumerate(per_depth) if ok), default=0)
    if a == 0:
        return 0, ROOT, per_depth
    cand = torch.nonzero(passing & (d_idx == a - 1)).flatten()
    return a, int(cand[torch.argmax(log_path_p[cand])]), per_depth


def _tree(gen, n):
    parents, depth = [-1], [0]
    for r in range(1, n + 1):
        p = int(torch.randint(0, r, (1,), generator=gen))
        parents.append(p)
        depth.append(depth[p] + 1)
    return parents, depth


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_host_path_sums_and_acceptance_equal_the_tensor_ones(dtype):
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        n = 1 + trial % 17
        parents, depth = _tree(gen, n)
        edge = torch.rand(n, generator=gen, dtype=dtype) ** float(torch.randint(1, 40, (1,), generator=gen))
        edge[torch.rand(n, generator=gen) < 0.15] = 0.0  # P = 0 on some edges
        got = path_log_probs(edge, parents)
        want = _tensor_path_sums(edge, parents)
        assert got.dtype == want.dtype and torch.equal(got, want)
        g = max(depth)
        ref = -torch.rand(g, generator=gen, dtype=dtype) * 20
        if trial % 5 == 0:  # nodes exactly at the threshold (tau = 1: log P - ref = 0)
            ref = torch.tensor([want[depth.index(d + 1)] for d in range(g)], dtype=dtype)
        for tau in (1.0, 0.5, 0.1, 3.0, math.inf):
            assert tree_accept(got, depth, ref, tau) == _tensor_accept(got, depth, ref, tau)
            wide = ref.double()  # mixed dtypes: the difference in the wider one
            assert tree_accept(got, depth, wide, tau) == _tensor_accept(got, depth, wide, tau)


@pytest.mark.parametrize("vocab", [50, 5000])  # supports: the whole short row; one entry
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_greedy_path_sums_read_only_live_rows_and_equal_the_dense_ones(dtype, vocab):
    """At temperature 0 on the CPU, tree-MTAD's path sums read a row's argmax only under a live
    path; the values equal ``path_log_probs`` of the candidates' one-hot edge masses, tied
    maxima (bfloat16, rounded logits) included."""
    from types import SimpleNamespace

    from mtad.core.tree import TokenTree
    from mtad.core.warping import Warping
    from mtad.verify.score import Scores
    from mtad.verify.threshold import greedy_path_log_probs

    gen = torch.Generator().manual_seed(1)
    for trial in range(150 if vocab < 1000 else 40):
        n = 1 + trial % 21
        parents, _ = _tree(gen, n)
        logits = torch.randn(n + 1, vocab, generator=gen, dtype=torch.float64)
        if trial % 3 == 0:
            logits = (logits * 2).round() / 2  # tied maxima
        logits = logits.to(dtype)
        best = logits.argmax(-1).tolist()  # the first of tied maxima
        tokens = [0] + [best[parents[r]] if torch.rand(1, generator=gen) < 0.7
                        else int(torch.randint(0, vocab, (1,), generator=gen)) for r in range(1, n + 1)]
        ctx = SimpleNamespace(warping=Warping(0.0))
        nodes = TokenTree()  # (the rows are read by number only)

        lazy, dense = (Scores(ctx, nodes, nodes, list(range(n + 1)), logits[0], logits[1:]) for _ in range(2))
        got = greedy_path_log_probs(lazy, tokens, parents)
        edge = dense.masses(torch.tensor(parents[1:]), torch.tensor(tokens[1:]))
        want = path_log_probs(edge, parents)
        assert got.dtype == want.dtype and torch.equal(got, want)
        live = {0} | {r for r in range(1, n + 1) if want[r] == 0}
        read = set(lazy._cache["row_candidates"])
        assert read == {parents[r] for r in range(1, n + 1) if parents[r] in live}
        for row in range(n + 1):  # the bonus draw: the row's argmax, the generator moved as before
            g1, g2 = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
            assert lazy.sample(row, g1) == dense.sample(row, g2) == best[row]
            assert torch.equal(g1.get_state(), g2.get_state())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_greedy_chain_ratios_read_rows_to_the_first_miss_and_equal_the_dense_ones(dtype):
    """MTAD at temperature 0 on the CPU: ``log p_i(x_i)`` read up to the first miss (the chain's
    greedy path sums) gives the dense masses' cumulative ratios exactly (the terms after a miss
    are -inf either way)."""
    from types import SimpleNamespace

    from mtad.core.tree import TokenTree
    from mtad.core.warping import Warping
    from mtad.verify.score import Scores
    from mtad.verify.threshold import cumulative_log_ratio, greedy_path_log_probs

    gen = torch.Generator().manual_seed(2)
    vocab = 40
    for trial in range(200):
        g = 1 + trial % 8
        logits = torch.randn(g + 1, vocab, generator=gen, dtype=torch.float64)
        if trial % 3 == 0:
            logits = (logits * 2).round() / 2  # tied maxima
        logits = logits.to(dtype)
        best = logits.argmax(-1).tolist()
        draft = [best[i] if torch.rand(1, generator=gen) < 0.75 else int(torch.randint(0, vocab, (1,), generator=gen))
                 for i in range(g)]
        ctx = SimpleNamespace(warping=Warping(0.0))
        lazy, dense = (Scores(ctx, TokenTree(), TokenTree(), list(range(g + 1)), logits[0], logits[1:])
                       for _ in range(2))
        got = greedy_path_log_probs(lazy, [-1, *draft], [-1, *range(g)])[1:]  # as MTAD's rule reads them
        want = dense.masses(torch.arange(g), torch.tensor(draft), log=True)
        cum_logq = -torch.rand(g, generator=gen, dtype=want.dtype).cumsum(0)
        assert got.dtype == want.dtype
        assert torch.equal(cumulative_log_ratio(got, cum_logq), cumulative_log_ratio(want, cum_logq))
        miss = next((i for i in range(g) if draft[i] != best[i]), g - 1)
        assert set(lazy._cache["row_candidates"]) == set(range(miss + 1))

"""The walk by inverse CDF takes a sequential rule's stages only as far as its uniform needs
(``multidraft._lazy_pick``): the same accepted path, the same correction token and the same
generator state as the whole rule's outcome drawn at once, and no update after the candidate
accepted."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from mtad.core import sampling
from mtad.core.sampling import InverseCdf
from mtad.verify import multidraft as md

RULES = ("specinfer", "mcss", "spectr")


def _rows(seed: int, n: int, v: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, v] target and draft rows: near, far, peaked or with zeros (per row, by seed)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(2 * torch.randn(n, v, generator=g, dtype=torch.float64), -1)
    kind = seed % 4
    if kind == 0:  # a target near the draft: first candidates mostly accepted
        p = 0.9 * q + 0.1 * torch.softmax(2 * torch.randn(n, v, generator=g, dtype=torch.float64), -1)
    elif kind == 1:  # far: many rejections, corrections
        p = torch.softmax(3 * torch.randn(n, v, generator=g, dtype=torch.float64), -1)
    elif kind == 2:  # peaked drafts
        q = torch.softmax(6 * torch.randn(n, v, generator=g, dtype=torch.float64), -1)
        p = torch.softmax(2 * torch.randn(n, v, generator=g, dtype=torch.float64), -1)
    else:  # zeros on both sides
        p = torch.softmax(2 * torch.randn(n, v, generator=g, dtype=torch.float64), -1)
        p = torch.where(torch.rand(n, v, generator=g) < 0.3, 0.0, p)
        q = torch.where(torch.rand(n, v, generator=g) < 0.3, 0.0, q)
        p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    return p.to(dtype), q.to(dtype)


def _tree(rule: str, q: torch.Tensor, gen: torch.Generator) -> tuple[list[int], list[int]]:
    """Root with 4 children, each with 2 (drawn from q as the rule needs; MCSS: without
    replacement); SpecTr: 3 chains of 2 (merged prefixes)."""
    parents, tokens = [-1], [0]
    if rule == "spectr":
        for _ in range(3):
            last = 0
            for _ in range(2):
                t = int(torch.multinomial(q[last], 1, generator=gen))
                parents.append(last)
                tokens.append(t)
                last = len(tokens) - 1
        return parents, tokens
    level = [0]
    for k in (4, 2):
        nxt = []
        for r in level:
            kids = torch.multinomial(q[r], k, replacement=(rule != "mcss"), generator=gen).tolist()
            for t in kids:
                parents.append(r)
                tokens.append(t)
                nxt.append(len(tokens) - 1)
        level = nxt
    return parents, tokens


def _walk_both(rule, parents, tokens, p, q, seed, monkeypatch):
    out = []
    for lazy in (True, False):
        with monkeypatch.context() as m:
            if not lazy:
                m.setattr(md, "_staged", lambda r: None)  # the whole outcome, drawn at once
            gen = InverseCdf().manual_seed(seed)
            path, tok = md.MultiDraft(rule).walk(parents, tokens, p, q, gen)
            out.append((path, tok, gen.get_state()))
    return out


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("v,dtype", [(50, torch.float64), (3_000, torch.float64), (3_000, torch.float32)])
def test_the_staged_walk_is_the_whole_rules_walk(rule, v, dtype, monkeypatch):
    """Dense short rows and long rows (compressed, past DENSE_MAX and the list rules), float64 and
    float32: every walk ends on the same path and token with the generator in the same state,
    over trees with acceptances at every depth, corrections and bonuses."""
    ends = set()
    for seed in range(24):
        n = 13 if rule != "spectr" else 7
        p, q = _rows(seed, n, v, dtype)
        parents, tokens = _tree(rule, q, torch.Generator().manual_seed(100 + seed))
        lazy, whole = _walk_both(rule, parents, tokens, p, q, seed, monkeypatch)
        assert lazy[0] == whole[0] and lazy[1] == whole[1], (seed, lazy[:2], whole[:2])
        assert torch.equal(lazy[2], whole[2]), seed
        ends.add(len(lazy[0]))
    assert len(ends) >= 2, ends  # walks of several lengths: the test saw acceptances and rejections


def _stages(rule: str, p, q, cands):
    return {"specinfer": md._specinfer_stages, "mcss": md._mcss_stages,
            "spectr": lambda a, b, c: md._spectr_stages(a, b, c, md.spectr_rho)}[rule](p, q, cands)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_uniform_at_every_boundary_picks_the_whole_lists_index(rule, dtype):
    """Uniforms at, and an ulp either side of, every boundary the float64 cumulative masses draw
    (and at 0 and just below 1): ``_lazy_pick`` gives ``cdf_list_index``'s index on the whole
    outcome each time, however few stages it took."""
    for seed in range(6):
        p, q = _rows(seed, 1, 400, dtype)
        p, q = p[0], q[0]
        g = torch.Generator().manual_seed(seed)
        cands = torch.multinomial(q, 4, replacement=(rule != "mcss"), generator=g).tolist()
        o = getattr(md, f"{rule}_position")(p, q, cands)
        masses = [max(x, 0.0) for x in torch.cat([o.accept_prob, o.reject_prob.reshape(1)]).tolist()]
        c = list(itertools.accumulate(masses))
        us = {0.0, math.nextafter(1.0, 0.0)}
        for b in c:
            base = b / c[-1]
            us |= {base, math.nextafter(base, 0.0), math.nextafter(base, 1.0)}
        for u in sorted(x for x in us if 0.0 <= x < 1.0):
            want = sampling.cdf_list_index(masses, u)
            assert md._lazy_pick(_stages(rule, p, q, cands), u) == want, (seed, u)


@pytest.mark.parametrize("rule", ["specinfer", "mcss"])
def test_an_accepted_first_candidate_makes_no_update(rule, monkeypatch):
    """A node whose uniform accepts its first candidate makes none of the rule's updates (each a
    few passes over the vocabulary); the whole outcome makes one per drawable candidate."""
    calls = []
    orig = md._normalise_or
    monkeypatch.setattr(md, "_normalise_or", lambda *a: calls.append(1) or orig(*a))
    q = torch.softmax(torch.randn(3_000, generator=torch.Generator().manual_seed(1), dtype=torch.float64), -1)
    p = q.clone()  # p = q: every candidate is accepted with probability 1
    cands = torch.multinomial(q, 4, replacement=(rule != "mcss"),
                              generator=torch.Generator().manual_seed(2)).tolist()
    assert md._lazy_pick(_stages(rule, p, q, cands), 0.5) == 0
    assert calls == []
    getattr(md, f"{rule}_position")(p, q, cands)
    assert len(calls) >= 4


def test_the_race_walk_keeps_the_whole_outcome(monkeypatch):
    """Under the race (every committed record's draws) the walk draws the whole outcome as
    before: no stage-by-stage pick."""
    monkeypatch.setattr(md, "_lazy_pick", lambda *a: pytest.fail("staged under the race"))
    p, q = _rows(0, 13, 3_000, torch.float64)
    parents, tokens = _tree("specinfer", q, torch.Generator().manual_seed(0))
    md.MultiDraft("specinfer").walk(parents, tokens, p, q, torch.Generator().manual_seed(0))


def _tensor_stages(rule: str, p, q, cands):
    """The stages with the tensor scalars (``_accept_ratio`` on 0-dim tensors: the rules' form
    before their scalars moved to the host)."""
    st = _stages(rule, p, q, cands)
    rho = md.spectr_rho(p, q, len(cands)) if rule == "spectr" and cands else None
    ratio = ((lambda P, Q, c: md._accept_ratio(P[c], Q[c])) if rho is None
             else (lambda P, Q, c: md._accept_ratio(P[c], rho * Q[c])))
    return type(st)(p, q, cands, st.update, rho=rho, ratio=ratio)  # (SpecTr: its own residual)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_host_scalars_are_the_tensor_scalars_bit_for_bit(rule, dtype):
    """A rule's acceptance probabilities, rejection probability and residual with its scalars as
    host floats equal, bit for bit, those made with 0-dim tensors: near, far, peaked and
    zero-holding rows, an undrawable candidate (q = 0) and p = q among them."""
    for seed in range(40):
        p, q = _rows(seed, 1, 300, dtype)
        p, q = p[0], q[0]
        g = torch.Generator().manual_seed(seed)
        k = 1 + seed % 5
        cands = torch.multinomial(q, k, replacement=(rule != "mcss"), generator=g).tolist()
        if seed % 7 == 3:
            cands[-1] = int(torch.nonzero(q == 0)[0]) if bool((q == 0).any()) else cands[-1]
        if seed % 11 == 5:
            p = q.clone()
        host, tens = md._outcome(_stages(rule, p, q, cands)), md._outcome(_tensor_stages(rule, p, q, cands))
        assert _stages(rule, p, q, cands).ar is not None and _tensor_stages(rule, p, q, cands).ar is None
        for a, b in zip(host, tens):
            assert a.dtype == b.dtype == dtype and a.shape == b.shape
            assert torch.equal(a.view(-1), b.view(-1)) and torch.equal(torch.signbit(a), torch.signbit(b)), seed
        hs, ts = _stages(rule, p, q, cands), _tensor_stages(rule, p, q, cands)
        for _ in cands:  # the floats a staged walk reads, one by one (not rounded again on the way)
            assert hs.next() == float(ts.next()) and hs.reach == float(ts.reach), seed


def test_spectr_accepts_its_first_candidate_without_rho_only_when_the_rule_would(monkeypatch):
    """``_SpectrStages.certify_first`` (no search for rho): over rows whose rho lies inside
    (1, k) and a grid of uniforms with the boundaries of the first candidate's mass among them,
    every certified pick is index 0 and equals ``cdf_list_index`` on the whole outcome; the
    certificate is used, both with and without the pass over the row (a test point inside
    (1, k), or k itself), and the rho search is skipped exactly then."""
    outcomes = {"k": 0, "pass": 0, "no": 0}
    searches = []

    def rho(p, q, k):
        searches.append(1)
        return md.spectr_rho_select(p, q, k)

    for seed in range(30):
        for dtype in (torch.float32, torch.float64):
            p, q = _rows(seed, 1, 2_000, dtype)
            p, q = p[0], q[0]
            k = 2 + seed % 4
            cands = torch.multinomial(q, k, replacement=True, generator=torch.Generator().manual_seed(seed)).tolist()
            whole = md._spectr(p, q, cands, md.spectr_rho_select)
            masses = [max(x, 0.0) for x in torch.cat([whole.accept_prob, whole.reject_prob.reshape(1)]).tolist()]
            a0 = masses[0] / sum(masses)
            grid = [i / 64 for i in range(64)] + [a0, math.nextafter(a0, 0.0), math.nextafter(a0, 1.0),
                                                  a0 * (1 - 1e-5), a0 * (1 - 1e-3)]
            for u in grid:
                if not 0 <= u < 1:
                    continue
                st = md._spectr_stages(p, q, cands, rho)
                called = []
                orig = st.certify_first
                passes = []
                real_min = torch.minimum

                def certify(t, orig=orig, real_min=real_min, passes=passes, called=called):
                    monkeypatch.setattr(torch, "minimum", lambda *a: passes.append(1) or real_min(*a))
                    try:
                        called.append(orig(t))
                    finally:
                        monkeypatch.setattr(torch, "minimum", real_min)
                    return called[-1]

                st.certify_first = certify
                before = len(searches)
                got = md._lazy_pick(st, u)
                assert got == sampling.cdf_list_index(masses, u), (seed, dtype, u)
                if called and called[0]:
                    assert got == 0 and len(searches) == before  # certified: no search for rho
                    outcomes["pass" if passes else "k"] += 1
                else:
                    outcomes["no"] += 1
    assert all(v > 0 for v in outcomes.values()), outcomes

"""Verification maths for the lossless multi-draft decoders (SpecInfer, MCSS, SpecTr, MCNS).

Each method is one function that one walk runs:

* a **single-position rule** ``*_position(P, Q, cands) -> PositionOutcome``: a pure
  function returning the exact outcome distribution at one tree node, i.e. the
  probability that candidate ``i`` is the one accepted, the probability that every
  candidate is rejected and the distribution of the token emitted then;
* the **tree walk** shared by every rule, ``MultiDraft(rule).walk(parents, tokens, p, q,
  generator)``, that draws the outcome at each node from that same function (equivalent in distribution to
  the papers' sequential uniforms) and walks down the accepted child.

The exact-enumeration tests therefore prove the very code the decoders run. Where the draws are
made by inverse CDF (plain temperature, top-p alone), the walk takes a sequential rule's stages
(``_Stages``: SpecInfer, MCSS, SpecTr) only as far as the node's one uniform needs to decide its
outcome (``_lazy_pick``): the residual updates after the accepted candidate are not made, and
SpecTr's rho is not searched for where one pass shows its first candidate accepted
(``_SpectrStages.certify_first``). The uniform, the index it picks, the correction and the
generator's state are those of the whole outcome drawn at once (``tests/verify/test_lazy_walk.py``).

Glossary (as in the papers):

* *accepted*: draft tokens (tree nodes) kept after verification, from the root down;
* *correction*: the token the target emits after every candidate at a node was
  rejected, drawn from the rule's residual distribution;
* *bonus*: the token the target emits when a leaf was accepted, drawn from ``p``
  after that leaf.

Tree layout (batch size 1): row 0 is the root (the context end), nodes
``1..N`` have ``parents[i]`` in ``[0, i)`` (``parents[0] = -1``) and token
``tokens[i]`` (``tokens[0]`` unused). ``p[i]`` / ``q[i]`` are the warped target /
draft next-token distributions after row ``i``; the children of row ``i`` were
drawn from ``q[i]``. Children of a row are taken in increasing index order. ``p``
and ``q`` are ``[N+1, V]`` tensors or ``Rows`` computed on demand (a walk reads only
the rows on its path), whose rows are vectors or their host supports
(``mtad.core.sampling.Support``). This is the code base's token-tree convention
(``mtad.core.runner``).

Devices: the walk runs on the host. ``MultiDraft.verify`` hands it the target's rows, which
cross from the device once per step (``mtad.verify.score.Scores.rows``; the draft's supports
crossed while drafting), so verification costs one device-to-host transfer whatever the tree.
Where the rows stay on an accelerator (plain temperature: a support is the whole row), the walk
is ``mtad.verify.devicewalk``'s: the rules' arithmetic over the vocabulary on the device, the
candidates' masses in one read, the correction or bonus drawn there.

Support. After top-k / top-p a distribution over V ~ 152k tokens has a handful of
nonzero entries. On a long vocabulary each visited node's rule runs on the union of
its P's and Q's supports and its candidates (``compress_support``, exact), and every
draw is made on the support (``mtad.core.sampling``); dense small vocabularies (the exact
tests) run as written. When the two supports are short (``_FAST_MAX``) the rule runs on the
columns as Python floats (``_fast_node``: the same IEEE operations in the rule's dtype, sums
still ``torch.sum``, so the same values bit for bit) and each draw takes the exponentials a
``torch.multinomial`` call would take and its argmax on the host: the same tokens, the same
generator state (``tests/verify/test_small_supports.py``).

Methods:

* SpecInfer -- multi-step speculative sampling, Miao et al., "SpecInfer:
  Accelerating Large Language Model Serving with Tree-based Speculative Inference
  and Verification", ASPLOS 2024. Children i.i.d. from ``q``.
* MCSS -- multi-candidate speculative sampling, Yang et al., "Multi-Candidate
  Speculative Decoding", arXiv:2401.06706 (2024). Siblings drawn from ``q``
  without replacement (``draw_without_replacement``).
* SpecTr -- k-sequential draft selection, Sun et al., "SpecTr: Fast Speculative
  Decoding via Optimal Transport", NeurIPS 2023. ``k`` i.i.d. chain drafts (the root has k
  children, one per chain; equal prefixes are not merged in the tree). At each depth the
  k-sequential rule runs over the next tokens of the k_t drafts consistent with the accepted
  prefix (``merge_equal_prefixes``; rho* recomputed for k_t); drafts agreeing with the
  accepted token stay alive; the path follows the branch of the deepest accepted node. Where
  the draws are made by inverse CDF (plain temperature, top-p alone), rho* is found by selection
  (``spectr_rho_select``: no sort of the vocabulary's ratios; the same root up to the last bits
  of its sums), and those points name it in their identity (``MultiDraft.cdf_draws``); the race
  settings, every committed record's, keep the sort (``spectr_rho``).
* MCNS -- multi-candidate naive sampling: draw ``y ~ p`` and keep it if it is a
  candidate; a lossless sanity baseline.

Numerics: every rule works in the dtype it is given (use float64 for exact
checks). A residual whose mass is 0 in floating point falls back to the current
target distribution. A candidate with ``Q(c) = 0`` could not have been drawn; it
is skipped (never accepted, no update of ``P`` or ``Q``), which keeps every rule
lossless whatever it is given.

The verifier ``MultiDraft(rule)`` (the ``mtad.core.protocols.Verifier`` of these rules) scores a
drafted ``mtad.core.tree.TokenTree`` with one target pass (``mtad.verify.score.score``) and
walks it with the tree's ``q``. Which proposer fits which rule: SpecInfer and SpecTr need the candidates at a node
to be i.i.d. draws from its ``q`` given their number (``mtad.propose.tree.Tree`` with the
``iid`` sampler, ``Chains``, and beam sampling *with replacement*, ``mtad.propose.beam.Beam``,
whose draws given their parent slot are i.i.d. from the parent's ``q`` and whose number of
children per slot does not depend on the children's tokens); MCSS needs siblings drawn
sequentially without replacement from ``q`` (``Tree`` with ``without_replacement``; beam
sampling without replacement does not qualify: a slot's number of children depends on the
tokens drawn under it); MCNS takes any proposal. With ``merge_equal_prefixes`` the
candidates after an accepted node are the children of every row carrying the accepted path
(SpecTr's alive drafts; for beams, slots drawn twice), still i.i.d. given their number.

This module knows nothing about models, caches or tokenizers: distributions and token ids in,
accepted node indices and one token out (the target pass is ``mtad.verify.score``). Chain
speculative sampling (SpD) lives in ``mtad.verify.chain``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from mtad.core import hostfloat, sampling
from mtad.core.decoder import StepContext, StepOutput
from mtad.core.sampling import Rows, Support, as_support, sample
from mtad.core.tree import TokenTree
from mtad.verify.score import score

__all__ = [
    "Compressed",
    "PositionOutcome",
    "MultiDraft",
    "Rows",
    "compress_support",
    "mcns_position",
    "mcss_position",
    "specinfer_position",
    "spectr_position",
    "spectr_position_select",
    "spectr_rho",
    "spectr_rho_select",
]


class PositionOutcome(NamedTuple):
    """Exact outcome distribution of one verification position (sums to 1 overall)."""

    accept_prob: torch.Tensor  # [k] P(candidate i is the one accepted)
    residual: torch.Tensor  # [V] distribution of the correction token if all are rejected
    reject_prob: torch.Tensor  # [] P(every candidate rejected) = 1 - accept_prob.sum()


PositionRule = Callable[[torch.Tensor, torch.Tensor, Sequence[int]], PositionOutcome]


# --------------------------------------------------------------------------- helpers


def _normalise_or(
    v: torch.Tensor,  # [V], non-negative
    fallback: torch.Tensor,  # [V]
) -> torch.Tensor:  # [V]
    """norm(v), or ``fallback`` when v has no mass in floating point. On the CPU the choice is a
    branch on the host (the same values as the device's ``where``, without its passes)."""
    s = v.sum()
    if v.device.type == "cpu":
        return v / s if bool(s > 0) else fallback
    return torch.where(s > 0, v / torch.where(s > 0, s, torch.ones_like(s)), fallback)


def _accept_ratio(
    pc: torch.Tensor,  # [] target mass of the candidate
    qc: torch.Tensor,  # [] proposal mass of the candidate
) -> torch.Tensor:  # []
    """min(1, pc / qc); 0 for a candidate that could not have been drawn (qc = 0)."""
    drawable = qc > 0
    ratio = pc / torch.where(drawable, qc, torch.ones_like(qc))
    return torch.where(drawable, ratio.clamp(max=1.0), torch.zeros_like(ratio))


def _at(x: torch.Tensor, c: int) -> float:
    """``float(x[c])``: a host float32 / float64 vector read through numpy (no torch call; the
    same float), any other by indexing."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and not x.requires_grad:
        return float(x.numpy()[c])
    return float(x[c])


class _Stages:
    """A sequential rule at one node, candidate after candidate: for each, in order, its
    acceptance ``min(1, P(c) / Q(c))`` given that every earlier one was rejected, then (if it
    could have been drawn, ``Q(c) > 0``) the rule's update of ``P`` (and ``Q``), made only when the
    next candidate's ratio or the residual reads it. ``next()`` gives the next candidate's acceptance probability (``reach``
    is then the probability that it and every candidate before it are rejected); ``residual()``
    the distribution of the correction once every candidate taken is rejected. A walk that
    draws the node's outcome by inverse CDF stops as soon as the uniform decides it
    (``_lazy_pick``): the updates after the accepted candidate, each a few passes over the
    vocabulary, are never made. The values made are those the whole rule makes, bit for bit.

    The scalars (a candidate's two masses, its ratio, the products with ``reach``) are Python
    floats rounded to the rows' dtype (float32 / float64: ``_Arith``, the list rules' rounding,
    each operation the tensor one exactly); the rows' updates stay tensors. ``rho`` (SpecTr)
    scales the draft's mass in the ratio, rounded to the dtype first as a tensor product rounds
    it; ``ratio``, where given instead, is the tensor form (another dtype)."""

    def __init__(self, P, Q, cands, update, residual=None, rho: float | Callable[[], float] | None = None,
                 ratio=None):
        self.P, self.Q, self.cands = P, Q, [int(c) for c in cands]
        self.update, self._residual, self._ratio = update, residual, ratio
        self._rho = rho  # a float, or a zero-argument callable that finds it (when first read)
        self.ar = _Arith(P.dtype) if ratio is None and hostfloat.rounding(P.dtype) else None
        if self.ar is None and ratio is None:  # (a dtype without a host form: the tensor ratio)
            self._ratio = (lambda P, Q, c: _accept_ratio(P[c], Q[c])) if rho is None else (
                lambda P, Q, c: _accept_ratio(P[c], self.rho_value() * Q[c]))
        self.rho: float | None = None  # rho rounded to the dtype (host scalars), once found
        # probability that every candidate taken so far was rejected (a float, or a tensor)
        self.reach = 1.0 if self.ar is not None else P.new_ones(())
        self.taken = 0
        self._pending: int | None = None  # a rejected drawable candidate whose update is not made yet

    def _catch_up(self) -> None:
        if self._pending is not None:
            self.P, self.Q = self.update(self.P, self.Q, self._pending)
            self._pending = None

    def next(self) -> float | torch.Tensor:  # P(the next candidate is the one accepted)
        self._catch_up()
        c = self.cands[self.taken]
        self.taken += 1
        if self.ar is None:
            a = self._ratio(self.P, self.Q, c)
            acc = self.reach * a
            self.reach = self.reach * (1 - a)
            if self.Q[c] > 0:  # a candidate that could not have been drawn is skipped
                self._pending = c
            return acc
        one = self.ar.one
        if self._rho is not None and self.rho is None:
            self.rho = one(self.rho_value())
        pc, qc = _at(self.P, c), _at(self.Q, c)
        a = self._accept(pc, qc, self.rho)
        acc = one(self.reach * a)
        self.reach = one(self.reach * one(1.0 - a))
        if qc > 0:  # a candidate that could not have been drawn is skipped
            self._pending = c
        return acc

    def residual(self) -> torch.Tensor:  # [V]
        self._catch_up()
        return self._residual() if self._residual is not None else self.P

    def _accept(self, pc: float, qc: float, rho: float | None) -> float:
        """``_accept_ratio(P[c], rho * Q[c])`` on host floats (``rho`` already in the dtype)."""
        return self.ar.ratio(pc, qc if rho is None else self.ar.one(rho * qc))

    def rho_value(self) -> float:
        """rho as found (a callable given for it runs once, here)."""
        if callable(self._rho):
            self._rho = self._rho()
        return self._rho

    def certify_first(self, t_hi: float) -> bool:
        """Whether the first candidate's acceptance probability is certainly above ``t_hi``
        without the work ``next()`` would do for it (only SpecTr's rho costs any: ``_SpectrStages``)."""
        return False


class _SpectrStages(_Stages):
    """SpecTr's stages, rho found only when a stage needs it. ``certify_first`` can show that the
    first candidate is accepted without it: its acceptance probability ``min(1, p(c) / (rho
    q(c)))`` falls as rho grows (each rounding is monotone), and ``f(rho) = 1 - (1 - beta)^k -
    rho beta`` does not increase in rho (``beta`` falls, ``rho beta = sum min(rho q, p)`` does not),
    so ``f(r) < 0`` at a test point ``r`` puts the first root, which ``spectr_rho`` and
    ``spectr_rho_select`` find, below ``r``: the probability at ``r`` is then a lower bound of the
    one the rule's rho gives. One pass over the row (``beta(r)``) instead of the root's search."""

    #: f(r) must be below -_F_TOL * (k + r): beta(r) read in the rows' dtype (each p / r within two
    #: float32 units of p / r) and summed in float64 moves f by far less
    _F_TOL = 1e-6
    _MARGIN = 1e-4  # the test point sits this far (relative) below the rho the uniform needs

    def residual(self) -> torch.Tensor:  # [V] norm(max(0, p - rho q)); P, Q are p, q throughout
        return _normalise_or((self.P - self.rho_value() * self.Q).clamp_min(0), self.P)

    def certify_first(self, t_hi: float) -> bool:
        if self.ar is None or not callable(self._rho) or self.taken:
            return False  # (rho found already: the stage itself is as cheap)
        k, one = len(self.cands), self.ar.one
        c = self.cands[0]
        pc, qc = _at(self.P, c), _at(self.Q, c)
        if not (0 < pc < math.inf and 0 < qc < math.inf and 0 < t_hi < 1):
            return False
        r = min(float(k), pc / (qc * t_hi) / (1 + self._MARGIN))  # the largest rho tested
        if not r > 1.0:
            return False  # (rho >= 1: no test point can show more)
        if not self._accept(pc, qc, one(r * (1 + 1e-6))) > t_hi:
            return False
        if r >= k:
            return True  # the rule's rho is at most k
        beta = float(torch.minimum(self.Q, self.P / r).sum(dtype=torch.float64))
        return 1 - (1 - beta) ** k - r * beta <= -self._F_TOL * (k + r)


def _outcome(st: _Stages) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every stage taken: (accept_prob [k], residual [V], reject_prob [])."""
    P = st.P
    if st.ar is not None:
        accept = P.new_tensor([st.next() for _ in st.cands]) if st.cands else P.new_zeros(0)
        return accept, st.residual(), P.new_tensor(st.reach)
    accept = P.new_zeros(len(st.cands))
    for i in range(len(st.cands)):
        accept[i] = st.next()
    return accept, st.residual(), st.reach


# --------------------------------------------------------------------------- SpecInfer


def specinfer_position(
    P: torch.Tensor,  # [V] warped target distribution at the node
    Q: torch.Tensor,  # [V] warped draft distribution the candidates were drawn from (i.i.d.)
    cands: Sequence[int],  # [k] candidate tokens, in verification order
) -> PositionOutcome:
    """Multi-step speculative sampling at one node (Miao et al., ASPLOS 2024).

    For each candidate c in order: accept with probability min(1, P(c)/Q(c));
    on rejection ``P <- norm(max(0, P - Q))`` with Q unchanged (the candidates are
    i.i.d.). If all are rejected the correction is drawn from the final P.
    """

    return PositionOutcome(*_outcome(_specinfer_stages(P, Q, cands)))


def _specinfer_stages(P, Q, cands) -> _Stages:
    def update(P, Q, c):
        return _normalise_or((P - Q).clamp_min(0), P), Q

    return _Stages(P, Q, cands, update)


# --------------------------------------------------------------------------- MCSS


def mcss_position(
    P: torch.Tensor,  # [V] warped target distribution at the node
    Q: torch.Tensor,  # [V] warped draft distribution (before any candidate was removed)
    cands: Sequence[int],  # [k] distinct candidate tokens, drawn without replacement from Q
) -> PositionOutcome:
    """Multi-candidate speculative sampling at one node (Yang et al., arXiv:2401.06706).

    For each candidate c in order: accept with probability min(1, P(c)/Q(c)) with
    the current Q; on rejection first ``P <- norm(max(0, P - Q))``, then
    ``Q(c) <- 0; Q <- norm(Q)``. If all are rejected the correction is drawn from P.
    """

    return PositionOutcome(*_outcome(_mcss_stages(P, Q, cands)))


def _mcss_stages(P, Q, cands) -> _Stages:
    def update(P, Q, c):
        P = _normalise_or((P - Q).clamp_min(0), P)
        Q = Q.clone()
        Q[c] = 0
        return P, _normalise_or(Q, torch.zeros_like(Q))

    return _Stages(P, Q, cands, update)


# --------------------------------------------------------------------------- SpecTr


def spectr_rho(
    p: torch.Tensor,  # [V] warped target distribution
    q: torch.Tensor,  # [V] warped draft distribution
    k: int,  # number of i.i.d. candidates
) -> float:
    """rho* in [1, k] solving ``1 - (1 - beta)^k = rho * beta`` (Sun et al., NeurIPS 2023).

    ``beta(rho) = sum_x min(q(x), p(x) / rho)``; k <= 1 gives 1. Returns 1 when
    the root is at 1 (e.g. p = q, or disjoint supports) and k when it is at k.

    ``beta`` is piecewise ``Qs + Pc / rho`` between the breakpoints
    ``rho = p(x)/q(x)`` (``Qs`` = q-mass with ratio >= rho, ``Pc`` = p-mass of the
    other drawable tokens). One vectorised pass evaluates ``f(rho) = 1 - (1 -
    beta)^k - rho beta`` at every breakpoint in [1, k] to find a bracketing piece;
    bisection on that piece's closed form then runs on scalars.
    """
    if k <= 1:
        return 1.0
    if not bool((q > p).any()):
        # q <= p everywhere: beta(1) = sum(q) = 1, so the root is at 1. Decided here, not from
        # f(1): a sum of p one ulp below 1 makes f(1) ~ 1e-16 > 0 and puts a spurious root
        # at ~1 + 1e-16^(1/k) (1.009 at k = 8), depending on the machine's summation order.
        return 1.0
    drawable = q > 0
    qd, pd = q[drawable], p[drawable]  # [n]
    r, order = (pd / qd).sort()  # [n] ascending ratios; token x is "in" (min = q) iff rho <= r_x
    qd, pd = qd[order], pd[order]
    q_in = qd.sum() - qd.cumsum(0) + qd  # [n] q-mass of ratios >= r_j
    p_out = pd.cumsum(0) - pd  # [n] p-mass of ratios < r_j

    def f(rho: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        return 1 - (1 - beta) ** k - rho * beta

    ends = torch.tensor([1.0, float(k)], dtype=p.dtype, device=p.device)  # [2]
    beta_ends = torch.minimum(q, p / ends[:, None]).sum(-1)  # [2]
    inside = (r > 1) & (r < k)
    r_in = r[inside]  # [m] breakpoints strictly inside (1, k), ascending
    points = torch.cat([ends[:1], r_in, ends[1:]])  # [m+2]
    f_points = torch.cat(
        [
            f(ends[:1], beta_ends[:1]),
            f(r_in, q_in[inside] + p_out[inside] / r_in),
            f(ends[1:], beta_ends[1:]),
        ]
    )  # [m+2]
    if f_points[0] <= 0:
        return 1.0
    if f_points[-1] >= 0:
        return float(k)
    i = int(torch.nonzero(f_points <= 0)[0])  # f(points[i-1]) > 0 >= f(points[i])
    lo, hi = float(points[i - 1]), float(points[i])
    # On (lo, hi] the tokens with min = q are exactly those with ratio >= hi.
    return _bisect_rho(lo, hi, float(qd[r >= hi].sum()), float(pd[r < hi].sum()), k)


_SELECT_PIVOTS = 256  # breakpoints a round of ``spectr_rho_select`` evaluates f at (at most)


def spectr_rho_select(
    p: torch.Tensor,  # [V] warped target distribution
    q: torch.Tensor,  # [V] warped draft distribution
    k: int,  # number of i.i.d. candidates
) -> float:
    """``spectr_rho`` without sorting the ratios: the same root of the same piecewise ``f``, its
    bracketing piece found by rounds of selection instead (the drafts' rule under the inverse
    CDF, ``spectr_position_select``).

    A round takes up to ``_SELECT_PIVOTS`` breakpoints still in play (an even spread of a sorted
    sample of them), puts every breakpoint in play into the bucket between two of them, sums
    ``q`` and ``p`` per bucket, and evaluates ``f`` at the pivots from those sums: the first
    pivot where ``f <= 0`` and the one before it bound the root, and only that bucket's
    breakpoints stay in play. A long row takes two or three rounds (a sort of the ratios costs
    several passes over the vocabulary). The sums are made in another order than the sort's
    (per bucket, then across buckets), so the root may differ from ``spectr_rho``'s in its last
    bits (``tests/verify/test_spectr_select.py``)."""
    if k <= 1:
        return 1.0
    if not bool((q > p).any()):
        return 1.0  # (as ``spectr_rho``: q <= p everywhere puts the root at 1)

    def f(rho: float, beta: float) -> float:
        return 1 - (1 - beta) ** k - rho * beta

    if f(1.0, float(torch.minimum(q, p).sum())) <= 0:
        return 1.0
    if f(float(k), float(torch.minimum(q, p / float(k)).sum())) >= 0:
        return float(k)
    # every token in play, none compacted away: an undrawable one (q = 0) weighs nothing (its
    # min(q, p / rho) is 0) and sits at ratio 0; ratios <= 1 fall below every pivot, >= k above
    drawable = q > 0
    if bool(drawable.all()):  # (plain temperature)
        sr, sp = p / q, p.double()  # [n] ratios, unsorted; their p
    else:
        sr = torch.where(drawable, p / torch.where(drawable, q, 1.0), 0.0)
        sp = torch.where(drawable, p, 0.0).double()
    sq = q.double()
    lo, hi = 1.0, float(k)  # f(lo) > 0 >= f(hi)
    inside = (sr > lo) & (sr < hi)
    if not bool(inside.any()):  # no breakpoint inside (1, k): the piece is (1, k] itself
        return _bisect_rho(lo, hi, float(sq[sr >= hi].sum()), float(sp[sr <= lo].sum()), k)
    # every token not yet counted in qs (ratios >= hi, "in": min = q) or pc (ratios <= lo, "out":
    # min = p / rho) keeps its weights in sq, sp; a round counts those it moves out of play
    qs = pc = 0.0
    while True:
        n = sr.numel()
        step = max(1, n // (4 * _SELECT_PIVOTS))
        sample = sr[::step][inside[::step]]  # the breakpoints in play, an even spread of them
        if sample.numel() == 0:
            sample = sr[inside]
            if sample.numel() == 0:
                break
        sample = sample.sort().values
        piv = sample[:: max(1, len(sample) // _SELECT_PIVOTS)].unique_consecutive()  # [m] ascending
        m = piv.numel()
        b = torch.bucketize(sr, piv, right=True)  # [n] pivots <= each ratio: 0..m
        qb = sq.new_zeros(m + 1).index_add_(0, b, sq)  # [m + 1] per bucket (float64)
        pb = sp.new_zeros(m + 1).index_add_(0, b, sp)
        pv = piv.double()
        beta = qs + (qb.sum() - qb.cumsum(0))[:m] + (pc + pb.cumsum(0)[:m]) / pv  # [m] beta at the pivots
        hit = torch.nonzero(1 - (1 - beta) ** k - pv * beta <= 0)  # f <= 0
        j = int(hit[0]) if len(hit) else m  # the first pivot with f <= 0 (m: none)
        if j < m:
            hi = float(piv[j])
            qs += float(qb[j + 1 :].sum())
        if j > 0:
            lo = float(piv[j - 1])
        pc += float(pb[:j].sum())
        idx = torch.nonzero(b == j).flatten()  # the bucket [piv[j-1], piv[j]) (unbounded at the ends)
        r_in, q_in, p_in = sr[idx], sq[idx], sp[idx]
        pc += float(p_in[r_in <= lo].sum())  # its ratios at or below lo (those equal to piv[j-1])
        qs += float(q_in[r_in >= hi].sum())  # and at or above hi (an end bucket's)
        sr, sq, sp = r_in, q_in, p_in
        inside = (sr > lo) & (sr < hi)
        sq, sp = torch.where(inside, sq, 0.0), torch.where(inside, sp, 0.0)  # (counted above)
    return _bisect_rho(lo, hi, qs, pc, k)


def _bisect_rho(lo: float, hi: float, qs: float, pc: float, k: int) -> float:
    """``spectr_rho``'s root on its bracketing piece ``(lo, hi]``, where ``beta = qs + pc / rho``."""
    for _ in range(200):
        mid = (lo + hi) / 2
        if not lo < mid < hi:
            break
        beta = qs + pc / mid
        if 1 - (1 - beta) ** k - mid * beta > 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def spectr_position(
    p: torch.Tensor,  # [V] warped target distribution at the node
    q: torch.Tensor,  # [V] warped draft distribution the candidates were drawn from (i.i.d.)
    cands: Sequence[int],  # [k] candidate tokens, in draw order
) -> PositionOutcome:
    """k-sequential draft selection at one position (Sun et al., NeurIPS 2023).

    With ``rho = spectr_rho(p, q, k)``: accept X_i (first success, in order) with
    probability min(1, p(X_i) / (rho q(X_i))); if none is accepted the correction
    is drawn from ``norm(max(0, p - rho q))``.
    """
    return _spectr(p, q, cands, spectr_rho)


def spectr_position_select(
    p: torch.Tensor,  # [V] warped target distribution at the node
    q: torch.Tensor,  # [V] warped draft distribution the candidates were drawn from (i.i.d.)
    cands: Sequence[int],  # [k] candidate tokens, in draw order
) -> PositionOutcome:
    """``spectr_position`` with rho found by ``spectr_rho_select`` (no sort of the ratios): the
    rule SpecTr's walk runs where the draws are made by inverse CDF (plain temperature, top-p
    alone), whose points name it in their identity (``MultiDraft.cdf_draws``)."""
    return _spectr(p, q, cands, spectr_rho_select)


def _spectr(p, q, cands, find_rho) -> PositionOutcome:
    return PositionOutcome(*_outcome(_spectr_stages(p, q, cands, find_rho)))


def _spectr_stages(p, q, cands, find_rho) -> _Stages:
    k = len(cands)
    if k == 0:
        return _Stages(p, q, cands, None)  # (no candidate: the residual is p)

    return _SpectrStages(p, q, cands, _unchanged, rho=lambda: find_rho(p, q, k))


def _unchanged(P, Q, c):  # SpecTr's one fixed acceptance test: a rejection changes nothing
    return P, Q


# --------------------------------------------------------------------------- MCNS


def mcns_position(
    P: torch.Tensor,  # [V] warped target distribution at the node
    cands: Sequence[int],  # [k] candidate tokens (any proposal)
) -> PositionOutcome:
    """Naive multi-candidate sampling: y ~ P; the first candidate equal to y is accepted.

    Otherwise y is emitted, i.e. drawn from P restricted to the non-candidates.
    """
    accept = P.new_zeros(len(cands))
    outside = torch.ones_like(P, dtype=torch.bool)
    for i, c in enumerate(cands):
        c = int(c)
        if outside[c]:
            accept[i] = P[c]
            outside[c] = False
    rest = torch.where(outside, P, torch.zeros_like(P))
    return PositionOutcome(accept, _normalise_or(rest, P), rest.sum())


# --------------------------------------------------------------------------- tree walking


class Compressed(NamedTuple):
    """One node's P, Q and candidates restricted to the columns where any of them lives."""

    P: torch.Tensor  # [C] columns ``cols`` of P
    Q: torch.Tensor  # [C] columns ``cols`` of Q
    cands: list[int]  # [k] candidates as column indices
    cols: torch.Tensor  # [C] ascending vocabulary ids: compressed column j is token cols[j]


def compress_support(
    P: torch.Tensor | Support,  # [V], or its host support
    Q: torch.Tensor | Support,  # [V], or its host support
    cands: Sequence[int],  # [k]
) -> Compressed:
    """Restrict one verification position to the union of P's and Q's supports and the candidates.

    Exact for every rule here: a column outside the union is 0 in P and Q, so residuals
    (``max(0, P - Q)``, ``max(0, p - rho q)``), MCSS's ``Q`` updates, SpecTr's ``beta``
    and MCNS's leftover mass are 0 there and every normalising sum is unchanged (up to
    floating-point summation order); a fallback to ``P`` stays inside the union. Columns
    keep their ascending order, so when both are drawn on their support
    (``mtad.core.sampling``), a draw from a compressed vector picks the same token, for the
    same generator state, as from the dense vector. Runs on the host (supports). Long
    supports (more than a sixteenth of the vocabulary together) are merged by a mark over the
    vocabulary instead of a sort: the same columns.
    """
    P, Q = as_support(P), as_support(Q)
    (p_ids, p_vals), (q_ids, q_vals) = P.positive(), Q.positive()
    cand_t = torch.tensor([int(c) for c in cands], dtype=torch.long)
    if len(p_ids) == P.size or len(q_ids) == P.size:
        # a whole row on either side (plain temperature): the union is the vocabulary, column j
        # is token j; the same columns and values as the mark below, without its scans
        # (a whole support's masses as they are: the rules write into no vector they are given)
        def whole(ids: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
            if len(ids) == P.size:
                return vals
            return torch.zeros(P.size, dtype=vals.dtype).index_put_((ids,), vals)

        return Compressed(whole(p_ids, p_vals), whole(q_ids, q_vals), cand_t.tolist(),
                          sampling.whole_ids(P.size))
    if 16 * (len(p_ids) + len(q_ids)) > P.size:
        mark = torch.zeros(P.size, dtype=torch.bool)
        for ids in (p_ids, q_ids, cand_t):
            mark[ids] = True
        cols = mark.nonzero().flatten()  # [C] ascending
        rank = mark.cumsum(0) - 1  # [V] token -> its column
        p_at, q_at, c_at = rank[p_ids], rank[q_ids], rank[cand_t]
    else:
        cols = torch.unique(torch.cat([p_ids, q_ids, cand_t]))  # [C] ascending
        p_at, q_at, c_at = (torch.searchsorted(cols, x) for x in (p_ids, q_ids, cand_t))
    Pc = torch.zeros(len(cols), dtype=p_vals.dtype).index_put_((p_at,), p_vals)
    Qc = torch.zeros(len(cols), dtype=q_vals.dtype).index_put_((q_at,), q_vals)
    return Compressed(Pc, Qc, c_at.tolist(), cols)


#: each sequential rule's staged form (``_Stages``), for a walk that draws its outcomes by inverse CDF
_STAGED = {specinfer_position: _specinfer_stages, mcss_position: _mcss_stages,
           spectr_position: lambda p, q, c: _spectr_stages(p, q, c, spectr_rho),
           spectr_position_select: lambda p, q, c: _spectr_stages(p, q, c, spectr_rho_select)}


def _staged(rule: PositionRule):
    return _STAGED.get(rule)


_SLACK = 2.0**-22  # per rounding of a float32 (or float64) product, with room: 4 x float32's unit
_SUM_SLACK = 2.0**-50  # per float64 addition of non-negative masses, with room


def _lazy_pick(st: _Stages, u: float) -> int:
    """The index ``sample(cat([accept_prob, reject_prob]))`` draws with the uniform ``u`` (the
    list form of ``mtad.core.sampling.cdf_positions``: float64 cumulative masses, then a search),
    found with as few stages as decide it: ``len(cands)`` when every candidate is rejected.

    After candidate i the masses still to come (the later acceptances and the final rejection)
    sum to ``reach`` up to the roundings of their products (each ``reach * a`` and
    ``reach * (1 - a)`` within a float's relative unit of the exact product, ``a`` in [0, 1]), so
    the total lies in a bracket of relative width about 1e-6 around ``c_i + reach``. Where every
    total in it puts the search at the same index among those already summed, that index is the
    draw; else the next stage is taken, and with every stage taken the draw is
    ``cdf_list_index``'s own on the whole list (also its refusal of a total that is not positive
    and finite). So the index is always the one the whole rule's outcome gives
    (``tests/verify/test_lazy_walk.py``)."""
    k = len(st.cands)
    if k > 1:  # every mass still to come sums to 1 up to the roundings: the first candidate at once?
        hi = (1 + _SLACK) ** (2 * k) * (1 + _SUM_SLACK) ** (k + 2)
        if st.certify_first(min(u * hi, math.nextafter(hi, 0.0))):
            return 0
    masses: list[float] = []
    c: list[float] = []  # running sums of the masses, as cdf_list_index makes them (in order)
    for i in range(k):
        masses.append(max(float(st.next()), 0.0))
        c.append(masses[-1] if i == 0 else c[-1] + masses[-1])
        n = k - 1 - i  # candidates still to come
        if n == 0:
            break
        reach = max(float(st.reach), 0.0)
        if not (math.isfinite(c[-1]) and math.isfinite(reach)):
            continue
        lo = (c[-1] + reach * (1 - _SLACK) ** (2 * n)) * (1 - _SUM_SLACK) ** (n + 2)
        hi = (c[-1] + reach * (1 + _SLACK) ** (2 * n)) * (1 + _SUM_SLACK) ** (n + 2)
        if not lo > 0:
            continue
        j = bisect.bisect_right(c, min(u * lo, math.nextafter(lo, 0.0)))
        if j < len(c) and bisect.bisect_right(c, min(u * hi, math.nextafter(hi, 0.0))) == j:
            return j
    return sampling.cdf_list_index(masses + [max(float(st.reach), 0.0)], u)


def _lazy_node(staged, P: Support, Q: Support, cands: list[int], squeeze: bool,
               generator: torch.Generator) -> tuple[int, int | None]:
    """``_run_rule`` and the walk's draws at one node, by inverse CDF, stage by stage
    (``_lazy_pick``): (index of the accepted candidate, None), or (len(cands), the correction
    token). The same uniforms, in the same order, and the same index and token."""
    if squeeze:
        c = compress_support(P, Q, cands)
        st, cols = staged(c.P, c.Q, c.cands), c.cols
    else:
        st, cols = staged(P.dense(), Q.dense(), cands), None
    j = _lazy_pick(st, float(sampling.uniforms(1, generator)))
    if j < len(cands):
        return j, None
    token = sample(st.residual(), generator)
    return j, int(cols[token]) if cols is not None else token


def _run_rule(
    rule: PositionRule,
    P: Support,  # [V] on the host
    Q: Support,  # [V] on the host
    cands: list[int],  # [k]
    compress: bool,
) -> tuple[PositionOutcome, torch.Tensor | None]:
    """The rule's outcome, on ``compress_support``'s columns when ``compress`` (then also the columns)."""
    if not compress:
        return rule(P.dense(), Q.dense(), cands), None
    c = compress_support(P, Q, cands)
    return rule(c.P, c.Q, c.cands), c.cols


# --------------------------------------------------------------------------- small supports
# The rules above, on a node's compressed columns as Python floats: the same IEEE operations in
# the rule's dtype, in the same order (one float32 operation is the float64 one rounded to
# float32, exact for + - * / on float32 operands), every sum still a ``torch.sum`` of the same
# vector, so every value a draw reads is bit for bit the tensor rule's. A node's few dozen
# columns then cost a handful of torch calls instead of a few per candidate and operation.

_FAST_MAX = 512  # P's and Q's support sizes together; beyond it the tensor rules are cheaper


class _Arith:
    """Rounding to a dtype (float32 or float64) and its ``torch.sum`` (of equal vectors: once)."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self._sums: dict[tuple[float, ...], float] = {}
        self.one, self.many = hostfloat.rounding(dtype)  # (mtad.core.hostfloat: the rounding rule)

    def sum(self, xs: list[float]) -> float:
        key = tuple(xs)  # (-0.0 and 0.0 are one key: they sum alike)
        if key not in self._sums:
            self._sums[key] = float(torch.tensor(xs, dtype=self.dtype).sum())
        return self._sums[key]

    def normalise_or(self, v: list[float], fallback: list[float]) -> list[float]:
        """``_normalise_or``."""
        s = self.sum(v)
        return self.many([x / s for x in v]) if s > 0 else fallback

    def ratio(self, pc: float, qc: float) -> float:
        """``_accept_ratio``: min(1, pc / qc) rounded (a quotient >= 1 rounds to >= 1), 0 if qc = 0."""
        if not qc > 0:
            return 0.0
        r = pc / qc
        return 1.0 if r >= 1.0 else self.one(r)

    def residual(self, P: list[float], Q: list[float]) -> list[float]:
        """``(P - Q).clamp_min(0)``."""
        return self.many([d if d > 0 else 0.0 for d in (p - q for p, q in zip(P, Q))])


def _fast_sequential(ar: _Arith, P, Q, cands, ratio, update):
    """``_sequential`` on lists. Once every candidate so far is rejected with probability 0
    the rest are accepted with probability 0 and no correction can be drawn: the residual is
    then not computed (None)."""
    accept, reach = [], 1.0
    for c in cands:
        a = ratio(P, Q, c)
        accept.append(ar.one(reach * a))
        reach = ar.one(reach * ar.one(1.0 - a))
        if reach == 0.0:
            return accept + [0.0] * (len(cands) - len(accept)), None, reach
        if Q[c] > 0:
            P, Q = update(P, Q, c)
    return accept, P, reach


def _fast_specinfer(ar: _Arith, P, Q, cands):
    def update(P, Q, c):
        return ar.normalise_or(ar.residual(P, Q), P), Q

    return _fast_sequential(ar, P, Q, cands, lambda P, Q, c: ar.ratio(P[c], Q[c]), update)


def _fast_mcss(ar: _Arith, P, Q, cands):
    def update(P, Q, c):
        P = ar.normalise_or(ar.residual(P, Q), P)
        Q = list(Q)
        Q[c] = 0.0
        return P, ar.normalise_or(Q, [0.0] * len(Q))

    return _fast_sequential(ar, P, Q, cands, lambda P, Q, c: ar.ratio(P[c], Q[c]), update)


def _fast_spectr(ar: _Arith, P, Q, cands):
    k = len(cands)
    if k <= 1 or not any(q > p for p, q in zip(P, Q)):  # spectr_rho's own first exits
        rho = 1.0
    else:
        rho = spectr_rho(torch.tensor(P, dtype=ar.dtype), torch.tensor(Q, dtype=ar.dtype), k)
    rho = ar.one(rho)  # a Python float meets the rule's tensors in their dtype
    rq = ar.many([rho * q for q in Q])
    accept, _, reject = _fast_sequential(ar, P, Q, cands, lambda P, Q, c: ar.ratio(P[c], rq[c]),
                                         lambda P, Q, c: (P, Q))
    return accept, ar.normalise_or(ar.residual(P, rq), P) if reject > 0 else None, reject


def _fast_mcns(ar: _Arith, P, Q, cands):
    accept, out = [], set()
    for c in cands:
        accept.append(0.0 if c in out else P[c])
        out.add(c)
    rest = [0.0 if j in out else x for j, x in enumerate(P)]
    return accept, ar.normalise_or(rest, P), ar.sum(rest)  # (one sum: the same vector)


def _multinomial(vals: torch.Tensor, generator: torch.Generator) -> int:
    """``torch.multinomial(vals, 1, generator=generator)`` for masses known to be valid
    (non-negative, finite, not all 0): the n exponentials that call draws from the generator
    in ``vals``' dtype and its ``argmax(vals / e)``, without its checks of the masses
    (``mtad.core.hostfloat``; ``tests/verify/test_small_supports.py``). By inverse CDF where the
    generator draws so (``mtad.core.sampling.cdf_positions``)."""
    if sampling.inverse_cdf(generator):
        return sampling.cdf_positions(vals, 1, True, generator)[0]
    e = hostfloat.exponentials(vals.numel(), vals.dtype, generator)
    return int((vals / e).argmax())


def _draw_masses(masses: list[float], dtype: torch.dtype, generator: torch.Generator) -> int:
    """``torch.multinomial(torch.tensor(masses, dtype=dtype), 1, generator=generator)`` on masses
    checked here: its n exponentials, and ``argmax(masses / e)`` in the dtype on the host."""
    if not all(0.0 <= v < math.inf for v in masses):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if not any(v > 0 for v in masses):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    if sampling.inverse_cdf(generator):  # one uniform, the float64 cumulative masses on the list
        return sampling.cdf_list_index(masses, float(sampling.uniforms(1, generator)))
    e = hostfloat.exponentials(len(masses), dtype, generator).tolist()
    if 0.0 in e:  # x / 0: as the tensors divide it
        return int((torch.tensor(masses, dtype=dtype) / torch.tensor(e, dtype=dtype)).argmax())
    return hostfloat.multinomial_pick(masses, e, dtype)


def _draw_list(vals: list[float], dtype: torch.dtype, generator: torch.Generator) -> int:
    """``sample`` of the vector ``vals``: its index drawn on its support."""
    if len(vals) <= sampling.DENSE_MAX:
        return _draw_masses(vals, dtype, generator)
    nz = [i for i, v in enumerate(vals) if v > 0]  # the nonzero entries, as ``support`` keeps them
    return nz[_draw_masses([vals[i] for i in nz], dtype, generator)]


def _draw_support(s: Support, generator: torch.Generator) -> int:
    """``sample`` of a host support (``mtad.core.sampling.draw``): by ``_draw_masses`` when short,
    else by ``_multinomial``."""
    if len(s.vals) <= _FAST_MAX and s.vals.dtype in (torch.float32, torch.float64):
        j = _draw_masses(s.vals.tolist(), s.vals.dtype, generator)
    else:
        tot = float(s.vals.sum())  # the masses are >= 0 (a support); nan / inf / no mass: refused
        if not 0 < tot < math.inf:
            raise RuntimeError(f"invalid multinomial distribution (sum of probabilities {tot})")
        j = _multinomial(s.vals, generator)
    return j if len(s.ids) == s.size else int(s.ids[j])


def _fast_columns(P: Support, Q: Support, cands: list[int]):
    """``compress_support`` on lists: (columns, P, Q, candidate columns)."""
    pm = {i: v for i, v in zip(P.ids.tolist(), P.vals.tolist()) if v > 0}
    qm = {i: v for i, v in zip(Q.ids.tolist(), Q.vals.tolist()) if v > 0}
    cols = sorted({*pm, *qm, *cands})
    at = {t: j for j, t in enumerate(cols)}
    return cols, [pm.get(t, 0.0) for t in cols], [qm.get(t, 0.0) for t in cols], [at[c] for c in cands]


def _fast_node(fast, P: Support, Q: Support, cands: list[int],
               generator: torch.Generator) -> tuple[int, int | None]:
    """One visited node by ``fast`` on its compressed columns, drawn as ``_walk`` draws it:
    (index of the accepted candidate, None), or (len(cands), the correction token)."""
    ar = _Arith(P.vals.dtype)
    cols, Pl, Ql, cc = _fast_columns(P, Q, cands)
    accept, residual, reject = fast(ar, Pl, Ql, cc)
    j = _draw_list(accept + [reject], ar.dtype, generator)
    if j < len(cands):
        return j, None
    if residual is None:  # a draw never picks a zero mass
        raise RuntimeError("a correction was drawn with probability 0")
    return j, cols[_draw_list(residual, ar.dtype, generator)]


def _fits_fast(P: Support, Q: Support) -> bool:
    dt = P.vals.dtype
    return (dt == Q.vals.dtype and dt in (torch.float32, torch.float64)
            and len(P.ids) + len(Q.ids) <= _FAST_MAX)


def _children(parents: Sequence[int], num_rows: int) -> list[list[int]]:
    if len(parents) != num_rows:
        raise ValueError(f"parents has {len(parents)} rows, p/q have {num_rows}")
    if num_rows == 0 or parents[0] != -1:
        raise ValueError("row 0 must be the root: parents[0] = -1")
    kids: list[list[int]] = [[] for _ in range(num_rows)]
    for i in range(1, num_rows):
        if not (0 <= parents[i] < i):
            raise ValueError(f"parents[{i}] = {parents[i]} must be in [0, {i})")
        kids[parents[i]].append(i)
    return kids


def _walk(
    parents: Sequence[int],  # [N+1]
    tokens: Sequence[int],  # [N+1]
    p: torch.Tensor | Rows,  # [N+1, V]
    q: torch.Tensor | Rows,  # [N+1, V]
    generator: torch.Generator,
    rule: PositionRule,
    merge_equal_prefixes: bool = False,
    compress: bool | None = None,
) -> tuple[list[int], int]:
    """Walk the tree from the root, drawing each node's outcome from ``rule``.

    Without merging, the candidates at a node are its children. With merging
    (SpecTr's k chains), they are the children of every node whose path carries
    the same tokens as the accepted prefix ("alive" drafts). With ``compress`` the
    rule runs on ``compress_support``'s columns of each visited node (same outcome)
    and a correction is mapped back to the vocabulary; ``None`` compresses
    vocabularies longer than ``mtad.core.sampling.DENSE_MAX``. Only the visited rows of
    ``p`` and ``q`` are read, as host supports (``mtad.core.sampling.Support``): the walk and
    every draw run on the host; rows that are device tensors cross when read (a decoder
    passes ``Rows`` that bring a whole tree's rows across in one transfer).
    """
    parents = [int(x) for x in parents]
    tokens = [int(x) for x in tokens]
    if isinstance(p, torch.Tensor) or isinstance(q, torch.Tensor):
        if not (isinstance(p, torch.Tensor) and isinstance(q, torch.Tensor)) or (
            p.shape != q.shape or p.dim() != 2
        ):
            raise ValueError(
                f"p and q must both be [N+1, V], got {tuple(getattr(p, 'shape', ()))} "
                f"and {tuple(getattr(q, 'shape', ()))}"
            )
    if len(tokens) != len(p) or len(q) != len(p):
        raise ValueError(f"tokens has {len(tokens)} rows, p/q have {len(p)} / {len(q)}")
    from mtad.verify import devicewalk  # (it builds on this module)

    if rule is spectr_position and sampling.inverse_cdf(generator):
        rule = spectr_position_select  # the inverse-CDF settings' SpecTr: rho without a sort

    vectors = devicewalk.device_rows(p, q) if compress is not False and rule in devicewalk.RULES else None
    if vectors is not None:
        return devicewalk.device_walk(parents, tokens, *vectors, generator, rule, merge_equal_prefixes)
    kids = _children(parents, len(p))
    fast = _FAST.get(rule)
    lazy = _staged(rule) if sampling.inverse_cdf(generator) else None
    node, alive = 0, [0]
    while True:
        cand_nodes = [c for a in alive for c in kids[a]]
        if not cand_nodes:  # a leaf was accepted (or the tree is empty): bonus
            row = p[node]
            token = _draw_support(row, generator) if isinstance(row, Support) else sample(row, generator)
            break
        P, Q = as_support(p[node]), as_support(q[node])
        cands = [tokens[c] for c in cand_nodes]
        squeeze = compress if compress is not None else P.size > sampling.DENSE_MAX
        if squeeze and fast is not None and _fits_fast(P, Q):
            j, token = _fast_node(fast, P, Q, cands, generator)
            if token is not None:  # every candidate rejected: correction
                break
        elif lazy is not None and len(cands) < sampling._LIST_MAX:  # outcome by inverse CDF: stage by stage
            j, token = _lazy_node(lazy, P, Q, cands, squeeze, generator)
            if token is not None:  # every candidate rejected: correction
                break
        else:
            out, cols = _run_rule(rule, P, Q, cands, squeeze)
            j = sample(torch.cat([out.accept_prob, out.reject_prob.reshape(1)]), generator)
            if j == len(cand_nodes):  # every candidate rejected: correction
                token = sample(out.residual, generator)
                if cols is not None:
                    token = int(cols[token])
                break
        node = cand_nodes[j]
        alive = (
            [c for c in cand_nodes if tokens[c] == tokens[node]] if merge_equal_prefixes else [node]
        )
    path = []
    while node != 0:
        path.append(node)
        node = parents[node]
    return path[::-1], token


def _mcns_rule(P, Q, cands):
    return mcns_position(P, cands)


RULES: dict[str, PositionRule] = {
    "specinfer": specinfer_position,
    "mcss": mcss_position,
    "spectr": spectr_position,
    "mcns": _mcns_rule,
}
#: each rule's list form for small supports (``_fast_node``)
_FAST = {specinfer_position: _fast_specinfer, mcss_position: _fast_mcss, spectr_position: _fast_spectr,
         spectr_position_select: _fast_spectr, _mcns_rule: _fast_mcns}  # (short: a sort is cheap)


class MultiDraft:
    """A multi-draft rule as a verifier: one target pass over the tree, then the walk.

    ``rule``: ``specinfer``, ``mcss``, ``spectr`` or ``mcns`` (see the module docstring for
    the proposers each one is lossless with); ``merge_equal_prefixes``: also try the children
    of every row carrying the accepted path (on for SpecTr's chains).
    """

    target_pass = "tree"
    lossless = True
    knobs = ()
    #: what each rule needs from a draft (see the module docstring)
    NEEDS = {
        "specinfer": ("node_q", "iid_children"),
        "mcss": ("node_q", "siblings_without_replacement"),
        "spectr": ("node_q", "iid_chains"),
        "mcns": ("node_q",),
    }

    @staticmethod
    def needs(rule: str, **_) -> tuple[str, ...]:
        return MultiDraft.NEEDS[rule]

    @staticmethod
    def cdf_draws(rule: str, **_) -> str | None:
        """What changes in its walk where the draws are made by inverse CDF, named in those points'
        identity (``draw_version``): SpecTr finds rho by selection (``spectr_rho_select``)."""
        return "spectr_rho_select" if rule == "spectr" else None

    def __init__(self, rule: str, merge_equal_prefixes: bool | None = None):
        if rule not in RULES:
            raise ValueError(f"rule must be one of {tuple(RULES)}, got {rule!r}")
        self.rule = rule
        self.merge = (rule == "spectr") if merge_equal_prefixes is None else merge_equal_prefixes

    def walk(
        self,
        parents: Sequence[int],  # [N+1], parents[0] = -1
        tokens: Sequence[int],  # [N+1], tokens[0] unused
        p: torch.Tensor | Rows,  # [N+1, V] warped target distribution after each row
        q: torch.Tensor | Rows,  # [N+1, V] warped draft distribution each row's children came from
        generator: torch.Generator,
        compress: bool | None = None,
    ) -> tuple[list[int], int]:
        """The rule over a scored tree: (accepted path of rows, correction/bonus token).

        The children of each row must be drawn from its ``q`` as the rule needs (i.i.d. for
        SpecInfer and SpecTr, without replacement in index order for MCSS; MCNS ignores ``q``).
        """
        return _walk(parents, tokens, p, q, generator, RULES[self.rule],
                     merge_equal_prefixes=self.merge, compress=compress)

    def verify(self, ctx: StepContext, tree: TokenTree) -> StepOutput:
        p = score(ctx, tree).rows()  # [N+1] host supports, read lazily
        path, y = self.walk(tree.parents, tree.tokens, p, tree.q, ctx.generator)
        return StepOutput(tokens=tree.path_tokens(path) + [y], drafted=tree.depth,
                          accepted=len(path), tree_size=len(tree.unique_rows))

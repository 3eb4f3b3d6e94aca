"""Logit warping shared by every decoder and baseline.

One function, applied identically to target and draft: temperature, then top-k,
then top-p (nucleus, Hugging Face semantics: keep the smallest set of most likely
tokens whose mass reaches ``top_p``; the most likely token is always kept).
Temperature 0 means greedy: the warped distribution is one-hot on the argmax
(first index on ties), so every sampling rule collapses to greedy decoding.

On the CPU, top-k then top-p runs on the k candidates only (``_top_k_candidates``, which
reads the number of tied candidates on the host), and top-p alone finds the nucleus by
bucketing the logits (``_nucleus_remove``) instead of sorting the vocabulary, and applies it
without a mask over the vocabulary where the logits are finite (``_nucleus_logits``); on an
accelerator the general path runs (a sort over the vocabulary, no host round-trip). They
keep the same tokens with the same probabilities, up to floating-point summation order (and
the order of tied logits at the nucleus boundary, which a sort leaves unspecified).

This module knows nothing about models: logits in, probabilities out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from mtad.core.topk import argmax_rows, topk_rows

TOP_P_HINT = 255  # support_bound's guess for a nucleus without top-k (a transfer hint only)
#: how draws turn the generator's stream into tokens (``Warping.draws``; ``mtad.core.sampling``)
RACE, INVERSE_CDF = "race", "inverse_cdf"
DRAW_SCHEMES = (RACE, INVERSE_CDF)


@dataclass(frozen=True)
class Warping:
    """Sampling parameters shared by target and draft."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    #: the draw scheme (``DRAW_SCHEMES``); None: ``default_draws`` (inverse CDF where a support
    #: is not bounded by top-k or greedy: plain temperature, top-p alone)
    draws: str | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(
                f"temperature must be >= 0 (0 = greedy), got {self.temperature}; "
                "set e.g. temperature=1.0"
            )
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}; use top_p=1.0 to disable")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = disabled), got {self.top_k}")
        if self.draws is not None and self.draws not in DRAW_SCHEMES:
            raise ValueError(f"draws must be one of {', '.join(DRAW_SCHEMES)} (or unset), got {self.draws!r}")

    @property
    def scheme(self) -> str:
        """The draw scheme in force: ``draws``, or ``default_draws`` of these settings."""
        return self.draws or default_draws(self.temperature, self.top_k)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def support_bound(self) -> int | None:
        """How many nonzero entries a warped row has at most, as a hint for host transfers.

        1 at temperature 0 (one-hot); with top-k, ``4 k + 64`` (ties at the k-th logit keep
        every tied token; the fast path handles that many); with top-p alone, ``TOP_P_HINT``
        (a nucleus is usually far smaller than the vocabulary); None when unbounded (plain
        temperature: every token has mass). A row past the hint is still handled exactly
        (``mtad.core.sampling.host_supports`` reads its support in a second transfer).
        """
        if self.greedy:
            return 1
        if self.top_k > 0:
            return 4 * self.top_k + 64
        return TOP_P_HINT if self.top_p < 1.0 else None

    @property
    def support_hinted(self) -> bool:
        """Whether ``support_bound`` is a hint only (top-p alone: a nucleus may run far past it),
        so that a verification reads its candidate final rows' support sizes with its scalars
        (``mtad.core.sampling.support_sizes``) and draws a long one on the device without first
        reading its hint. With top-k the bound holds but for ties past ``4 k + 64``; at
        temperature 0 a support is one token; plain temperature draws on the device anyway."""
        return not self.greedy and self.top_k == 0 and self.top_p < 1.0

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return warp_probs(logits, self.temperature, self.top_k, self.top_p)

    def candidates(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``warp_candidates`` with these parameters."""
        return warp_candidates(logits, self.temperature, self.top_k, self.top_p)


def default_draws(temperature: float, top_k: int) -> str:
    """The draw scheme of settings that do not name one: ``INVERSE_CDF`` (one uniform per draw,
    ``mtad.core.sampling``; a beam's two, ``mtad.propose.beam``) at temperature > 0 without top-k, where a support may be the whole
    vocabulary; ``RACE`` (one exponential per support entry, ``torch.multinomial``'s) elsewhere,
    where a support holds at most ``4 k + 64`` entries (top-k) or one (greedy)."""
    return INVERSE_CDF if temperature > 0 and top_k == 0 else RACE


def warp_probs(
    logits: torch.Tensor,  # [..., V]
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:  # [..., V], rows sum to 1
    """Warped next-token distribution. Computed in float32 at least (float64 stays float64)."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logits = logits.to(dtype)
    if temperature == 0:
        out = torch.zeros_like(logits)
        out.scatter_(-1, argmax_rows(logits).unsqueeze(-1), 1.0)  # torch.argmax's (first maximum)
        return out
    if temperature != 1.0:  # x / 1.0 == x: no pass over the vocabulary for it
        logits = logits / temperature
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        # the fast path reads the number of ties on the host; an accelerator sorts instead
        fast = _top_k_candidates(logits, top_k, top_p) if logits.device.type == "cpu" else None
        if fast is not None:
            idx, probs = fast
            return torch.zeros_like(logits).scatter_(-1, idx, probs)
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        if logits.device.type == "cpu" and logits.dim() >= 1 and logits.shape[-1] > _NUCLEUS_BUCKETS:
            return _nucleus_logits(logits.reshape(-1, vocab), top_p).reshape(logits.shape).softmax(-1)
        else:
            sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=False)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            remove_sorted = cum <= (1 - top_p)
            remove_sorted[..., -1] = False  # always keep the most likely token
            remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits.softmax(-1)


_NUCLEUS_BUCKETS = 2048
_NUCLEUS_SLACK = 1e-6  # cumulative mass within this of 1 - top_p is decided token by token


def _nucleus_remove(logits: torch.Tensor, top_p: float) -> torch.Tensor:  # [R, V] -> [R, V] bool
    """The tokens top-p removes, as the sorting path decides, without sorting the vocabulary.

    The sorting path sorts each row's logits ascending and removes a token when the
    cumulative mass up to it (``softmax(sorted).cumsum()``, accumulated in float64 by
    torch on the CPU, compared in the logits' dtype) is at most ``1 - top_p``. Here the
    logits are put in ``_NUCLEUS_BUCKETS`` equal-width buckets (ascending logit), the
    buckets' masses summed in float64: a token in a bucket whose cumulative mass is below
    ``1 - top_p - slack`` is removed, one above ``1 - top_p + slack`` is kept, and only the
    tokens of the few buckets between (tens, for real and random rows alike) are sorted and
    decided by the same comparison. Same tokens as the sorting path except (a) a cumulative
    mass within a rounding error of ``1 - top_p`` (the softmax's normaliser is summed in
    another order) and (b) tied logits at the boundary, which the sorting path orders
    arbitrarily and this one by token id (lower ids removed first). ``tests/core/test_warping.py``
    compares both.
    """
    rows, _ = logits.shape
    thr = 1 - top_p
    p = logits.softmax(-1).double()
    top = logits.max(-1, keepdim=True).values
    low = torch.where(logits > float("-inf"), logits, top).min(-1, keepdim=True).values
    # a row of equal logits (or all but equal: the quotient overflows) has one bucket, 0
    scale = ((_NUCLEUS_BUCKETS - 1) / (top - low).clamp_min(torch.finfo(logits.dtype).tiny)).nan_to_num(posinf=0.0)
    bucket = ((logits - low) * scale).clamp_(0, _NUCLEUS_BUCKETS - 1).long()  # ascending logit
    through = torch.zeros(rows, _NUCLEUS_BUCKETS, dtype=torch.float64).scatter_add_(-1, bucket, p).cumsum(-1)
    first = (through <= thr - _NUCLEUS_SLACK).sum(-1, keepdim=True)  # buckets before it: removed
    last = (through <= thr + _NUCLEUS_SLACK).sum(-1, keepdim=True)  # buckets after it: kept
    below = torch.cat([through.new_zeros(rows, 1), through], -1).gather(-1, first)  # mass before `first`
    remove = bucket < first
    band = (bucket >= first) & (bucket <= last)
    thr_dtype = torch.tensor(thr, dtype=logits.dtype)
    for r in range(rows):
        ids = torch.nonzero(band[r]).flatten()
        ids = ids[torch.sort(logits[r, ids], stable=True).indices]  # ascending; ties by id
        cum = (below[r] + p[r, ids].cumsum(0)).to(logits.dtype)
        remove[r, ids] = cum <= thr_dtype
    return remove.scatter_(-1, logits.argmax(-1, keepdim=True), False)  # always keep the most likely


_LEAST_STEPS = 8  # representable values ``_least_in_bucket`` steps from an estimate before giving up


def _least_in_bucket(k: int, low: float, scale: float, dtype: torch.dtype) -> float | None:
    """The least value ``v`` of ``dtype`` that ``_nucleus_remove``'s bucketing puts in bucket ``k``
    or above (1 <= k < ``_NUCLEUS_BUCKETS``): ``(v - low) * scale``, rounded in ``dtype`` after
    each operation as the tensor operations round it, is at least ``k``. That is monotone in
    ``v`` (``scale > 0``), so a logit is in bucket ``k`` or above exactly when it is at least
    this value.

    Found in two steps: the least difference ``d`` whose product with ``scale`` reaches ``k``
    (from ``k / scale``, a step or two at most), then the least ``v`` whose difference with
    ``low`` rounds to ``d`` or more: ``v - low`` (exact before rounding) at least the midpoint
    between ``d`` and the value below it, computed exactly (``fractions.Fraction``). The answer
    is checked with the operations themselves (``v`` in, the value below it out); None where
    that check fails or a search runs past ``_LEAST_STEPS`` (the caller then masks)."""
    dt = _np_dtype(dtype)
    lo, sc, kk = dt(low), dt(scale), dt(k)
    up, down = dt(math.inf), dt(-math.inf)

    def least(v, ok):  # the least value from ``v`` on (stepping up, then down) where ``ok`` holds
        for _ in range(_LEAST_STEPS):
            if ok(v):
                break
            v = np.nextafter(v, up)
        else:
            return None
        for _ in range(_LEAST_STEPS):
            w = np.nextafter(v, down)
            if not ok(w):
                return v
            v = w
        return None

    d = least(dt(k / scale), lambda x: dt(x * sc) >= kk)
    if d is None:
        return None
    target = Fraction(float(lo)) + (Fraction(float(np.nextafter(d, down))) + Fraction(float(d))) / 2
    v = least(dt(float(target)), lambda x: dt(x - lo) >= d)
    if v is None or not dt(dt(v - lo) * sc) >= kk or dt(dt(np.nextafter(v, down) - lo) * sc) >= kk:
        return None
    return float(v)


def _nucleus_logits(logits: torch.Tensor, top_p: float) -> torch.Tensor:  # [R, V] -> [R, V]
    """``logits.masked_fill(_nucleus_remove(logits, top_p), -inf)``, the very tensor, with fewer
    passes over the vocabulary (the masked fill and the reductions on a boolean mask are the
    slow ones on the CPU).

    The same buckets, bucket masses, band and decisions in the band as ``_nucleus_remove``;
    what differs is how they are applied. A token below the band (bucket < ``first``) is
    removed: since the bucket grows with the logit, those are exactly the logits below the
    least value of bucket ``first`` (``_least_in_bucket``, found on the host), and one
    ``threshold_`` per row sets them to -inf. The band's tokens the cumulative mass removes are
    set to -inf by index (tens of them); the most likely token is kept as ``_nucleus_remove``
    keeps it (the first maximum: if any of the row's maximal tokens is in the band, all are,
    and the lowest id among them). The extremes come from ``amax`` / ``amin`` (the values of
    ``max`` / ``min``, without their indices). A call with a row of non-finite logits (-inf
    from top-k), of equal ones, or whose least value is not found within ``_LEAST_STEPS``, takes
    ``_nucleus_remove`` and the masked fill. ``tests/core/test_warping.py`` compares both, bit for bit."""
    rows, _ = logits.shape
    thr = 1 - top_p
    top = logits.amax(-1, keepdim=True)
    low = logits.amin(-1, keepdim=True)
    scale = (_NUCLEUS_BUCKETS - 1) / (top - low).clamp_min(torch.finfo(logits.dtype).tiny)
    ends = torch.cat([top, low, scale], -1).tolist()
    if not all(math.isfinite(t) and math.isfinite(lo) and 0 < sc < math.inf for t, lo, sc in ends):
        return logits.masked_fill(_nucleus_remove(logits, top_p), float("-inf"))
    p = logits.softmax(-1).double()
    bucket = ((logits - low) * scale).clamp_(0, _NUCLEUS_BUCKETS - 1).long()  # ascending logit
    through = torch.zeros(rows, _NUCLEUS_BUCKETS, dtype=torch.float64).scatter_add_(-1, bucket, p).cumsum(-1)
    first = (through <= thr - _NUCLEUS_SLACK).sum(-1, keepdim=True)  # buckets before it: removed
    last = (through <= thr + _NUCLEUS_SLACK).sum(-1, keepdim=True)  # buckets after it: kept
    below = torch.cat([through.new_zeros(rows, 1), through], -1).gather(-1, first)  # mass before `first`
    firsts, lasts = torch.cat([first, last], -1).T.tolist()
    cuts = [None if f == 0 else _least_in_bucket(f, lo, sc, logits.dtype) for f, (_, lo, sc) in zip(firsts, ends)]
    if any((f > 0 and c is None) or f >= _NUCLEUS_BUCKETS for f, c in zip(firsts, cuts)):  # (none above)
        return logits.masked_fill(_nucleus_remove(logits, top_p), float("-inf"))
    # [n, 2]: by row, ids ascending (a band of one bucket, the usual one, in one comparison)
    band = torch.nonzero(bucket == first if firsts == lasts else (bucket >= first) & (bucket <= last))
    counts = torch.bincount(band[:, 0], minlength=rows).tolist()
    out = logits.clone()
    thr_dtype = torch.tensor(thr, dtype=logits.dtype)
    at = 0
    for r in range(rows):
        if cuts[r] is not None:  # below the least logit of bucket `first`: removed
            torch.nn.functional.threshold_(out[r], _below(cuts[r], logits.dtype), float("-inf"))
        ids = band[at : at + counts[r], 1]
        at += counts[r]
        vals = logits[r, ids]
        order = torch.sort(vals, stable=True).indices  # ascending; ties by id
        ids = ids[order]
        cum = (below[r] + p[r, ids].cumsum(0)).to(logits.dtype)
        drop = ids[cum <= thr_dtype]
        tops = ids[vals[order] == ends[r][0]]  # the row's maximal tokens in the band (all or none)
        if len(tops):
            drop = drop[drop != tops.min()]  # the most likely token is kept
        out[r].index_fill_(0, drop, float("-inf"))
    return out


def _below(v: float, dtype: torch.dtype) -> float:
    """The largest value of ``dtype`` below ``v``: ``threshold_`` keeps what is above it."""
    dt = _np_dtype(dtype)
    return float(np.nextafter(dt(v), dt(-math.inf)))


def _np_dtype(dtype: torch.dtype) -> type:
    """numpy's scalar type of the logits' dtype (float32 or float64 here: ``warp_probs``)."""
    return np.float32 if dtype == torch.float32 else np.float64


def warp_candidates(
    logits: torch.Tensor,  # [R, V]
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor] | None:  # ids [R, c], probabilities [R, c]; or None
    """The warped rows by their candidates: ``warp_probs(logits)`` is zero outside ``ids`` and
    equals ``probs`` there (the very values it scatters; a candidate top-p removed has 0).

    What a caller that needs only the nonzero entries reads instead of the dense rows (no
    zeroed [R, V] buffer, no scan of it for its support): at temperature 0 the argmax with
    probability 1, on any device; with top-k on the CPU the fast path's candidates. None
    where ``warp_probs`` takes its general path (no top-k, an accelerator, many ties).
    """
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    if temperature == 0:
        ids = argmax_rows(logits).unsqueeze(-1)  # torch.argmax's (first maximum)
        return ids, torch.ones(ids.shape, dtype=dtype, device=logits.device)
    if not (0 < top_k < logits.shape[-1]) or logits.device.type != "cpu":
        return None
    logits = logits.to(dtype)
    if temperature != 1.0:
        logits = logits / temperature
    return _top_k_candidates(logits, top_k, top_p)


def _top_k_candidates(
    logits: torch.Tensor, top_k: int, top_p: float,
) -> tuple[torch.Tensor, torch.Tensor] | None:  # ids [..., c], probabilities [..., c]
    """Top-k then top-p on the k candidates only (no sort over the whole vocabulary).

    Same result as the general path. Ties at the k-th logit (common with bfloat16 logits)
    keep every tied token, as the general path does: the candidates are then the top ``c``
    (``c`` = most tokens any row keeps) with those below the row's k-th logit masked out.
    Returns None (use the general path) only when ties would make ``c`` large.

    The tie check costs no pass over the vocabulary when the top ``k + 1`` logits are strictly
    decreasing (every row, the usual case with float32 logits): then no other token reaches the
    k-th logit (``c = k``) and the first ``k`` of them are the top-k's values and ids in its
    order (distinct values: one order). Otherwise the entries at or above the k-th are counted
    on the whole rows, as before.
    """
    if top_k + 1 < logits.shape[-1]:
        vals, idx = topk_rows(logits, top_k + 1)  # [..., k + 1], descending (torch.topk's)
        if bool((vals[..., :-1] > vals[..., 1:]).all()):  # strictly decreasing (NaN: False)
            return _top_p_of(vals[..., :-1].contiguous(), idx[..., :-1].contiguous(), top_p)
    vals, idx = torch.topk(logits, top_k, dim=-1)  # [..., k], descending
    kth = vals[..., -1:]
    c = int((logits >= kth).sum(-1).max())
    if c > top_k:
        if c > 4 * top_k + 64:
            return None
        vals, idx = torch.topk(logits, c, dim=-1)  # ties: every token >= the k-th logit
        vals = vals.masked_fill(vals < kth, float("-inf"))
    return _top_p_of(vals, idx, top_p)


def _top_p_of(vals: torch.Tensor, idx: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-p on the top-k candidates (``vals`` descending): their ids and warped probabilities."""
    if top_p < 1.0:
        probs = vals.softmax(-1)
        # mass of this token and every less likely kept token (the ascending cumsum, read backwards)
        tail = probs.flip(-1).cumsum(-1).flip(-1)
        remove = tail <= (1 - top_p)
        remove[..., 0] = False  # always keep the most likely token
        vals = vals.masked_fill(remove, float("-inf"))
    return idx, vals.softmax(-1)

"""Inverse-CDF draws on long host rows without the whole cumulative sum: the same index, bit for bit.

The inverse-CDF scheme (``mtad.core.sampling``) defines a draw by the row's float64 cumulative
masses ``c = x.double().cumsum(-1)``: for a uniform ``u`` the draw is the first entry with
``c > min(u * c[-1], nextafter(c[-1], 0))`` (``cdf_search``). Making ``c`` costs a float64
conversion and a sequential sum of the whole row, although the index depends on the sums only
near its target. Here, on the CPU:

1. each block of ``BLOCK`` entries is summed in float64 (``torch.sum``, any order) and the block
   sums cumulated (``p``): every ``p`` is a float64 sum of a prefix of the row;
2. the target's block is the one whose ends, widened by ``slack``, bracket the whole interval
   the target can lie in;
3. that block alone is summed in order and added to the sum before it (``L``), and the entry is
   the one whose sums, widened by ``slack``, bracket that interval.

Why that is the index ``c`` gives: every value compared (``p``, ``L``, and ``c`` itself) is a
float64 sum of the same prefix of nonnegative terms, in some order, so each lies within
``gamma_n * R`` of the exact prefix sum ``R`` (``gamma_n = n u / (1 - n u)``, ``u = 2**-53``: the
bound of any order of floating-point summation of n terms, Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., section 4.2). Two of them differ by at most ``2 gamma_n`` times the
row's exact total, which is ``slack`` (with 1% spare for the roundings of the bounds
themselves). The target ``min(u * c[-1], ...)`` lies in ``[t_lo, t_hi]`` for every total within
``slack`` of ``p[-1]``. So where a sum ``s`` here has ``s + slack < t_lo``, the true ``c`` at that
entry is below the target, and where ``s - slack > t_hi``, above it: the index is decided
without knowing ``c``. Where any of those tests fails (a target within a few slacks of a
cumulative sum: at 151,936 entries the slack is about 3e-11 of the row's total, an entry of a
flat row about 7e-6 of it, so a few draws in 10^5), where the target may be the total's
predecessor, or where the total is not clearly positive and finite, that row is searched as
before, on its whole cumulative sum (``fallback``): every index and every refusal is ``c``'s.
``tests/core/test_cdf_blocks.py`` checks the indices against ``c``'s on random, adversarial and
boundary targets and forces the fallback.

Where: ``SITES``. In a hot loop a single draw from a row of 151,936 entries is faster by blocks
than by the whole sum, but in a run it is the other way round: after a model's forward pass the
caches are cold, and the blocks' dozen small Python and numpy operations cost more than the
whole sum's few torch ones. ``bench/draw_paths.py`` measures each site on and off in one process
(``results/bench/draw_paths_v151936_{random,equal}_cpu.md``): a tree level's draws at once
(``level``) and draws without replacement (``without``, MCSS's siblings) gain; one row's draws
(``single``: SpD's chain, a correction) and a batch of rows with their own uniforms (``rows``: a
beam's) do not, and keep the whole sum.

Costs: the block sums read the row once (the float64 accumulation, not the read, is most of
it); the rest is a few operations on ``BLOCK`` and ``n / BLOCK`` numbers. Rows shorter than
``MIN_LENGTH`` keep the whole sum, which is as cheap there. Draws without replacement
(``Blocks.drop``) set the drawn entry to 0 and sum its block again, not the row's suffix.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch

BLOCK = 1024  # entries per block
MIN_LENGTH = 65536  # rows at least this long are searched by blocks (shorter: the whole sum is as cheap)
DTYPES = (torch.float32, torch.float64)  # numpy reads these in place (half precision: made float32, exactly)
# where draws are searched by blocks (``bench/draw_paths.py`` measures each site on and off in
# one process): a tree level's draws from whole rows (``mtad.propose.tree._whole_level_cdf``) and
# draws without replacement (``mtad.core.sampling.cdf_positions``), not one row's draws
# (``single``) nor a batch of rows with their own uniforms (``rows``: ``cdf_index``)
SITES = {"level": True, "without": True, "single": False, "rows": False}
_U = 2.0**-53
_WIDE = 1 + 2.0**-50  # widens a product past its roundings (a few units in the last place)


def cdf_search(
    c: torch.Tensor,  # [..., n] float64 cumulative masses
    u: torch.Tensor,  # [..., k] float64 uniforms on c's device
) -> tuple[torch.Tensor, torch.Tensor]:  # [..., k] int64 indices, [..., 1] float64 totals
    """``mtad.core.sampling.cdf_index``'s search on cumulative masses already made (see there):
    the definition of an inverse-CDF draw, which ``Blocks`` reproduces."""
    total = c[..., -1:]
    t = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(c, t.contiguous(), right=True), total


def used(x: torch.Tensor, site: str) -> bool:
    """Whether draws from ``x`` (rows [..., n]) at ``site`` are made by blocks: the site is on
    (``SITES``), the rows are on the CPU, floating point and at least ``MIN_LENGTH`` long."""
    return SITES[site] and x.device.type == "cpu" and x.dtype.is_floating_point and x.shape[-1] >= MIN_LENGTH


def _slack(n: int, total: float) -> float:
    """Twice gamma_n times the exact total (bounded through the computed one), with 1% spare."""
    g = (n + 1) * _U / (1 - (n + 1) * _U)
    return 2.02 * g * total / (1 - g)


class Blocks:
    """Rows [n] (nonnegative: clamped by the caller; float32 or float64, on the CPU) with their
    block sums, for inverse-CDF draws that find ``c``'s index (see the module docstring)."""

    def __init__(self, rows: Sequence[torch.Tensor]):
        self.rows = [(x if x.dtype in DTYPES else x.float()).contiguous() for x in rows]
        self.n = n = self.rows[0].numel()
        nb, tail = divmod(n, BLOCK)
        sums = []
        for x in self.rows:
            s = x[: nb * BLOCK].view(nb, BLOCK).double().sum(-1)
            if tail:
                s = torch.cat([s, x[nb * BLOCK :].double().sum(0, keepdim=True)])
            sums.append(s)
        s = torch.stack(sums)
        self.sums = s.tolist()  # [R][blocks] each block's sum
        self.p = s.cumsum_(-1).tolist()  # [R][blocks] the sums at every block's end
        self.arrays = [x.numpy() for x in self.rows]
        self.dropped: list[dict[int, list[int]]] = [{} for _ in self.rows]  # row -> block -> local zeros
        self.fell = 0  # rows searched on their whole sum (``fallback``), over every ``index`` call

    def _block(self, r: int, b: int) -> np.ndarray:  # block b of row r in float64, drops set to 0
        x = self.arrays[r][b * BLOCK : (b + 1) * BLOCK].astype(np.float64)
        for i in self.dropped[r].get(b, ()):
            x[i] = 0.0
        return x

    def drop(self, r: int, j: int) -> None:
        """Entry j of row r now has no mass (a draw without replacement): its block summed again."""
        b = j // BLOCK
        self.dropped[r].setdefault(b, []).append(j - b * BLOCK)
        sums = self.sums[r]
        sums[b] = float(self._block(r, b).sum())
        self.p[r][b:] = list(itertools.accumulate(sums[b:], initial=self.p[r][b - 1] if b else 0.0))[1:]

    def fallback(self, r: int, u: Sequence[float]) -> tuple[list[int], float]:
        """Row r's draws on its whole float64 cumulative sum (``cdf_search``): the definition."""
        x = self.rows[r].to(torch.float64, copy=True)
        for b, zs in self.dropped[r].items():
            for i in zs:
                x[b * BLOCK + i] = 0.0
        j, total = cdf_search(x.cumsum_(0), torch.tensor(u, dtype=torch.float64))
        return j.tolist(), float(total)

    def _decided(self, r: int, u: Sequence[float]) -> tuple[list[int], float]:
        """Row r's draws by its blocks, or on its whole sum where they cannot decide (counted)."""
        got = self._row(r, u)
        if got is None:
            self.fell += 1
            got = self.fallback(r, u)
        return got

    def draw(self, r: int, u: float) -> tuple[int, float]:
        """One draw from row r for the uniform ``u``: ``c``'s index and the row's total (``index``)."""
        (j,), total = self._decided(r, (u,))
        return j, total

    def index(self, u: Sequence[Sequence[float]]) -> tuple[list[list[int]], list[float]]:
        """Row r's draws for the uniforms ``u[r]``: ``c``'s indices, and each row's total (within
        ``slack`` of ``c[-1]``; ``c[-1]`` itself where the row fell back, so a refusal reads it)."""
        got = [self._decided(r, ur) for r, ur in enumerate(u)]
        return [j for j, _ in got], [t for _, t in got]

    def _row(self, r: int, u: Sequence[float]) -> tuple[list[int], float] | None:
        """Row r's indices by its blocks, or None where a test fails (see the module docstring)."""
        p = self.p[r]
        tot = p[-1]
        if not 0 < tot < math.inf:
            return None
        d = _slack(self.n, tot)
        lo_t, hi_t = tot - d, tot + d
        if not (0 < lo_t and hi_t < math.inf):
            return None
        out = []
        for ui in u:
            t_lo, t_hi = ui * lo_t / _WIDE, ui * hi_t * _WIDE
            if not t_hi < lo_t / _WIDE:  # the target may be the total's predecessor: not here
                return None
            t = ui * tot
            b = bisect.bisect_right(p, t)
            if b == len(p) or (b and not p[b - 1] + d < t_lo) or not p[b] - d > t_hi:
                return None
            before = p[b - 1] if b else 0.0
            c = np.cumsum(self._block(r, b))
            c += before  # (the sum before the block and the block's: one more order of the same terms)
            j = int(c.searchsorted(t, side="right"))  # c[j - 1] <= t < c[j]: entry j of the block
            if j == len(c) or not float(c[j]) - d > t_hi or (j and not float(c[j - 1]) + d < t_lo):
                return None
            out.append(b * BLOCK + j)
        return out, tot

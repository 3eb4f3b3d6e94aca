"""Drawing tokens from warped distributions: on the host, on their support only.

Where randomness lives (the rule every decoder follows; ``docs/devices.md``):

* One ``torch.Generator`` on the CPU, seeded per generation by the engine, drives every
  random choice. Draws happen on the host with that generator, whatever device the models
  are on, so a seed drives the same random stream on a CPU and on a GPU (the logits
  themselves still differ numerically between devices).
* Heavy work stays on the model's device: logits, warping over the vocabulary, residuals,
  gathers. A draw moves only the *support* to the host: the token ids and masses a draw
  chooses among (``host_support``): the nonzero entries (ascending token id) of a long
  vector, every entry of a short one (at most ``DENSE_MAX``, drawn densely as
  ``torch.multinomial`` on the vector would). On an accelerator that is one transfer:
  the top ``bound + 1`` entries when the warping bounds the support (top-k: at most
  ``4 k + 64`` tokens with ties; top-p alone: a hint, ``TOP_P_HINT``; see
  ``mtad.core.warping.Warping.support_bound``) and each support's size. A longer support
  (a wide nucleus) does not cross: it is drawn on the device as below, with exactly its size's
  exponentials (``read_supports``; ``host_supports`` alone still reads it in a second
  transfer). Without a bound (plain temperature: every token has mass) the draw is made
  on the device.
  Several rows cross together (``host_supports``). On the CPU the support is read in place
  (no copy). Draws from unbounded long rows on an accelerator (``device_drawn``: plain
  temperature) do not read the rows: the draw is ``torch.multinomial`` over the support,
  which takes one exponential per support entry from the CPU generator (or, several draws
  with replacement, uniforms), so those cross to the device instead (one pinned, non-blocking
  copy) and the tokens come back (``device_sample``, ``device_draws``,
  ``device_multinomial``: same tokens, same stream).
* Verification rules gather what they need on the device and cross once (``mtad.core.devices``).

After top-k / top-p a warped distribution over the vocabulary (V ~ 152k for the Qwen
pair) has a handful of nonzero entries, and ``torch.multinomial`` on the dense vector
would cost O(V) random numbers per draw: a draw on the support has exactly the dense
vector's distribution, not its random stream (``torch.multinomial`` draws one exponential
per entry), so seeded outputs of a large-vocabulary run differ from a dense draw's, not
in distribution. A short vector (toy vocabularies, compressed verification problems) is
drawn densely, exactly as ``torch.multinomial`` on it.

Two draw schemes (``mtad.core.warping.Warping.scheme``), chosen per generation by the generator
the engine makes (``generator``):

* *race* (``torch.multinomial``'s): one exponential per support entry, the first maximum of
  ``masses / e``; everything above describes it. The scheme of greedy and top-k settings (a
  support of at most ``4 k + 64`` entries), and of every record written before the inverse CDF.
* *inverse CDF* (``InverseCdf``, the default at temperature > 0 without top-k: plain
  temperature, top-p alone): a draw takes one uniform double ``u`` from the generator, however
  long its support; the row's cumulative masses ``c`` (a float64 ``cumsum`` on the row's own
  device, zeros included: they add nothing) give the first entry with ``c > u * c[-1]``
  (``cdf_index``). Several draws with replacement take one uniform each over the same ``c``;
  ``k`` draws without replacement (MCSS's siblings, beams without replacement) take ``k``
  uniforms, each over the masses left after the previous draws (those past the support's size
  unused). The same draw on the host (a support, a Python list) and on an accelerator, up to the
  order of a parallel ``cumsum`` there (float64 either way): only the uniforms cross to the
  device, only the indices come back; nothing is read to find a support first. Beam sampling
  with replacement draws its W entries of the flattened scores in two steps, a slot by its
  weight and then a token of its row, two uniforms each (``mtad.propose.beam._slot_then_row``).
  ``tests/core/test_inverse_cdf.py`` checks the draws' exact distribution and counts their
  random numbers.

This module knows probability vectors, supports and an explicit ``torch.Generator`` (never
the global RNG); nothing about models, trees or acceptance rules. It sits below the
decoders and the drafting / verification maths (``mtad.propose.beam``, ``mtad.verify.multidraft``), which
all import from it.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from mtad.core import cdf_blocks
from mtad.core.cdf_blocks import cdf_search
from mtad.core.topk import topk_rows

__all__ = [
    "DENSE_MAX",
    "InverseCdf",
    "cdf_drop",
    "cdf_index",
    "cdf_list_index",
    "cdf_positions",
    "cdf_search",
    "generator",
    "inverse_cdf",
    "multinomial",
    "EmptySupport",
    "Support",
    "as_support",
    "candidate_supports",
    "PendingDraws",
    "device_drawn",
    "device_draws",
    "device_multinomial",
    "device_sample",
    "draw",
    "host_support",
    "host_supports",
    "host_supports_with",
    "read_supports",
    "residual",
    "sample",
    "support",
    "sizes_first",
    "support_sizes",
    "top_entries",
    "uniforms",
]

DENSE_MAX = 4096  # vectors up to this length are drawn densely (see the module docstring)
_EXACT_FLOAT_INDEX = 2**24  # token ids below this travel exactly in a float32 tensor


class InverseCdf(torch.Generator):
    """The CPU generator of a generation whose draws are made by inverse CDF (see the module
    docstring): a ``torch.Generator`` in every other respect (the same stream for a seed)."""


def generator(warping, seed: int) -> torch.Generator:
    """The one CPU generator of a generation under ``warping`` (its ``scheme``), seeded."""
    from mtad.core.warping import INVERSE_CDF

    cls = InverseCdf if warping.scheme == INVERSE_CDF else torch.Generator
    return cls(device="cpu").manual_seed(int(seed))


def inverse_cdf(gen: torch.Generator) -> bool:
    """Whether draws with ``gen`` are made by inverse CDF (else by the exponential race)."""
    return isinstance(gen, InverseCdf)


def uniforms(n: int, gen: torch.Generator) -> torch.Tensor:  # [n] float64 on the host
    """The n uniform doubles in [0, 1) that n inverse-CDF draws take."""
    return torch.rand(n, dtype=torch.float64, generator=gen)


def cdf_index(
    masses: torch.Tensor,  # [..., n] non-negative masses (negative entries count as 0), any device
    u: torch.Tensor,  # [..., k] float64 uniforms on the masses' device
    nonneg: bool = False,  # the caller has clamped the masses at 0 already
) -> tuple[torch.Tensor, torch.Tensor]:  # [..., k] int64 indices, [..., 1] float64 totals
    """Inverse-CDF draws: for each uniform, the first entry whose cumulative mass exceeds
    ``u * total`` (float64 cumulative masses, summed where the masses are). The target is kept
    below the total (a product rounded up to it would point past the last entry with mass), so
    an index always has mass when the total is positive and finite (the caller checks it).
    ``nonneg``: the masses are clamped already (a clamp of clamped masses changes no bit), so
    the vocabulary-long clamp is not made twice.

    Where ``cdf_blocks.SITES`` says so (``single``: one row; ``rows``: several; both off by
    default, see there), a CPU row of at least ``cdf_blocks.MIN_LENGTH`` entries is searched by
    its blocks (``mtad.core.cdf_blocks``): the same indices without the whole cumulative sum; its
    total is then the blocks' sum, within about 1e-10 of the cumulative sum's last entry relative
    to it, and positive and finite exactly when that is (callers only check it)."""
    n = masses.shape[-1]
    if cdf_blocks.used(masses, "single" if masses.numel() == n else "rows"):
        x = (masses if nonneg else masses.clamp_min(0)).reshape(-1, n)  # (clamped in the masses' dtype)
        j, totals = cdf_blocks.Blocks(list(x)).index(u.reshape(x.shape[0], -1).tolist())
        return (torch.tensor(j, dtype=torch.long).reshape(u.shape),
                torch.tensor(totals, dtype=torch.float64).reshape(*u.shape[:-1], 1))
    c = masses.to(torch.float64)
    return cdf_search((c if nonneg else c.clamp_min(0)).cumsum(-1), u)


def check_total(total: float) -> None:
    """Refuse a total a draw cannot be made from (not positive and finite): EmptySupport."""
    if not 0 < total < math.inf:
        raise EmptySupport(f"invalid multinomial distribution (sum of probabilities {total})")


_LIST_MAX = 512  # supports up to this long are drawn on Python lists (fewer torch calls)


def cdf_list_index(masses: list[float], u: float) -> int:
    """``cdf_index`` on a Python list (the same float64 sums, in order, on the host)."""
    return cdf_list_indices(masses, [u])[0]


def cdf_list_indices(masses: list[float], us: list[float]) -> list[int]:
    """``cdf_list_index`` for each uniform of ``us`` (the masses' sums made once)."""
    c = list(itertools.accumulate(max(x, 0.0) for x in masses))
    total = c[-1] if c else 0.0
    check_total(total)
    top = math.nextafter(total, 0.0)
    return [bisect.bisect_right(c, min(u * total, top)) for u in us]


def cdf_positions(
    vals: torch.Tensor,  # [n] non-negative masses on the host
    k: int,
    replacement: bool,
    gen: torch.Generator,
    positive: bool = False,  # every entry is > 0 (``Support.whole``): nothing to clamp or count
) -> list[int]:  # [k] with replacement; [min(k, nonzero)] without
    """k inverse-CDF draws over ``vals`` on the host (``k`` uniforms either way, see the module
    docstring): their positions. No draw (k = 0; without replacement, no entry with mass) takes
    nothing and checks nothing, as ``torch.multinomial``.

    Without replacement each draw searches the float64 cumulative masses of what the draws before
    it left; only the part from the entry last drawn on is summed again (the running sum before
    it, then the masses after it, one after the other: the very additions a sum of the whole row
    makes, so the same values bit for bit, ``tests/core/test_cdf_suffix.py``). A long row
    (``cdf_blocks.MIN_LENGTH``) is searched by its blocks instead, a drawn entry's block summed
    again (``mtad.core.cdf_blocks``: the same positions)."""
    if k <= 0:
        return []
    if vals.numel() <= _LIST_MAX and vals.device.type == "cpu":  # a short support: on Python floats
        masses = [max(v, 0.0) for v in vals.tolist()]  # (nan stays nan: refused by the total)
        m = k if replacement else min(k, sum(v > 0 for v in masses))
        if m == 0:
            return []
        u = uniforms(k, gen).tolist()
        out = []
        for i in range(m):
            out.append(cdf_list_index(masses, u[i]))
            if not replacement:
                masses[out[-1]] = 0.0
        return out
    x = vals if positive else vals.clamp_min(0)  # clamped in the masses' dtype
    if not replacement:
        nz = x.numel() if positive else int((x > 0).sum())
        if min(k, nz) == 0:
            return []
    u = uniforms(k, gen)
    if replacement:
        j, total = cdf_index(x, u, nonneg=True)
        check_total(float(total))
        return j.tolist()
    if cdf_blocks.used(x, "without"):
        blocks, out = cdf_blocks.Blocks([x]), []
        for i, ui in enumerate(u.tolist()[: min(k, nz)]):
            j, total = blocks.draw(0, ui)
            check_total(total)
            out.append(j)
            if i + 1 < min(k, nz):
                blocks.drop(0, j)
        return out
    x = x.to(torch.float64)
    if x is vals:
        x = x.clone()  # (a float64 row: written into below)
    c = x.cumsum(-1)
    out: list[int] = []
    m = min(k, nz)
    for i in range(m):
        j, total = cdf_search(c, u[i : i + 1])
        check_total(float(total))
        out.append(int(j))
        if i + 1 < m:
            cdf_drop(c, x, out[-1])
    return out


def cdf_drop(
    c: torch.Tensor,  # [n] float64 ``x.cumsum(-1)``, updated in place
    x: torch.Tensor,  # [n] float64 masses, updated in place
    j: int,
) -> None:
    """``x[j] = 0`` and ``c`` = the new ``x.cumsum(-1)``, bit for bit: the sums before ``j`` stand,
    and from ``j`` on they are made again as a sum of the whole row makes them (``c[j - 1] + 0``,
    then each later mass in turn), not by a subtraction (whose rounding differs). The running sum
    is seeded in ``x[j]`` itself for the sum, then ``x[j]`` is set to 0: no copy of the suffix."""
    x[j] = c[j - 1] if j > 0 else 0.0
    torch.cumsum(x[j:], 0, out=c[j:])
    x[j] = 0.0


def multinomial(vals: torch.Tensor, k: int, replacement: bool, gen: torch.Generator) -> torch.Tensor:
    """``torch.multinomial(vals, k, replacement, generator=gen)`` on host masses, or the inverse-CDF
    draws where ``gen`` draws by inverse CDF (``cdf_positions``): positions, int64."""
    if inverse_cdf(gen):
        return torch.tensor(cdf_positions(vals, k, replacement, gen), dtype=torch.long)
    return torch.multinomial(vals, k, replacement=replacement, generator=gen)


def _device_cdf_sample(probs: torch.Tensor, gen: torch.Generator) -> int:  # probs [V] on a device
    """One inverse-CDF draw over a row where it lives: one uniform crosses, the index and the
    total come back in one read."""
    from mtad.core.devices import to_device

    (u,) = to_device([uniforms(1, gen)], probs.device)
    j, total = cdf_index(probs, u)
    j, total = torch.cat([j.double(), total]).cpu().tolist()
    check_total(total)
    return int(j)


class Support(NamedTuple):
    """A distribution's support on the host: what a draw chooses among."""

    ids: torch.Tensor  # [n] int64 token ids, ascending (every id 0..V-1 for a dense vector)
    vals: torch.Tensor  # [n] their masses (float32 or wider; zeros may appear in a dense one)
    size: int  # V, the length of the vector it came from

    def mass(self, token: int) -> float:
        """The mass at ``token`` (0 outside the support)."""
        if len(self.ids) == self.size:  # dense: ids are 0..V-1
            return float(self.vals[token])
        i = int(torch.searchsorted(self.ids, token))
        return float(self.vals[i]) if i < len(self.ids) and int(self.ids[i]) == token else 0.0

    def whole(self) -> bool:
        """Whether this is ``support``'s whole row: every entry of the vector, each one positive
        (its ids are ``whole_ids``, which only that path pairs with masses), so nothing needs
        checking or clamping before a draw (the same values either way)."""
        return self.size > DENSE_MAX and len(self.ids) == self.size and self.ids is whole_ids(self.size)

    def dense(self) -> torch.Tensor:  # [V] on the host
        """The vector itself (negative entries read as 0)."""
        if len(self.ids) == self.size:
            return self.vals
        return torch.zeros(self.size, dtype=self.vals.dtype).index_put_((self.ids,), self.vals)

    def positive(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Ids and masses of the nonzero entries only (a whole row's, ``whole``: all of them)."""
        if self.whole():
            return self.ids, self.vals
        keep = self.vals > 0
        return (self.ids, self.vals) if bool(keep.all()) else (self.ids[keep], self.vals[keep])


@functools.lru_cache(maxsize=8)
def whole_ids(n: int) -> torch.Tensor:  # [n] int64 on the host: 0..n-1
    """The ids of a whole host row (``arange(n)``), made once per length: a support's ids are
    only ever read (no caller writes into them), so every whole row of that length shares them.
    Only ``support``'s whole-row path (every entry positive) pairs them with masses
    (``Support.whole`` reads them so); columns may use them as an index (read only)."""
    return torch.arange(n)


def support(
    probs: torch.Tensor,  # [V] non-negative (negative entries count as 0)
) -> tuple[torch.Tensor, torch.Tensor]:  # ids [n] ascending int64, masses [n] (float32 or wider)
    """The entries a draw chooses among, on ``probs``' own device.

    Every entry of a vector of at most ``DENSE_MAX`` entries (a dense draw), else only
    the nonzero ones. A whole row (every entry positive, on the CPU) is handed out as it is, not
    copied: a support's masses are only ever read (a draw without replacement and a rule's
    update write into copies of their own).
    """
    if probs.dtype in (torch.float16, torch.bfloat16):
        probs = probs.float()
    if probs.numel() <= DENSE_MAX:
        return torch.arange(probs.numel(), device=probs.device), probs.clamp_min(0)
    if probs.device.type == "cpu" and float(probs.min()) > 0:
        # a whole row (plain temperature): the same ids and masses as the scan below, without
        # it (a nonzero over the vocabulary costs far more than a check and a copy; the least
        # entry is positive exactly when every entry is, nan failing both); on an accelerator
        # the check would be a synchronisation of its own, so the scan stays
        return whole_ids(probs.numel()), probs
    positive = probs > 0
    ids = torch.nonzero(positive).flatten()
    return ids, probs[ids]


def host_supports(
    rows: torch.Tensor,  # [R, V] non-negative rows on any device
    bound: int | None = None,  # at most this many nonzero entries per row (None: unknown)
) -> list[Support]:  # [R] on the host, each equal to support(row) moved to the host
    """``support`` of every row, on the host: one device-to-host transfer for all rows.

    On the CPU nothing is copied. On an accelerator, with a ``bound``, only the top
    ``bound + 1`` entries of each row cross, with the support's size (a row whose last one
    is still nonzero crosses again: its whole support, exactly that many top entries, in a
    second transfer); without one, the rows cross whole.
    """
    return [s for s, _ in host_supports_with(rows, None, bound)]


def host_supports_with(
    rows: torch.Tensor,  # [R, V] non-negative rows on any device
    other: torch.Tensor | None,  # [R, V] companion values on the same device (or None)
    bound: int | None = None,
    defer: bool = False,  # long rows: their support's size instead of a second transfer
) -> list[tuple[Support | int, torch.Tensor | None]]:  # per row: its support, ``other`` at its ids
    """``host_supports`` that also brings ``other``'s entries at each support's ids, in the
    same transfer (host tensors of ``other``'s dtype, exactly its values).

    With ``defer``, a row whose support goes on past the ``bound + 1`` entries read (on an
    accelerator) is not read again: its entry is the support's size (an ``int``; ``other``:
    None), and the caller draws from the row on the device with exactly that many
    exponentials (``device_draws``' ``length``). See ``read_supports``."""
    odt = other.dtype if other is not None else None
    if rows.dtype in (torch.float16, torch.bfloat16):
        rows = rows.float()
    num, vocab = rows.shape

    def back(x):  # companion values on the host, in their own dtype (the round trip is exact)
        return None if x is None else x.to(odt)

    if rows.device.type == "cpu":
        # which rows are whole (every entry positive: plain temperature), for all rows in one
        # pass (``support`` would check them one by one); the others are scanned as before
        whole = [m > 0 for m in rows.amin(-1).tolist()] if vocab > DENSE_MAX and num > 1 else [False] * num
        out = []
        for i, r in enumerate(rows):
            s = Support(whole_ids(vocab), r, vocab) if whole[i] else Support(*support(r), vocab)
            out.append((s, None if other is None else other[i][s.ids]))
        return out
    wide = rows if other is None else torch.cat([rows, other.to(rows.dtype)], -1)  # [R, V or 2V]
    if vocab <= DENSE_MAX:
        host = wide.clamp_min(0) if other is None else torch.cat([rows.clamp_min(0), wide[:, vocab:]], -1)
        host = host.cpu()
        ids = torch.arange(vocab)
        return [(Support(ids, host[i, :vocab], vocab), back(host[i, vocab:]) if other is not None else None)
                for i in range(num)]
    out: list[tuple[Support, torch.Tensor | None] | None] = [None] * num
    if _hint_read(vocab, bound):
        k = bound + 1
        vals, idx = rows.topk(k, dim=-1)  # [R, k] descending
        count = (rows > 0).sum(-1, keepdim=True).to(vals.dtype)  # [R, 1]: each support's size
        parts = [vals, idx.to(vals.dtype)] + ([other.to(vals.dtype).gather(-1, idx)] if other is not None else [])
        host = torch.cat(parts + [count], -1).cpu()  # [R, 2k or 3k, + 1]: one transfer
        longer = []
        for i in range(num):
            v, ids = host[i, :k], host[i, k : 2 * k].long()
            if int(host[i, -1]) > k:  # the support goes on past the top k: read exactly its size below
                longer.append((i, int(host[i, -1])))
                continue
            keep = v > 0
            ids, v = ids[keep], v[keep]
            order = torch.argsort(ids)
            comp = back(host[i, 2 * k : -1][keep][order]) if other is not None else None
            out[i] = (Support(ids[order], v[order], vocab), comp)
        for i, n in longer:  # a second transfer: the top n entries (the whole support), not the row
            if defer:
                out[i] = (n, None)
                continue
            if n >= vocab // 2:
                continue  # about the whole row anyway: read it whole below
            v, ids = rows[i].topk(n)
            parts = [v, ids.to(v.dtype)] + ([other[i].to(v.dtype)[ids]] if other is not None else [])
            h = torch.stack(parts).cpu()
            ids = h[1].long()
            order = torch.argsort(ids)
            comp = back(h[2][order]) if other is not None else None
            out[i] = (Support(ids[order], h[0][order], vocab), comp)
    rest = [i for i in range(num) if out[i] is None]
    if rest:
        host = (torch.stack([wide[i] for i in rest]) if len(rest) < num else wide).cpu()
        for j, i in enumerate(rest):
            s = Support(*support(host[j, :vocab]), vocab)
            out[i] = (s, back(host[j, vocab:][s.ids]) if other is not None else None)
    return out  # type: ignore[return-value]


def read_supports(
    rows: torch.Tensor,  # [R, V] non-negative rows on any device
    bound: int | None,  # Warping.support_bound (a transfer hint)
    other: torch.Tensor | None = None,  # [R, V] companion values (``host_supports_with``)
) -> tuple[list[tuple[Support, torch.Tensor | None]] | None, int]:
    """The rows' host supports (with ``other``), or None where they are drawn on the device.

    (supports, 0) where every support is read: on the CPU, at most ``bound`` entries each, or
    rows of at most ``DENSE_MAX`` entries. (None, n) on an accelerator when some support goes
    on past the bound (top-p alone with a wide nucleus; ties at top-k's k-th logit): instead
    of reading it (up to a whole vocabulary row), the caller draws on the device
    (``device_draws``, ``device_multinomial``, ``mtad.propose.tree.device_level_draws``,
    ``mtad.verify.devicewalk``) with ``length=n``, the longest support's size read in this
    transfer: n exponentials cross to the device, the tokens come back. Without a bound
    (plain temperature) the caller's ``device_drawn`` branch comes first."""
    got = host_supports_with(rows, other, bound, defer=True)
    sizes = [s for s, _ in got if isinstance(s, int)]
    if sizes:
        return None, max(sizes)
    return got, 0  # type: ignore[return-value]


def candidate_supports(
    ids: torch.Tensor,  # [R, c] candidate token ids of each row (``mtad.core.warping.warp_candidates``)
    probs: torch.Tensor,  # [R, c] their probabilities; every other entry of the row is 0
    vocab: int,  # V, the rows' length
) -> list[Support]:  # [R], each equal to ``host_support`` of the dense row
    """The host supports of rows given by their candidates, without building the rows:
    exactly what ``host_supports`` returns for the dense rows (the nonzero entries by
    ascending id; every entry of a vector of at most ``DENSE_MAX``)."""
    if probs.dtype in (torch.float16, torch.bfloat16):
        probs = probs.float()
    ids, probs = ids.cpu(), probs.cpu()
    if vocab <= DENSE_MAX:
        dense = torch.zeros(ids.shape[0], vocab, dtype=probs.dtype).scatter_(-1, ids, probs)
        return host_supports(dense)
    order = ids.argsort(-1)
    ids, probs = ids.gather(-1, order), probs.gather(-1, order)
    if ids.shape[-1] == 1:  # one candidate per row (greedy): its probability is 1
        return [Support(i, v, vocab) for i, v in zip(ids, probs)]
    keep = probs > 0
    return [Support(i[k], v[k], vocab) for i, v, k in zip(ids, probs, keep)]



def candidate_support(
    warping,  # mtad.core.warping.Warping (its ``candidates``)
    logits: torch.Tensor,  # [V] one row's logits
) -> Support | None:
    """The host support of ``warping(logits)`` from the warping's candidates, without the dense
    row (``candidate_supports``: the support a scan of the dense row finds, so the same draws):
    on the CPU with a sparse warping (temperature 0, top-k). None elsewhere: warp the row."""
    if logits.device.type != "cpu":
        return None
    cand = warping.candidates(logits[None])
    return candidate_supports(*cand, logits.shape[-1])[0] if cand is not None else None


def host_support(probs: torch.Tensor, bound: int | None = None) -> Support:  # probs [V]
    """``support(probs)`` on the host (one transfer from an accelerator; see ``host_supports``)."""
    return host_supports(probs[None], bound)[0]


def as_support(x: torch.Tensor | Support, bound: int | None = None) -> Support:
    """A ``Support`` as is; a probability vector [V] read onto the host."""
    return x if isinstance(x, Support) else host_support(x, bound)


def draw(
    ids: torch.Tensor,  # [n] token ids
    vals: torch.Tensor,  # [n] their (unnormalised) masses, not all zero
    generator: torch.Generator,
    num: int = 1,
    replacement: bool = False,
) -> torch.Tensor:  # [num] token ids
    """``num`` multinomial draws over a support (host tensors, the CPU generator; by inverse CDF
    where it draws so)."""
    return ids[multinomial(vals, num, replacement, generator)]


def sample(
    probs: torch.Tensor | Support,  # [V] on any device, or its host support
    generator: torch.Generator,
    bound: int | None = None,  # at most this many nonzero entries (Warping.support_bound)
    size: int | None = None,  # the support's size, when a read before this one brought it
) -> int:
    """One draw from a probability vector (explicit generator, no global RNG): the token
    ``draw`` gives on its host support. An unbounded support of a long vector on an
    accelerator (plain temperature), or one longer than ``bound`` (``read_supports``), is
    drawn there instead (``device_sample``): the same token, the same random stream, and no
    row crosses to the host. With ``size`` (``support_sizes``, read with a verification's
    scalars) a support longer than ``bound`` is drawn on the device at once, without the read
    that would find its size: the draw ``read_supports`` leads to, one read fewer.

    By inverse CDF (``inverse_cdf(generator)``) no support is read: a host support's masses, or
    the row where it lives (one uniform crosses, the index comes back)."""
    if inverse_cdf(generator):
        if isinstance(probs, Support):
            s = probs
            j = cdf_positions(s.vals, 1, True, generator, positive=s.whole())[0]
            return j if len(s.ids) == s.size else int(s.ids[j])
        if probs.device.type == "cpu":
            return cdf_positions(probs, 1, True, generator)[0]
        return _device_cdf_sample(probs, generator)
    if isinstance(probs, torch.Tensor) and device_drawn(probs, bound):
        return device_sample(probs, generator)
    if isinstance(probs, torch.Tensor) and probs.device.type != "cpu":
        if size is not None and _past_hint(probs.shape[-1], bound, size):
            return device_sample(probs, generator, size)
        got, length = read_supports(probs[None], bound)
        if got is None:  # a support longer than the bound: drawn on the device, not read
            return device_sample(probs, generator, length)
        s = got[0][0]
    else:
        s = as_support(probs, bound)
    return int(draw(s.ids, s.vals, generator)[0])


def support_sizes(rows: torch.Tensor) -> torch.Tensor:  # [..., V] -> [...] int64, on the rows' device
    """Each row's support size (its nonzero entries; negative ones count as 0, as ``support``
    reads them): what ``host_supports_with`` reads with a row's hint, computed where a rule
    reads its scalars, so that the one row it then draws from is drawn without a hint read
    when that support is long (``sample``'s ``size``)."""
    return (rows > 0).sum(-1)


def _hint_read(vocab: int, bound: int | None) -> bool:
    """Whether ``host_supports_with`` reads rows of ``vocab`` entries (past ``DENSE_MAX``) as
    their top ``bound + 1`` entries and sizes (ids exact in floats)."""
    return bound is not None and bound + 1 < vocab < _EXACT_FLOAT_INDEX


def _past_hint(vocab: int, bound: int | None, size: int) -> bool:
    """Whether ``host_supports_with`` (``defer``) would leave a support of ``size`` entries
    unread: a long row whose support goes on past its hint's ``bound + 1`` entries.
    ``read_supports`` then hands it to a device draw."""
    return vocab > DENSE_MAX and _hint_read(vocab, bound) and size > bound + 1


def sizes_first(rows: torch.Tensor, hinted: bool) -> bool:
    """Whether a rule reads ``support_sizes`` of the rows its final draw may come from with its
    scalars: ``hinted`` (``Warping.support_hinted``: top-p alone), on an accelerator, rows past
    ``DENSE_MAX`` (shorter ones cross whole)."""
    return hinted and rows.device.type != "cpu" and rows.shape[-1] > DENSE_MAX


def device_drawn(x: torch.Tensor, bound: int | None) -> bool:
    """Whether draws from the long rows ``x`` [..., V] are made on their device (``device_draws``,
    ``device_multinomial``): an accelerator, a support the warping does not bound (plain
    temperature: every token has mass) and rows longer than ``DENSE_MAX``."""
    return bound is None and x.device.type != "cpu" and x.shape[-1] > DENSE_MAX


def device_sample(
    probs: torch.Tensor,  # [V] non-negative, V > DENSE_MAX, on the device (negative entries count as 0)
    generator: torch.Generator,  # the CPU generator
    length: int | None = None,  # at least the support's size (None: V); see ``device_draws``
) -> int:
    """``draw`` on ``probs``' host support, computed on ``probs``' device: the same token and
    the generator left in the same state, with the exponentials crossing instead of the row
    (``device_draws`` of one row, committed). Checked against the host draw in
    ``tests/core/test_device_draw.py``."""
    pending = device_draws(probs[None], generator, length=length)
    return pending.commit(0, generator)


class EmptySupport(RuntimeError):
    """A draw from a vector without mass (``torch.multinomial``'s refusal, as the host draw's)."""


@dataclass(frozen=True)
class PendingDraws:
    """What ``device_draws`` read back: each row's draw, were it the generator's next draw."""

    tokens: list[int]  # [R] the token row i's draw gives
    sizes: list[int]  # [R] row i's support size: the exponentials its draw takes
    extra: list[float]  # the extra tensors' values (flattened, in order), read in the same transfer
    state: torch.Tensor  # the generator's state before the draws
    length: int  # V: the exponentials taken
    dtype: torch.dtype  # theirs (the rows')
    cdf: bool = False  # drawn by inverse CDF: one uniform taken, whichever row commits
    committed: bool = False  # a row was committed (``commit`` takes one)

    def commit(self, i: int, generator: torch.Generator) -> int:
        """Row ``i``'s token, the generator left as the host draw on row ``i`` leaves it. Once: every
        row was drawn with the same random numbers, so a second row's token would depend on the
        first's (a second draw takes fresh ones: ``device_draws`` again)."""
        if self.committed:
            raise RuntimeError("a pending draw commits one row once; draw again for another row")
        object.__setattr__(self, "committed", True)  # frozen otherwise
        size = self.sizes[i]
        if size == 0:
            generator.set_state(self.state)
            raise EmptySupport("invalid multinomial distribution (sum of probabilities <= 0)")
        if not self.cdf and size != self.length:
            generator.set_state(self.state)
            torch.empty(size, dtype=self.dtype).exponential_(1, generator=generator)
        return self.tokens[i]

    def cancel(self, generator: torch.Generator) -> None:
        """No draw after all: the generator as it was before ``device_draws``."""
        generator.set_state(self.state)


def device_draws(
    rows: torch.Tensor,  # [R, V] non-negative rows on the device (negative entries count as 0)
    generator: torch.Generator,  # the CPU generator
    extra: Sequence[torch.Tensor] = (),  # tensors on the rows' device, read (flattened) with the draws
    entries: torch.Tensor | None = None,  # [R, V] bool: the entries each row's draw is over (None: its nonzero ones)
    length: int | None = None,  # exponentials to take: at least every row's support size (None: V)
) -> PendingDraws:
    """For every row, the token ``draw`` on its host support would give as the generator's next
    draw, computed on the rows' device with one copy of exponentials to it and one read back
    (with ``extra``). The caller then commits the one row it draws from (``PendingDraws.commit``)
    or none (``cancel``): a draw whose row is known only after the read (BiLD's correction row,
    a fallback that may not draw) costs no further transfer.

    ``torch.multinomial`` draws one sample from masses ``v`` (n entries) as ``argmax(v / e)``
    with ``e`` = n exponentials from the generator in ``v``'s dtype, and the first n of V
    exponentials are the n drawn alone (the generator's stream is sequential). So: V
    exponentials from the CPU generator, one pinned copy to the device; the i-th nonzero entry
    of a row (ascending id, the host support's order) divided by the i-th exponential; each
    row's argmax and its support's size cross back. The generator has then taken V
    exponentials where the host draw takes n: ``commit`` puts it back and takes exactly n
    (host work only) when the support is shorter than the row. ``entries`` replaces the
    support by other entries of the row, in ascending order (a dense draw of a vector that
    holds some of the row's columns, zeros included: a multi-draft rule's compressed
    residual); the row is 0 outside them. ``length`` takes fewer than V exponentials when
    every support is known to be that short (``read_supports`` read the sizes): the same
    draws, fewer random numbers made and copied.
    """
    from mtad.core.devices import to_device

    if inverse_cdf(generator):  # one uniform, whichever row commits; the masses' totals come back
        state = generator.get_state()
        (u,) = to_device([uniforms(1, generator)], rows.device)
        x = rows.clamp_min(0) if entries is None else torch.where(entries, rows.clamp_min(0), 0)
        j, total = cdf_index(x, u.expand(rows.shape[0], 1), nonneg=True)
        sizes = torch.where(total > 0, 1.0, 0.0).double()  # no draw from a row without mass
        parts = [j.reshape(-1).double(), sizes.reshape(-1)] + [e.reshape(-1).double() for e in extra]
        host = torch.cat(parts).cpu().tolist()  # one read
        r = rows.shape[0]
        return PendingDraws([int(x) for x in host[:r]], [int(x) for x in host[r : 2 * r]], host[2 * r :],
                            state, 1, torch.float64, cdf=True)
    if rows.dtype in (torch.float16, torch.bfloat16):
        rows = rows.float()  # as ``support`` does
    n = rows.shape[-1] if length is None else min(length, rows.shape[-1])
    state = generator.get_state()
    e = torch.empty(max(n, 1), dtype=rows.dtype).exponential_(1, generator=generator)
    (e_dev,) = to_device([e], rows.device)
    mask = rows > 0 if entries is None else entries
    rank = (mask.cumsum(-1) - 1).clamp(0, e.numel() - 1)  # i-th nonzero entry of a row -> i
    scores = rows.clamp_min(0) / e_dev[rank]  # zero entries score 0
    parts = [scores.argmax(-1).double(), mask.sum(-1).double()] + [x.reshape(-1).double() for x in extra]
    host = torch.cat(parts).cpu().tolist()  # one read
    r = rows.shape[0]
    sizes = [int(x) for x in host[r : 2 * r]]
    if any(z > e.numel() for z in sizes):  # a caller's length too short: no draw is the host's
        generator.set_state(state)
        raise ValueError(f"length {length} is shorter than a support ({max(sizes)} entries)")
    return PendingDraws([int(x) for x in host[:r]], sizes, host[2 * r :], state, e.numel(), rows.dtype)


def device_multinomial(
    vals: torch.Tensor,  # [N] non-negative masses on the device (negative entries count as 0)
    k: int,
    replacement: bool,
    generator: torch.Generator,  # the CPU generator
    other: torch.Tensor | None = None,  # [N] values to read at the drawn entries too
    length: int | None = None,  # at least the support's size (None: N); see ``device_draws``
    nonneg: bool = False,  # no entry of ``vals`` is negative (products of masses): no clamp made
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # host: [m] indices, vals, other there
    """``torch.multinomial`` over ``vals``' host support (``draw``; without replacement at most
    as many as it has nonzero entries), computed on ``vals``' device: the indices, the masses
    there (and ``other``'s), in one read; the generator left as the host draw leaves it.

    * One draw, or several without replacement: ``torch.multinomial`` takes n exponentials
      (n: the support's size) and keeps the top k of ``v / e``; as ``device_draws``, the V
      exponentials cross and the generator takes exactly n afterwards.
    * Several with replacement: ``torch.multinomial`` takes k uniform doubles and finds each
      in the support's cumulative masses (a sequential sum in the masses' dtype, divided by
      its total, the last set to 1: the first entry whose cumulative mass reaches the
      uniform). The k uniforms cross; the cumulative masses are summed on the device in
      float64. For float64 masses that is the host's arithmetic where the device sums in
      order (the CPU: every test; a GPU's parallel sum moves a boundary only by rounding).
      For float32 masses the host's float32 running sum drifts by more than an entry's mass
      over a long vector, so most draws differ from the host's (``results/bench/cdf_float32.txt``):
      the same stream and distribution, not the same entries.
    """
    from mtad.core.devices import to_device

    if vals.dtype in (torch.float16, torch.bfloat16):
        vals = vals.float()
    n = vals.numel()
    x = vals if nonneg and inverse_cdf(generator) else vals.clamp_min(0)  # a clamp would change no bit
    state = generator.get_state()
    if inverse_cdf(generator):  # k uniforms cross (see the module docstring), the draws come back
        (u,) = to_device([uniforms(k, generator)], vals.device)
        # the support's size only bounds draws without replacement; with replacement a positive
        # finite total is the check (it has an entry with mass exactly when its size is > 0)
        size = (x > 0).sum() if not replacement else torch.ones((), dtype=torch.long, device=x.device)
        if replacement:
            idx, total = cdf_index(x, u, nonneg=True)
        else:
            left, picks = x.clone(), []
            for i in range(k):
                j, t = cdf_index(left, u[i : i + 1], nonneg=True)
                total = t if i == 0 else total
                picks.append(j)
                left[j] = 0
            idx = torch.cat(picks)
        parts = [idx.double(), x[idx].double()] + ([other[idx].double()] if other is not None else [])
        host = torch.cat(parts + [size.reshape(1).double(), total.reshape(1)]).cpu()  # one read
        j = idx.numel()
        nz = int(host[-2])
        if nz == 0 or not 0 < float(host[-1]) < math.inf:
            raise EmptySupport(f"invalid multinomial distribution (sum of probabilities {float(host[-1])})")
        m = k if replacement else min(k, nz)
        comp = None if other is None else host[2 * j : 3 * j].to(other.dtype)[:m]
        return host[:j].long()[:m], host[j : 2 * j].to(vals.dtype)[:m], comp
    size = (x > 0).sum()
    if replacement and k > 1:
        u = torch.rand(k, dtype=torch.float64, generator=generator)
        (u_dev,) = to_device([u], vals.device)
        cdf = x.double().cumsum(0)
        cdf = cdf / cdf[-1]
        idx = torch.searchsorted(cdf, u_dev).clamp_max(n - 1)
        first = (x > 0).double().argmax()  # a uniform of exactly 0: the support's first entry
        idx = torch.where(u_dev == 0, first.to(idx.dtype), idx)
        m = k
    else:
        take = n if length is None else max(min(length, n), 1)
        e = torch.empty(take, dtype=vals.dtype).exponential_(1, generator=generator)
        (e_dev,) = to_device([e], vals.device)
        rank = ((x > 0).cumsum(0) - 1).clamp(0, take - 1)
        q = x / e_dev[rank]
        idx = q.argmax()[None] if k == 1 else q.topk(min(k, n)).indices
        m = None
    parts = [idx.double(), x[idx].double(), size.reshape(1).double()]
    if other is not None:
        parts.insert(2, other[idx].double())
    host = torch.cat(parts).cpu()  # one read
    j = idx.numel()
    nz = int(host[-1])
    if nz == 0:
        generator.set_state(state)
        raise EmptySupport("invalid multinomial distribution (sum of probabilities <= 0)")
    if m is None:
        if nz > take:  # a caller's length too short: no draw is the host's
            generator.set_state(state)
            raise ValueError(f"length {length} is shorter than the support ({nz} entries)")
        m = k if replacement else min(k, nz)
        if nz != take:  # the host draw takes exactly the support's n exponentials
            generator.set_state(state)
            torch.empty(nz, dtype=vals.dtype).exponential_(1, generator=generator)
    ids = host[:j].long()[:m]
    got = host[j : 2 * j].to(vals.dtype)[:m]
    comp = None if other is None else host[2 * j : 3 * j].to(other.dtype)[:m]
    return ids, got, comp


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); falls back to p when the residual has no mass in floating point.

    Decided on the device (no host round-trip): ``torch.where`` on the sum.
    """
    r = (p - q.to(p.device)).clamp_min(0)
    s = r.sum()
    return torch.where(s > 0, r / s, p)

class Rows:
    """Rows ``[N+1, V]`` computed on first access: ``row(i)`` for row ``i``, then cached.

    A row is a vector [V] or its host support (``mtad.core.sampling.Support``).

    The tree walkers read ``p`` / ``q`` only at the rows the walk visits (a path), so a
    decoder can pass its target's distributions lazily (one warping per visited row)
    instead of a dense ``[N+1, V]`` tensor; a tensor works everywhere a ``Rows`` does.

    ``device_row(i)``, where given, is row ``i`` as the vector on its accelerator even when
    ``row(i)`` is its host support: the multi-draft walk runs on the device when some row of
    ``p`` or ``q`` stayed there (``mtad.verify.devicewalk``) and then needs both as vectors.
    ``ready``: reading a row costs no device-to-host transfer (the rows were read, or decided
    to stay on the device, when they were made): the walk asks such rows first.
    """

    def __init__(self, num_rows: int, row: Callable[[int], torch.Tensor],
                 device_row: Callable[[int], torch.Tensor] | None = None, ready: bool = False):
        self._n, self._row, self._cache = num_rows, row, {}
        self.device_row = device_row
        self.ready = ready

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> torch.Tensor:  # [V]
        i = int(i)
        if not 0 <= i < self._n:
            raise IndexError(f"row {i} out of range 0..{self._n - 1}")
        if i not in self._cache:
            self._cache[i] = self._row(i)
        return self._cache[i]


_TIE_MARGIN = 64  # entries read past the k-th, so ties with it rarely need a second read


def top_entries(
    scores: torch.Tensor, k: int, other: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The first k of a stable descending sort of ``scores`` (ties: lower index first), on the
    host, with ``other`` (same shape and dtype as ``scores``) at those entries.

    Without sorting every entry: on the CPU the entries >= the k-th largest are ordered; on an
    accelerator the top ``k + 64`` cross to the host and every entry tied with the k-th is read
    in a second transfer only if the ties may go on past those. (Greedy beam selection over
    W x V scores, MJGD's beam over beam_width x V joint log-probabilities.)
    """
    n = scores.numel()
    comp = None
    odt = None if other is None else other.dtype
    if scores.device.type == "cpu":
        cand = torch.nonzero(scores >= topk_rows(scores, k)[0][-1]).flatten()  # ascending index
        vals = scores[cand]
        comp = None if other is None else other[cand]
    else:
        if other is not None:
            other = other.to(scores.dtype)  # crosses with the scores (exact), back to its dtype below
        m = min(n, k + _TIE_MARGIN)
        top_vals, top_idx = torch.topk(scores, m)
        parts = [top_vals, top_idx.to(top_vals.dtype)] + ([other[top_idx]] if other is not None else [])
        host = torch.stack(parts).cpu()  # one transfer
        kth = host[0, k - 1]
        if m < n and bool(host[0, -1] >= kth):  # ties may go on: every entry >= the k-th
            cand = torch.nonzero(scores >= float(kth)).flatten()
            parts = [cand.to(scores.dtype), scores[cand]] + ([other[cand]] if other is not None else [])
            both = torch.stack(parts).cpu()
            cand, vals = both[0].long(), both[1]
            comp = both[2] if other is not None else None
        else:
            keep = host[0] >= kth
            cand, vals = host[1][keep].long(), host[0][keep]
            order = torch.argsort(cand)
            cand, vals = cand[order], vals[order]
            comp = host[2][keep][order] if other is not None else None
    order = torch.sort(vals, descending=True, stable=True).indices[:k]
    return cand[order], vals[order], None if comp is None else comp[order].to(odt)

"""A measured cost model of speculative decoding: pass times x acceptance -> tokens/s.

Three parts, all plain numbers (docs/cost_model.md has the derivation):

* ``PassTime``: seconds of one forward pass of a model with ``n`` query rows (the new tree
  nodes of ``ModelRunner.forward`` plus the pending endpoint row, when it is fed), on top
  of a context of typical length. Piecewise-linear interpolation over measured ``n``
  (monotone, fitted by pool-adjacent-violators over the medians), extrapolated beyond the
  last measured ``n`` with the last segment's slope. It represents both a CPU (time grows
  with ``n`` from the start) and a GPU (flat until the device saturates, then growing).
* ``AcceptanceModel``: per width ``W``, the survival ``S_W(d) = P(accepted >= d)`` as a
  product of per-depth hazards ``h_W(d) = P(accepted >= d | accepted >= d-1, drafted >= d)``,
  estimated from step records with Beta pseudo-counts (depth -> pooled over depths ->
  a prior linking widths), so an unobserved depth or width gets a sensible estimate.
* ``CostModel``: the seconds of one step of a decoder at a shape (gamma, W) from the two
  pass-time curves and a per-step harness overhead; ``tokens_per_s`` and ``choose_shape``.

A step's time depends on how its draft is proposed and what the target verifies, not on
which decoder composes them: a *kind* names a pass profile, (proposer kind, verifier target
pass) in the vocabularies of ``mtad.core.protocols`` (``PROPOSER_KINDS``, ``TARGET_PASSES``)
(``PROFILES``; the kinds keep the names saved priors use for them). Step time of each kind (``t_d``/``t_t``: draft/target pass time,
``c``: overhead)::

    spd        (chain, chain)  g * t_d(1)                  + t_t(g + 1)        + c(g)
    mtad       (beam, chain)   t_d(1) + (g - 1) * t_d(W)   + t_t(g + 1)        + c(g)
    tree_mtad  (beam, tree)    t_d(1) + (g - 1) * t_d(W)   + t_t(f * W * g + 1) + c(g)

with ``f`` the fraction of the W*g beam slots that are distinct tree nodes (1 unless
measured). Expected tokens per step ``E = 1 + sum_{d<=g} S_W(d)`` (the correction/bonus token
counts); predicted tokens/s = ``E / step time``. For SpD with an i.i.d. per-token acceptance
``alpha`` (Leviathan et al. 2023) ``E = (1 - alpha^(g+1)) / (1 - alpha)``.

This module knows nothing about models, proposers or decoders beyond these formulas: no torch, no I/O
beyond loading and saving a JSON prior (``load_prior``/``save_prior``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: pass profiles: (proposer kind, verifier target pass) -> the kind naming its numbers
#: (saved priors' acceptance counts, overhead and node fraction are keyed by these names)
PROFILES = {("chain", "chain"): "spd", ("beam", "chain"): "mtad", ("beam", "tree"): "tree_mtad"}
KINDS = tuple(PROFILES.values())
_PARTS = {kind: parts for parts, kind in PROFILES.items()}
GAMMAS = tuple(range(1, 9))
WIDTHS = (1, 2, 4, 8)
#: Where ``bench/cost_model.py`` writes the prior that ``gamma=auto`` loads ($MTAD_COST_PRIOR overrides).
DEFAULT_PRIOR = Path(__file__).resolve().parents[2] / "results" / "bench" / "cost_model_prior.json"
PRIOR_VERSION = 1


def profile_kind(proposer: str, target_pass: str) -> str:
    """The kind of a (proposer kind, verifier target pass) pair; ValueError when none fits."""
    kind = PROFILES.get((proposer, target_pass))
    if kind is None:
        known = ", ".join(f"{d} + {t}" for d, t in PROFILES)
        raise ValueError(f"no cost profile for a {proposer!r} proposer with a {target_pass!r} "
                         f"target pass (auto shapes know: {known})")
    return kind


def profile(kind: str) -> tuple[str, str]:
    """(proposer kind, verifier target pass) of a kind."""
    if kind not in _PARTS:
        raise ValueError(f"unknown decoder kind {kind!r}; known: {', '.join(KINDS)}")
    return _PARTS[kind]


# ------------------------------------------------------------------------- pass time
def _pav(y: Sequence[float]) -> list[float]:
    """Non-decreasing least-squares fit (pool-adjacent-violators): noise never makes n+1 rows cheaper."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in y:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    out: list[float] = []
    for m, c in blocks:
        out += [m] * int(c)
    return out


@dataclass
class PassTime:
    """Seconds of one forward pass with ``n`` query rows: piecewise linear over measured ``n``."""

    n: list[int]  # ascending row counts, n[0] >= 1
    seconds: list[float]  # non-decreasing

    def __post_init__(self):
        if not self.n or len(self.n) != len(self.seconds) or sorted(set(self.n)) != list(self.n):
            raise ValueError("PassTime needs ascending distinct n with one time each")

    def __call__(self, n: float) -> float:
        xs, ys = self.n, self.seconds
        if n <= xs[0] or len(xs) == 1:
            return ys[0] if n <= xs[0] else ys[0] * n / xs[0]
        for i in range(1, len(xs)):
            if n <= xs[i]:
                w = (n - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + w * (ys[i] - ys[i - 1])
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + max(slope, 0.0) * (n - xs[-1])

    @classmethod
    def fit(cls, samples: Mapping[int, Iterable[float]]) -> PassTime:
        """Median time per measured ``n``, then the monotone (PAV) fit."""
        ns = sorted(int(n) for n in samples)
        med = [_median(list(samples[n])) for n in ns]
        return cls(ns, _pav(med))

    @classmethod
    def linear(cls, a: float, b: float, n_max: int = 64) -> PassTime:
        """``a + b * (n - 1)`` (a default curve when nothing was measured)."""
        return cls([1, n_max], [a, a + b * (n_max - 1)])

    def scaled(self, s: float) -> PassTime:
        return PassTime(list(self.n), [s * y for y in self.seconds])

    def to_dict(self) -> dict:
        return {"n": list(self.n), "seconds": list(self.seconds)}

    @classmethod
    def from_dict(cls, d: Mapping) -> PassTime:
        return cls([int(v) for v in d["n"]], [float(v) for v in d["seconds"]])


def _median(v: list[float]) -> float:
    if not v:
        raise ValueError("no measurements")
    s = sorted(v)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


# ------------------------------------------------------------------------ acceptance
def expected_tokens_iid(alpha: float, gamma: int) -> float:
    """Leviathan et al.'s E[tokens per step] = (1 - alpha^(g+1)) / (1 - alpha) (g + 1 at alpha = 1)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_tokens(survival: Sequence[float]) -> float:
    """E[tokens per step] = 1 + sum_d P(accepted >= d) (the correction/bonus token counts)."""
    return 1.0 + float(sum(survival))


@dataclass
class DepthCounts:
    """Per depth d (index d-1): steps at risk (drafted >= d, accepted >= d-1) and of those accepted >= d."""

    at_risk: list[float] = field(default_factory=list)
    passed: list[float] = field(default_factory=list)

    def add(self, drafted: int, accepted: int, weight: float = 1.0) -> None:
        if accepted > drafted or accepted < 0:
            raise ValueError(f"accepted {accepted} not in 0..drafted={drafted}")
        while len(self.at_risk) < drafted:
            self.at_risk.append(0.0)
            self.passed.append(0.0)
        for d in range(1, min(drafted, accepted + 1) + 1):  # at risk while the chain is alive
            self.at_risk[d - 1] += weight
            self.passed[d - 1] += weight * (d <= accepted)

    @property
    def total_at_risk(self) -> float:
        return float(sum(self.at_risk))

    def rates(self) -> list[float | None]:
        """Empirical per-depth hazards (None where nothing was at risk)."""
        return [p / r if r > 0 else None for p, r in zip(self.passed, self.at_risk)]

    def to_dict(self) -> dict:
        return {"at_risk": list(self.at_risk), "passed": list(self.passed)}

    @classmethod
    def from_dict(cls, d: Mapping) -> DepthCounts:
        return cls([float(v) for v in d["at_risk"]], [float(v) for v in d["passed"]])


class AcceptanceModel:
    """Survival of the accepted length per width, from step records with pseudo-counts.

    Hazard at depth d for width W (posterior means of Beta priors, innermost first)::

        h0_W     = 1 - (1 - h_ref) ** ((W / W_ref) ** rho)   # prior linking widths
                   (W_ref, h_ref: the most-observed other width and its pooled hazard,
                    else width 1 and ``prior_hazard``)
        pooled_W = (passed_W + k_w * h0_W) / (at_risk_W + k_w)        # all depths of W
        h_W(d)   = (passed_W(d) + k_d * pooled_W) / (at_risk_W(d) + k_d)

    ``rho = 1`` would treat the W
    candidates at a depth as independent tries; beam candidates share prefixes and repeat
    tokens, so the default is 0.5 for trees and 0 for chain MTAD (its width changes which
    chain is drafted, not how many are verified). Counting: a step with ``drafted = g``,
    ``accepted = a`` is at risk at depths 1..min(g, a+1) and passes depths 1..a, which is exact
    for SpD's sequential test and an approximation for MTAD (whose deterministic rule may
    accept a longer prefix when a shorter one fails; such a step counts as passing every
    depth up to ``a``).
    """

    def __init__(self, prior_hazard: float = 0.6, width_strength: float = 4.0,
                 depth_strength: float = 4.0, rho: float = 0.5):
        if not 0.0 < prior_hazard < 1.0:
            raise ValueError(f"prior_hazard must be in (0, 1), got {prior_hazard}")
        self.prior_hazard = prior_hazard
        self.width_strength = width_strength
        self.depth_strength = depth_strength
        self.rho = rho
        self.counts: dict[int, DepthCounts] = {}

    def observe(self, width: int, drafted: int, accepted: int, weight: float = 1.0) -> None:
        self.counts.setdefault(int(width), DepthCounts()).add(int(drafted), int(accepted), weight)

    def _reference(self) -> tuple[int, float]:
        seen = [(c.total_at_risk, w) for w, c in self.counts.items() if c.total_at_risk > 0]
        if not seen:
            return 1, self.prior_hazard
        _, w = max(seen)
        c = self.counts[w]
        k = self.width_strength
        return w, (sum(c.passed) + k * self.prior_hazard) / (c.total_at_risk + k)

    def width_prior(self, width: int) -> float:
        """The prior mean hazard of ``width``: from the most-observed other width, else from
        ``prior_hazard`` (a width-1 value), through the link ``1 - (1 - h) ** ((W / W_ref) ** rho)``."""
        w_ref, h_ref = self._reference()
        if w_ref == int(width):  # its own data are counted in pooled(); use the base prior
            w_ref, h_ref = 1, self.prior_hazard
        return 1.0 - (1.0 - h_ref) ** ((width / w_ref) ** self.rho)

    def pooled(self, width: int) -> float:
        """Posterior mean of the per-token acceptance (SpD's alpha when width = 1)."""
        h0 = self.width_prior(width)
        c = self.counts.get(int(width))
        if c is None:
            return h0
        k = self.width_strength
        return (sum(c.passed) + k * h0) / (c.total_at_risk + k)

    def hazard(self, width: int, depth: int) -> float:
        pooled = self.pooled(width)
        c = self.counts.get(int(width))
        if c is None or depth > len(c.at_risk):
            return pooled
        k = self.depth_strength
        return (c.passed[depth - 1] + k * pooled) / (c.at_risk[depth - 1] + k)

    def survival(self, width: int, gamma: int) -> list[float]:
        """[S_W(1), ..., S_W(gamma)], S_W(d) = prod_{k<=d} h_W(k)."""
        out, s = [], 1.0
        for d in range(1, gamma + 1):
            s *= self.hazard(width, d)
            out.append(s)
        return out

    def expected_tokens(self, width: int, gamma: int) -> float:
        return expected_tokens(self.survival(width, gamma))

    def observations(self, width: int) -> float:
        c = self.counts.get(int(width))
        return c.at_risk[0] if c is not None and c.at_risk else 0.0

    def to_dict(self) -> dict:
        return {str(w): c.to_dict() for w, c in sorted(self.counts.items())}

    def load_counts(self, counts: Mapping[str, Mapping], strength: float | None = None) -> None:
        """Add saved counts; with ``strength`` rescale them to that many depth-1 observations
        per width (a prior from other prompts should not outweigh this run's steps for long)."""
        for w, d in counts.items():
            c = DepthCounts.from_dict(d)
            scale = 1.0
            if strength is not None and c.at_risk and c.at_risk[0] > 0:
                scale = min(1.0, strength / c.at_risk[0])
            mine = self.counts.setdefault(int(w), DepthCounts())
            while len(mine.at_risk) < len(c.at_risk):
                mine.at_risk.append(0.0)
                mine.passed.append(0.0)
            for i, (r, p) in enumerate(zip(c.at_risk, c.passed)):
                mine.at_risk[i] += scale * r
                mine.passed[i] += scale * p


def acceptance_from_steps(steps: Iterable[Mapping], rho: float = 0.5, **kw) -> AcceptanceModel:
    """An ``AcceptanceModel`` from step records (dicts with width, drafted, accepted)."""
    m = AcceptanceModel(rho=rho, **kw)
    for s in steps:
        if s["drafted"] > 0:
            m.observe(s.get("width", 1), s["drafted"], s["accepted"])
    return m


# ---------------------------------------------------------------------- step time
@dataclass
class CostModel:
    """Step time of each decoder at a shape from two pass-time curves and the harness overhead."""

    target: PassTime
    draft: PassTime
    #: per kind: (c0, c1) seconds of harness work per step, c0 + c1 * gamma
    overhead: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: per kind: distinct tree nodes / (W * gamma) beam slots (tree_mtad; 1 = no duplicates)
    node_fraction: dict[str, float] = field(default_factory=dict)

    def passes(self, kind: str, gamma: int, width: int = 1) -> tuple[list[float], float]:
        """Row counts of the draft passes and of the target pass of one step."""
        proposer, target_pass = profile(kind)
        if proposer == "chain":
            draft = [1.0] * gamma
        else:  # beam: the root, then W rows per depth
            draft = [1.0] + [float(width)] * (gamma - 1)
        if target_pass == "chain":
            return draft, gamma + 1.0
        return draft, self.node_fraction.get(kind, 1.0) * width * gamma + 1.0

    def step_time(self, kind: str, gamma: int, width: int = 1) -> float:
        draft_rows, target_rows = self.passes(kind, gamma, width)
        c0, c1 = self.overhead.get(kind, (0.0, 0.0))
        over = max(c0 + c1 * gamma, 0.0)  # a noisy fit may extrapolate below 0
        return sum(self.draft(n) for n in draft_rows) + self.target(target_rows) + over

    def tokens_per_s(self, kind: str, gamma: int, width: int, expected: float) -> float:
        return expected / self.step_time(kind, gamma, width)

    def autoregressive_tokens_per_s(self) -> float:
        return 1.0 / self.target(1)

    def to_dict(self) -> dict:
        return {"target_pass": self.target.to_dict(), "draft_pass": self.draft.to_dict(),
                "overhead": {k: list(v) for k, v in self.overhead.items()},
                "node_fraction": dict(self.node_fraction)}

    @classmethod
    def from_dict(cls, d: Mapping) -> CostModel:
        return cls(PassTime.from_dict(d["target_pass"]), PassTime.from_dict(d["draft_pass"]),
                   {k: (float(v[0]), float(v[1])) for k, v in d.get("overhead", {}).items()},
                   {k: float(v) for k, v in d.get("node_fraction", {}).items()})


def predict(cost: CostModel, acceptance: AcceptanceModel, kind: str, gamma: int, width: int = 1) -> float:
    """Predicted tokens/s of ``kind`` at (gamma, W)."""
    return cost.tokens_per_s(kind, gamma, width, acceptance.expected_tokens(width, gamma))


def choose_shape(
    cost: CostModel,
    acceptance: AcceptanceModel,
    kind: str,
    gammas: Sequence[int] = GAMMAS,
    widths: Sequence[int] = WIDTHS,
) -> tuple[int, int, float]:
    """(gamma, W, predicted tokens/s) maximising the prediction (first of ties: smaller shapes).
    A chain proposer has no width: W = 1."""
    widths = (1,) if profile(kind)[0] == "chain" else tuple(widths)
    best = None
    for w in widths:
        for g in gammas:
            v = predict(cost, acceptance, kind, g, w)
            if best is None or v > best[2] * (1 + 1e-12):
                best = (int(g), int(w), v)
    return best


def fit_overhead(samples: Iterable[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (c0, c1) of overhead = c0 + c1 * gamma (c1 = 0 with a single gamma)."""
    pts = [(float(g), float(t)) for g, t in samples]
    if not pts:
        return 0.0, 0.0
    gs = {g for g, _ in pts}
    mean_t = sum(t for _, t in pts) / len(pts)
    if len(gs) < 2:
        return max(mean_t, 0.0), 0.0
    mg = sum(g for g, _ in pts) / len(pts)
    c1 = sum((g - mg) * (t - mean_t) for g, t in pts) / sum((g - mg) ** 2 for g, _ in pts)
    c0 = mean_t - c1 * mg
    return c0, c1


# ---------------------------------------------------------------------------- prior file
def prior_path() -> Path:
    return Path(os.environ.get("MTAD_COST_PRIOR") or DEFAULT_PRIOR)


def file_sha(path: str | Path | None) -> str | None:
    """sha256 (12 hex) of a prior file, None when there is none (part of an auto run's identity)."""
    if path is None or not Path(path).is_file():
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def load_prior(path: str | Path, machine: str, target: str, draft: str) -> dict | None:
    """The prior entry for this machine and pair (``None`` when there is no file or no match)."""
    p = Path(path)
    if not p.is_file():
        return None
    data = json.loads(p.read_text())
    if data.get("version") != PRIOR_VERSION:
        return None
    for e in data.get("entries", []):
        if (e.get("machine"), e.get("target"), e.get("draft")) == (machine, target, draft):
            return e
    return None


def save_prior(path: str | Path, entry: Mapping[str, Any]) -> None:
    """Add or replace the entry of ``entry``'s (machine, target, draft) in the prior file."""
    from mtad.core.io import write_json_atomic

    p = Path(path)
    data = json.loads(p.read_text()) if p.is_file() else {"version": PRIOR_VERSION, "entries": []}
    key = (entry["machine"], entry["target"], entry["draft"])
    data["entries"] = [e for e in data.get("entries", [])
                       if (e.get("machine"), e.get("target"), e.get("draft")) != key] + [dict(entry)]
    data["version"] = PRIOR_VERSION
    write_json_atomic(p, data)


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else math.nan

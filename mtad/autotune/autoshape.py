"""``gamma=auto`` / ``width=auto``: choose each step's draft shape from the cost model.

Before every step a decoder with an ``auto`` knob asks its ``AutoShape`` for (gamma, W)
(``choose``) and hands the step's output back (``record``); the decoder base
(``mtad.core.decoder.Decoder.step``) makes both calls. An ``AutoShape`` is keyed by a cost
*kind*, the pass profile of the decoder's proposer and verifier
(``mtad.autotune.costmodel.profile_kind``), never by a decoder's name. The choice maximises the
predicted tokens/s of ``mtad.autotune.costmodel`` over a grid (gamma 1..8, W in {1, 2, 4, 8}) with:

* pass times: the prior curves of a saved cost model for this machine and pair
  (``bench/cost_model.py`` writes ``results/bench/cost_model_prior.json``; else a default
  shape per device type), recalibrated online from this run's forward times, which the
  runners already accumulate (``forward_time`` / ``forward_calls`` deltas between ``choose``
  and ``record``; the target's pass has a known row count, so its time is also kept per row
  count); the harness overhead from the wall time between consecutive ``choose`` calls minus
  the forward time in it;
* acceptance: ``AcceptanceModel`` over this run's past steps, with the saved counts (scaled
  down to a few steps) as pseudo-counts and a prior linking widths.

Exploration: every ``explore_every``-th step the least-observed width of the grid is used
(its best gamma), so a width never chosen still gets observed acceptance; the choice is a
deterministic schedule, no random draw (the decoding generator is untouched).

Lossless: the shape of a step is a function of past steps only (and of timings), fixed
before the step draws anything, so SpD with ``gamma=auto`` is still an SpD step given the
past and samples the target distribution. Timings make a run's shapes (hence its tokens)
vary between repeats: an auto run is not bit-reproducible from its seed. The controller
keeps learning across the generations of one decoder object (one run of a task).
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from mtad.autotune.costmodel import (
    GAMMAS,
    PROFILES,
    WIDTHS,
    AcceptanceModel,
    CostModel,
    PassTime,
    choose_shape,
    load_prior,
    predict,
    prior_path,
    profile,
)
from mtad.core.knobs import AUTO, GAMMA, WIDTH

#: exponent of the prior linking widths (``AcceptanceModel``), per kind: a target pass over a
#: tree verifies W candidates per depth; over a chain, one chain whatever W is.
RHO = {kind: 0.5 if target_pass == "tree" else 0.0 for (_, target_pass), kind in PROFILES.items()}


def check_shape_knob(name: str, value) -> int | str:
    """An integer >= 1, or the string ``auto`` (the rule of ``mtad.core.knobs.GAMMA`` / ``WIDTH``)."""
    return (WIDTH if name == "width" else GAMMA).rule.check(name, value)


def machine_id(device: torch.device | str) -> str:
    """What pass times depend on: the processor (and thread count on a CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
    except OSError:
        pass
    return f"cpu:{name}:{torch.get_num_threads()}threads"


def model_key(model) -> str:
    """A model's architecture, size and dtype (no paths): what its pass time depends on."""
    c = model.config
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    return f"{c.model_type}-l{c.num_hidden_layers}-h{c.hidden_size}-v{c.vocab_size}-{dtype}"


def default_cost(device_type: str) -> CostModel:
    """Shapes only (levels are recalibrated online): a CPU's pass time grows with the rows,
    a GPU's is flat until it saturates."""
    if device_type == "cuda":
        return CostModel(PassTime([1, 64, 256], [0.020, 0.022, 0.050]),
                         PassTime([1, 64, 256], [0.008, 0.009, 0.020]))
    return CostModel(PassTime.linear(0.150, 0.004), PassTime.linear(0.030, 0.004))


class _Ratio:
    """Mean of measured/predicted ratios with ``k`` pseudo-observations of 1, decayed (load changes)."""

    def __init__(self, k: float, decay: float = 0.98):
        self.num, self.den, self.decay = k, k, decay

    def add(self, ratio: float) -> None:
        if math.isfinite(ratio) and ratio > 0:
            self.num = self.decay * self.num + ratio
            self.den = self.decay * self.den + 1.0

    @property
    def value(self) -> float:
        return self.num / self.den


class _Mean:
    """Decayed mean of differences (measured - prior), 0 before any observation."""

    def __init__(self, decay: float = 0.98):
        self.num, self.den, self.decay = 0.0, 0.0, decay

    def add(self, x: float) -> None:
        if math.isfinite(x):
            self.num = self.decay * self.num + x
            self.den = self.decay * self.den + 1.0

    @property
    def value(self) -> float:
        return self.num / self.den if self.den else 0.0


class _OnlineCurve:
    """prior curve x online scale; the target's exactly-measured row counts blend in per n."""

    def __init__(self, prior: PassTime, k: float):
        self.prior, self.k = prior, k
        self.scale = _Ratio(k)
        self.by_n: dict[int, list[float]] = {}  # n -> [sum of seconds, count]

    def add_pass(self, n: int, seconds: float) -> None:
        self.scale.add(seconds / self.prior(n))
        s = self.by_n.setdefault(int(n), [0.0, 0.0])
        s[0] += seconds
        s[1] += 1.0

    def __call__(self, n: float) -> float:
        base = self.scale.value * self.prior(n)
        obs = self.by_n.get(int(n)) if float(n).is_integer() else None
        if not obs:
            return base
        return (self.k * base + obs[0]) / (self.k + obs[1])


class AutoShape:
    """Chooses (gamma, W) before each step of one decoder; learns from each step's output."""

    def __init__(
        self,
        kind: str,
        gamma: int | str = AUTO,
        width: int | str = AUTO,
        prior: str | Path | None = None,
        gammas: Sequence[int] = GAMMAS,
        widths: Sequence[int] = WIDTHS,
        explore_every: int = 16,
        prior_steps: float = 8.0,
        time_strength: float = 4.0,
    ):
        self.kind = kind
        self.gammas = tuple(gammas) if gamma == AUTO else (int(gamma),)
        proposer, self._target_pass = profile(kind)
        chain = proposer == "chain"  # no width
        self.widths = (1,) if chain else (tuple(widths) if width == AUTO else (int(width),))
        self.prior = Path(prior) if prior is not None else prior_path()
        self.explore_every = explore_every
        self.prior_steps = prior_steps
        self.time_strength = time_strength
        self.acceptance = AcceptanceModel(rho=RHO[kind])
        self.prior_source: str | None = None  # "file" or "default", set at the first step
        self.steps = 0
        self._cost: CostModel | None = None
        self._mark: dict | None = None  # state at the last choose()

    # ------------------------------------------------------------------ setup
    def _load(self, ctx) -> None:
        entry = load_prior(self.prior, machine_id(ctx.target.device), model_key(ctx.target.model),
                           model_key(ctx.draft.model))
        if entry is not None:
            prior = CostModel.from_dict(entry)
            counts = entry.get("acceptance", {}).get(self.kind)
            if counts:
                self.acceptance.load_counts(counts, strength=self.prior_steps)
            self.prior_source, k = "file", self.time_strength
        else:
            prior, self.prior_source, k = default_cost(ctx.target.device.type), "default", 1.0
        self._prior = prior
        self._target = _OnlineCurve(prior.target, k)
        self._draft = _OnlineCurve(prior.draft, k)
        self._overhead = _Mean()  # mean (measured - prior) overhead per step
        self._nodes = _Ratio(k)  # distinct tree nodes / (W * gamma)
        self._cost = CostModel(self._target, self._draft, dict(prior.overhead), dict(prior.node_fraction))

    def cost(self) -> CostModel:
        """The current (online) cost model."""
        c = self._cost
        c0, c1 = self._prior.overhead.get(self.kind, (0.0, 0.0))
        c.overhead[self.kind] = (c0 + self._overhead.value, c1)
        c.node_fraction[self.kind] = self._nodes.value * self._prior.node_fraction.get(self.kind, 1.0)
        return c

    # ------------------------------------------------------------------- step
    def choose(self, ctx) -> tuple[int, int]:
        """The shape of this step, from past steps only."""
        if self._cost is None:
            self._load(ctx)
        now = time.perf_counter()
        fwd = ctx.target.forward_time + ctx.draft.forward_time
        m = self._mark
        if m is not None and m.get("emitted") is not None and len(ctx.committed) == m["length"] + m["emitted"]:
            # one whole step (engine included) since the last choose: its non-forward time
            over = (now - m["t"]) - (fwd - m["fwd"])
            c0, c1 = self._prior.overhead.get(self.kind, (0.0, 0.0))
            self._overhead.add(over - c0 - c1 * m["gamma"])
        cost = self.cost()
        k = self.explore_every
        explore = k > 0 and len(self.widths) > 1 and self.steps % k == k - 1
        widths = self.widths
        if explore:
            least = min(self.acceptance.observations(w) for w in widths)
            widths = tuple(w for w in widths if self.acceptance.observations(w) == least)[:1]
        g, w, v = choose_shape(cost, self.acceptance, self.kind, self.gammas, widths)
        self.steps += 1
        self._mark = {"t": now, "fwd": fwd, "length": len(ctx.committed), "emitted": None, "gamma": g,
                      "width": w, "predicted": v, "explore": explore,
                      "target": (ctx.target.forward_time, ctx.target.forward_calls,
                                 len(ctx.committed) - len(ctx.target.cached_ids)),
                      "draft": (ctx.draft.forward_time, ctx.draft.forward_calls,
                                len(ctx.committed) - len(ctx.draft.cached_ids))}
        return g, w

    def record(self, ctx, out):
        """Learn from this step (acceptance, pass times) and note the shape in ``out.info``."""
        m = self._mark
        out.info["shape"] = {"gamma": m["gamma"], "width": m["width"],
                             "predicted_tokens_per_s": m["predicted"], "explore": m["explore"],
                             "prior": self.prior_source}
        m["emitted"] = len(out.tokens)
        if out.drafted > 0:
            self.acceptance.observe(m["width"], out.drafted, out.accepted)
        t0, calls0, pending = m["target"]
        if ctx.target.forward_calls - calls0 == 1:
            self._target.add_pass(pending + out.tree_size, ctx.target.forward_time - t0)
        d0, dcalls0, dpending = m["draft"]
        passes = ctx.draft.forward_calls - dcalls0
        if passes > 0:
            nodes = ctx.draft.num_nodes
            rows = [max(dpending, 1)] + ([nodes / (passes - 1)] * (passes - 1) if passes > 1 else [])
            self._draft.scale.add((ctx.draft.forward_time - d0) / sum(self._draft.prior(n) for n in rows))
        if self._target_pass == "tree" and out.drafted > 0:
            self._nodes.add(out.tree_size / (m["width"] * out.drafted))
        return out

    def predicted(self, gamma: int, width: int = 1) -> float:
        return predict(self.cost(), self.acceptance, self.kind, gamma, width)


def auto_shape(kind: str, gamma, width=1) -> AutoShape | None:
    """An ``AutoShape`` for a cost kind when a knob is ``auto`` (prior: ``$MTAD_COST_PRIOR`` or
    the default file)."""
    return AutoShape(kind, gamma, width) if AUTO in (gamma, width) else None

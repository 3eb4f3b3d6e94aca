"""Typical acceptance (Cai et al., "Medusa", 2024; from eta-sampling, Hewitt et al., 2022).
Not lossless.

A draft chain x_1..x_g ~ q (warped, autoregressively: ``mtad.propose.chain.Chain``) is
checked against the target with an entropy-dependent threshold instead of speculative
sampling (``mtad.verify.typical.TypicalAcceptance``):

    accept  x_i while p_i(x_i) > min(eps, delta * exp(-H(p_i)))   (longest run from x_1)
    emit    x_1..x_a, then y ~ p_(a+1)   (correction, or bonus when a = g)

Defaults eps = 0.09, delta = 0.3. At temperature 0 (one-hot p) only the target's argmax
passes, so the decoder equals greedy decoding.
"""

from __future__ import annotations

import math

from mtad.core.decoder import check_positive_int
from mtad.decoders.compose import Composition
from mtad.propose.chain import Chain
from mtad.verify.typical import TypicalAcceptance


def check_probability(field_name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value <= 1):
        raise ValueError(f"{field_name} must be a number in (0, 1], got {value!r}")
    return float(value)


class Typical(Composition):
    name = "typical"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    lossless = False
    shape_knobs = ("gamma",)

    def __init__(
        self, gamma: int = 4, eps: float = 0.09, delta: float = 0.3, name: str | None = None
    ):
        super().__init__(name)
        self.gamma = check_positive_int("gamma", gamma)
        self.eps = check_probability("eps", eps)
        if (
            isinstance(delta, bool)
            or not isinstance(delta, (int, float))
            or not (delta > 0 and math.isfinite(delta))
        ):
            raise ValueError(f"delta must be a finite number > 0, got {delta!r}")
        self.delta = float(delta)
        self.compose(Chain(), TypicalAcceptance(self.eps, self.delta))

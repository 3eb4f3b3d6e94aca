"""SpD: speculative sampling (Leviathan et al., ICML 2023; Chen et al., 2023). Lossless.

draft x1..xg ~ q autoregressively (``mtad.propose.chain.Chain``); one target pass gives
p1..p(g+1); accept xi while U <= min(1, pi(xi)/qi(xi)); after the first rejection emit a
correction y ~ norm(max(0, p - q)); if all g were accepted emit a bonus y ~ p(g+1)
(``mtad.verify.chain.SpeculativeChain``). At temperature 0 (one-hot p and q) this is exactly
greedy decoding. ``gamma=auto``: the shape is chosen before each step
(``mtad.autotune.autoshape``, through the decoder base).

Devices: drafting crosses to the host once per draft token (the draw); verification
gathers every p_i(x_i), q_i(x_i) on the target's device and crosses once, draws the
uniforms on the host, then crosses once more with the correction's (or bonus's) support.
"""

from __future__ import annotations

from mtad.autotune.autoshape import check_shape_knob
from mtad.decoders.compose import Composition
from mtad.propose.chain import Chain
from mtad.verify.chain import SpeculativeChain


class SpD(Composition):
    name = "spd"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    shape_knobs = ("gamma",)

    def __init__(self, gamma: int | str = 4, name: str | None = None):
        super().__init__(name)
        self.gamma = check_shape_knob("gamma", gamma)
        self.compose(Chain(), SpeculativeChain())

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

from mtad.decoders.compose import Composition


class SpD(Composition):
    """Chain drafts, speculative sampling. Fields: the pieces' knobs (``gamma``)."""

    name = "spd"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    proposer, verifier = "chain", "speculative"

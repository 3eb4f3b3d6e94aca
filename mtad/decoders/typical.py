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

from mtad.decoders.compose import Composition


class Typical(Composition):
    """Chain drafts, typical acceptance. Fields: the pieces' knobs (``gamma``, ``eps``, ``delta``)."""

    name = "typical"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    proposer, verifier = "chain", "typical"

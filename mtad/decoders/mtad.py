"""MTAD: multi-token assisted decoding (Qin et al., "Optimized Multi-Token Joint Decoding
with Auxiliary Model for LLM Inference", ICLR 2025). Not lossless, by design.

MTAD approximates multi-token joint decoding (sampling the next gamma tokens from
the target's joint distribution) with a draft model: the best beam of beam sampling on the
draft (``mtad.propose.beam.Beam``), one target pass over it, and the longest prefix whose
joint likelihood ratio passes tau, then one token from the target (the rule, with its
pseudo-code, glossary and numerics: ``mtad.verify.threshold.JointThreshold``).
At temperature 0 the draft is an ordinary top-W beam search scored with the draft's plain
softmax (see ``mtad.propose.beam``) and ``p`` is one-hot, so a prefix passes
only if it is the target's greedy continuation: MTAD then equals greedy decoding.
``gamma=auto`` / ``width=auto``: the shape is chosen before each step
(``mtad.autotune.autoshape``, through the decoder base).
"""

from __future__ import annotations

from mtad.decoders.compose import Composition


class MTAD(Composition):
    """Chain MTAD: beam-sampled draft, one target pass over its best beam, threshold acceptance.
    Fields: the pieces' knobs (``gamma``, ``width``, ``replacement``, ``tau``)."""

    name = "mtad"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    proposer, verifier = "beam", "threshold"

"""MCNS: multi-candidate naive sampling, the trivial lossless multi-candidate baseline.

Same i.i.d. tree as SpecInfer; at each node draw y ~ p and keep the child carrying
y if there is one, else emit y and stop (``mtad.verify.multidraft.verify_mcns``).
"""

from __future__ import annotations

from mtad.decoders.specinfer import SpecInfer
from mtad.verify.multidraft import verify_mcns


class MCNS(SpecInfer):
    name = "mcns"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    verify = staticmethod(verify_mcns)

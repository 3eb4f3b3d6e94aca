"""MCSS (Yang et al., arXiv 2401.06706): SpecInfer's tree with siblings drawn without replacement. Lossless.

Verification updates Q after each rejected sibling (``mtad.verify.multidraft.verify_mcss``);
after top-k/top-p a node may have fewer nonzero draft tokens than k: it then
gets fewer children, never duplicates.
"""

from __future__ import annotations

from mtad.decoders.specinfer import SpecInfer
from mtad.verify.multidraft import draw_without_replacement, verify_mcss


def _without_replacement(q, k, generator):
    return draw_without_replacement(q, k, generator).tolist()


class MCSS(SpecInfer):
    name = "mcss"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    sampler = staticmethod(_without_replacement)
    verify = staticmethod(verify_mcss)

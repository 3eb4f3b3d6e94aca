"""Tree-MTAD (multi-candidate MTAD): verify every beam node of beam sampling in one target pass.

Same beam sampling as MTAD (``mtad.propose.beam.Beam``), but all W x gamma beam nodes form one
token tree (a node attends to its ancestors) that the target scores in ONE pass; the deepest
node whose joint likelihood ratio against the best final beam's ancestor passes tau is kept,
then one token from the target after it (the rule, with its pseudo-code:
``mtad.verify.threshold.TreeThreshold``). Glossary: *node*: one (parent, token)
of the beam tree; slots drawn twice with replacement share a node, which does not change
any decision (equal P). *accepted*: ``a``; the tree is pruned to the kept path by the
runners' ``end``.

``compat_slot_index`` (default off) reproduces a reading of the authors' code in
which ``ref[d]`` is taken at the best final beam's *slot number* at every depth
instead of at its ancestor. Use it only to compare with the authors' numbers.
"""

from __future__ import annotations

import torch

from mtad.autotune.autoshape import check_shape_knob
from mtad.core.decoder import check_bool, check_tau
from mtad.decoders.compose import Composition
from mtad.propose.beam import Beam
from mtad.verify.threshold import TreeThreshold


class TreeMTAD(Composition):
    """Tree-MTAD: beam-sampled token tree, one target pass over all of it, threshold acceptance."""

    name = "tree_mtad"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    lossless = False
    shape_knobs = ("gamma", "width")

    def __init__(
        self,
        gamma: int = 4,
        width: int = 4,
        tau: float = 0.5,
        replacement: bool = True,
        compat_slot_index: bool = False,
        name: str | None = None,
    ):
        super().__init__(name)
        self.gamma = check_shape_knob("gamma", gamma)
        self.width = check_shape_knob("width", width)
        self.tau = check_tau(tau)
        self.replacement = check_bool("replacement", replacement)
        self.compat_slot_index = check_bool("compat_slot_index", compat_slot_index)
        self.compose(Beam(self.replacement), TreeThreshold(self.tau, self.compat_slot_index))

    def reference(self, beams) -> torch.Tensor:  # [g]
        """The per-depth reference log Q of ``beams`` (``TreeThreshold.reference``)."""
        return self._verifier.reference(beams)

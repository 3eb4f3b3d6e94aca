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

from mtad.decoders.compose import Composition


class TreeMTAD(Composition):
    """Tree-MTAD: beam-sampled token tree, one target pass over all of it, threshold acceptance.
    Fields: the pieces' knobs (``gamma``, ``width``, ``replacement``, ``tau``, ``compat_slot_index``)."""

    name = "tree_mtad"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    proposer, verifier = "beam", "tree_threshold"

    def reference(self, beams) -> torch.Tensor:  # [g]
        """The per-depth reference log Q of ``beams`` (``TreeThreshold.reference``)."""
        return self._verifier.reference(beams)

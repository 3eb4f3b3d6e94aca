"""SpecInfer (Miao et al., ASPLOS 2024): i.i.d. token tree + multi-step speculative sampling. Lossless.

A tree with branching ``k_config`` (e.g. [4, 2, 2]: 4 children of the root, 2
per depth-1 node, 2 per depth-2 node; gamma = its length) drawn i.i.d. from the
warped draft (``mtad.propose.tree.Tree``), verified by one target pass
(``mtad.verify.multidraft.MultiDraft("specinfer")``). Near the end the tree keeps its first
levels.
"""

from __future__ import annotations

from mtad.decoders.compose import Composition


class SpecInfer(Composition):
    """Fields: the pieces' knobs (``k_config``; gamma = its length)."""

    name = "specinfer"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    proposer, verifier = "tree", "specinfer"

"""Tree-MTAD (multi-candidate MTAD): verify every beam node of beam sampling in one target pass.

Same beam sampling as MTAD (``mtad.propose.beam``), but all W x gamma beam nodes form one
token tree (a node attends to its ancestors) that the target scores in ONE pass:

    ref[d]  = cumulative draft log-likelihood, at depth d, of the ANCESTOR of the final
              best beam (follow the beam-index history back from the best final slot)
    pass_i  = log P(path to i) - ref[depth(i)] > log tau        for every tree node i
    a       = deepest depth with a passing node (0 if none); among the passing nodes
              at depth a, pick the one with the largest P (first on ties)
    emit      its path (a tokens), then y ~ p(.| that node)   (the root if a = 0)

Glossary: *node*: one (parent, token) of the beam tree; slots drawn twice with
replacement share a node, which does not change any decision (equal P). *accepted*:
``a``; the tree is pruned to the kept path by the runners' ``end``. ``P`` is the
warped target joint likelihood of a node's path; ``log 0 = -inf`` fails.

``compat_slot_index`` (default off) reproduces a reading of the authors' code in
which ``ref[d]`` is taken at the best final beam's *slot number* at every depth
instead of at its ancestor; after the beams are re-permuted by the draws that slot
generally holds another beam. Use it only to compare with the authors' numbers.
When fewer beams than that slot number exist at some depth (draws without
replacement under top-k/top-p) the last slot is used.

Devices: the warped tree ``p`` stays on the target's device; the edge probabilities
``p[parent, token]`` and the reference cross to the host in one transfer, where paths are
summed and the acceptance decided; the emitted token's support crosses once more.
"""

from __future__ import annotations

import math

import torch

from mtad.core.decoder import StepContext, StepOutput, sample, target_only
from mtad.core.protocols import ROOT
from mtad.decoders.mtad import MTAD, check_bool
from mtad.propose.beam import beam_sample


def beam_tree(beams) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    """Deduplicated token tree of all beam slots, as rows (``mtad.core.runner``; row 0 = root):
    tokens [N+1], parents [N+1], depth [N+1], slot->row."""
    tokens: list[int] = [-1]
    parents: list[int] = [-1]
    depth: list[int] = [0]
    node_of: list[list[int]] = []
    index: dict[tuple[int, int], int] = {}
    for t in range(beams.gamma):
        row = []
        for slot in range(len(beams.tokens[t])):
            par = ROOT if t == 0 else node_of[t - 1][int(beams.parents[t][slot])]
            key = (par, int(beams.tokens[t][slot]))
            if key not in index:
                index[key] = len(tokens)
                tokens.append(key[1])
                parents.append(par)
                depth.append(t + 1)
            row.append(index[key])
        node_of.append(row)
    return tokens, parents, depth, node_of


def tree_accept(
    log_path_p: torch.Tensor,  # [N+1] log P(path to row), -inf where P = 0 (row 0: the root)
    depth: list[int],  # [N+1] depth of each row, 0 for the root, 1..g for nodes
    ref: torch.Tensor,  # [g] reference log Q per depth
    tau: float,
) -> tuple[int, int, list[bool]]:
    """(a, chosen row or ROOT, per-depth "some node passed" flags)."""
    g = ref.numel()
    d_idx = torch.tensor(depth) - 1  # -1 for the root, which never passes
    passing = (log_path_p - ref[d_idx.clamp_min(0)]) > math.log(tau)
    passing &= ~torch.isneginf(log_path_p) & (d_idx >= 0)
    per_depth = [bool(passing[d_idx == d].any()) for d in range(g)]
    a = max((d + 1 for d, ok in enumerate(per_depth) if ok), default=0)
    if a == 0:
        return 0, ROOT, per_depth
    cand = torch.nonzero(passing & (d_idx == a - 1)).flatten()
    best = int(cand[torch.argmax(log_path_p[cand])])
    return a, best, per_depth


class TreeMTAD(MTAD):
    """Tree-MTAD: beam-sampled token tree, one target pass over all of it, threshold acceptance."""

    name = "tree_mtad"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)

    def __init__(
        self,
        gamma: int = 4,
        width: int = 4,
        tau: float = 0.5,
        replacement: bool = True,
        compat_slot_index: bool = False,
        name: str | None = None,
    ):
        super().__init__(gamma=gamma, width=width, tau=tau, replacement=replacement, name=name)
        self.compat_slot_index = check_bool("compat_slot_index", compat_slot_index)

    def reference(self, beams) -> torch.Tensor:  # [g]
        best = beams.best()
        if not self.compat_slot_index:
            return beams.path_cum_logq(best)
        return torch.stack([c[min(best, len(c) - 1)] for c in beams.cum_logq])

    def step(self, ctx: StepContext) -> StepOutput:
        gamma, width = self.shape(ctx)  # the knobs, or AutoShape's choice (MTAD.shape)
        g = min(gamma, max(ctx.remaining - 1, 0))
        if g == 0:
            return target_only(ctx)
        beams = beam_sample(ctx, g, width, self.replacement)
        tokens, parents, depth, _ = beam_tree(beams)
        logits = ctx.target.forward(tokens[1:], parents[1:])  # [N, V], one pass over the whole tree
        p = ctx.warping(torch.cat([ctx.target.root_logits[None], logits]))  # [N+1, V], row 0 = root
        n, dev = len(tokens) - 1, p.device
        edge_p = p[torch.tensor(parents[1:], device=dev), torch.tensor(tokens[1:], device=dev)]  # [N]
        ref = self.reference(beams).to(device=dev, dtype=p.dtype)  # [g], draft -> target
        host = torch.cat([edge_p, ref]).cpu()  # one transfer: edge probabilities and the reference
        edge_p, ref = host[:n], host[n:]
        log_path_p = torch.zeros(len(tokens), dtype=p.dtype)  # [N+1] on the host, row 0: log 1
        for r in range(1, len(tokens)):  # parents precede children
            log_path_p[r] = log_path_p[parents[r]] + edge_p[r - 1].log()
        a, node, per_depth = tree_accept(log_path_p, depth, ref, self.tau)
        path: list[int] = []
        n = node
        while n != ROOT:
            path.append(tokens[n])
            n = parents[n]
        y = sample(p[node], ctx.generator, ctx.warping.support_bound)  # node = ROOT (0) is the root row
        out = StepOutput(
            tokens=path[::-1] + [y],
            drafted=g,
            accepted=a,
            tree_size=len(tokens) - 1,
            info={"pass": per_depth, "ref": ref.tolist()},
        )
        return self._auto.record(ctx, out) if self._auto else out

"""MTAD's acceptance: a threshold on the joint likelihood ratio, of one chain or of a whole tree.
Not lossless, by design (Qin et al., "Optimized Multi-Token Joint Decoding with Auxiliary
Model for LLM Inference", ICLR 2025).

Both rules read the beam-sampling history of the drafted tree (``tree.beams``, a
``mtad.core.tree.Beams`` that the beam proposer ``mtad.propose.beam.Beam`` fills: the best final
beam, its ancestry and the cumulative draft log-likelihoods ``log Q``), so they pair with the
beam proposer; a tree without it is refused in one line. The target pass is
``mtad.verify.score.score``: over the best beam's path (chain) or over every beam node (tree).

Chain (``JointThreshold``, MTAD)::

    target  one pass over the best beam x_1..x_g: p_1..p_(g+1) (warped)
    verify  R_d = sum_{i<=d} [log p_i(x_i) - log q_i(x_i)],  d = 1..g
            a = max{d : R_d > log tau}  (0 if none)  -- deterministic, no uniform draw;
            a failing shorter prefix does not block a longer passing one
    emit    x_1..x_a, then y ~ p_(a+1)  (the plain target distribution, not a residual)

Tree (``TreeThreshold``, tree-MTAD): every beam node (slots drawn twice share a node) in
one target pass::

    ref[d]  = cumulative draft log-likelihood, at depth d, of the ANCESTOR of the final
              best beam (follow the beam-index history back from the best final slot)
    pass_i  = log P(path to i) - ref[depth(i)] > log tau        for every tree node i
    a       = deepest depth with a passing node (0 if none); among the passing nodes
              at depth a, pick the one with the largest P (first on ties)
    emit      its path (a tokens), then y ~ p(.| that node)   (the root if a = 0)

``compat_slot_index`` (default off) reproduces a reading of the authors' code in which
``ref[d]`` is taken at the best final beam's *slot number* at every depth instead of at its
ancestor; after the beams are re-permuted by the draws that slot generally holds another
beam. When fewer beams than that slot number exist at some depth (draws without
replacement under top-k/top-p) the last slot is used.

Glossary: ``P(x_1..x_d)`` / ``Q(x_1..x_d)``: target / draft joint likelihoods of a prefix;
``R_d = log P - log Q``; acceptance means ``P > tau * Q``; ``tau = inf`` accepts nothing
(plain target sampling). Numerics: ``log 0 = -inf``; a prefix with ``P = 0`` fails whatever
``Q`` is (no NaN).

Devices: the draft's cumulative log Q is on the host (``mtad.propose.beam``). The chain
rule gathers ``log p_i(x_i)`` on the target's device with the target pass's own copy of the
tokens (``mtad.core.runner.fed_tensors``: no further host-to-device copy) and crosses once;
R is summed on the host; the correction's support crosses once more. The tree rule keeps the
warped tree ``p`` on the target's device; the edge probabilities ``p[parent, token]`` cross to
the host in one transfer, where paths are summed and the acceptance decided (in Python floats
with the tensors' float arithmetic: ``path_log_probs``, ``tree_accept``); the emitted token's
support crosses once more. On the CPU both rules read ``p`` by its candidates
(``mtad.verify.score.Scores.candidates``: greedy's argmax, the top-k fast path's candidates)
instead of the dense warped rows: the same masses and supports, so the same draws.
"""

from __future__ import annotations

import math

import torch

from mtad.core import hostfloat
from mtad.core.decoder import StepContext, StepOutput
from mtad.core.knobs import TAU, Knob, Rule
from mtad.core.protocols import ROOT
from mtad.core.tree import Beams, TokenTree
from mtad.verify.score import score


def cumulative_log_ratio(
    log_p: torch.Tensor,  # [g] log p_i(x_i), -inf where p = 0
    cum_logq: torch.Tensor,  # [g] log Q(x_1..x_i), raw cumulative draft log-likelihood
) -> torch.Tensor:  # [g] R_d = log P(x_1..x_d) - log Q(x_1..x_d)
    """R_d with ``P = 0`` mapped to ``-inf`` (never NaN, even if ``Q = 0`` too)."""
    cum_logp = torch.cumsum(log_p, 0)
    r = cum_logp - cum_logq
    return torch.where(torch.isneginf(cum_logp), torch.full_like(r, -math.inf), r)


def accept_length(
    log_ratio: torch.Tensor | list[float],  # [g]
    tau: float,
) -> tuple[int, list[bool]]:
    """MTAD acceptance: (a, per-prefix pass flags) with a = max{d : R_d > log tau}, 0 if none."""
    values = log_ratio.tolist() if isinstance(log_ratio, torch.Tensor) else log_ratio
    passes = [bool(r > math.log(tau)) for r in values]
    a = max((d + 1 for d, ok in enumerate(passes) if ok), default=0)
    return a, passes


def tree_accept(
    log_path_p: torch.Tensor,  # [N+1] log P(path to row), -inf where P = 0 (row 0: the root)
    depth: list[int],  # [N+1] depth of each row, 0 for the root, 1..g for nodes
    ref: torch.Tensor,  # [g] reference log Q per depth
    tau: float,
) -> tuple[int, int, list[bool]]:
    """(a, chosen row or ROOT, per-depth "some node passed" flags).

    Decided on the host in Python floats with the tensors' float arithmetic (``_host_float``:
    ``log P - ref`` rounded to their dtype, compared with ``log tau`` in that dtype)."""
    g = ref.numel()
    dtype = torch.promote_types(log_path_p.dtype, ref.dtype)
    rnd = _host_float(dtype)
    if rnd is None:  # no host arithmetic for this dtype: on tensors
        d_idx = torch.tensor(depth) - 1  # -1 for the root, which never passes
        passing = (log_path_p - ref[d_idx.clamp_min(0)]) > math.log(tau)
        passing &= ~torch.isneginf(log_path_p) & (d_idx >= 0)
        flags = passing.tolist()
    else:
        values, refs, bar = log_path_p.tolist(), ref.tolist(), rnd(math.log(tau))
        flags = [d > 0 and v != -math.inf and rnd(v - refs[d - 1]) > bar for v, d in zip(values, depth)]
    per_depth = [False] * g
    for r, ok in enumerate(flags):
        if ok:
            per_depth[depth[r] - 1] = True
    a = max((d + 1 for d, ok in enumerate(per_depth) if ok), default=0)
    if a == 0:
        return 0, ROOT, per_depth
    values = log_path_p.tolist()  # exact (float32 / float64 to Python floats); never NaN
    cand = [r for r, ok in enumerate(flags) if ok and depth[r] == a]
    return a, max(cand, key=values.__getitem__), per_depth  # max: the first of the largest


def path_log_probs(
    edge_p: torch.Tensor,  # [N] p(token of row r | its parent), rows 1..N
    parents: list[int],  # [N+1] parent row (parents[0] = -1, parents[r] < r)
) -> torch.Tensor:  # [N+1] log P(path to row), row 0: log 1
    """Path log-likelihoods: the parent's plus the edge's log, row by row; the logarithms
    taken over the vector, the sums on the host with the tensor's float addition
    (``_host_float``)."""
    log_edge = edge_p.log()  # [N]
    rnd = _host_float(edge_p.dtype)
    if rnd is None:  # no host arithmetic for this dtype: on tensors
        out = torch.zeros(len(parents), dtype=edge_p.dtype)
        for r in range(1, len(parents)):  # parents precede children
            out[r] = out[parents[r]] + log_edge[r - 1]
        return out
    logs = log_edge.tolist()
    sums = [0.0] * len(parents)
    for r in range(1, len(parents)):  # parents precede children
        sums[r] = rnd(sums[parents[r]] + logs[r - 1])
    return torch.tensor(sums, dtype=edge_p.dtype)


def greedy_path_log_probs(
    scores,  # mtad.verify.score.Scores of a greedy pass on the CPU
    tokens: list[int],  # [N+1] the scored rows' tokens (row 0: the root)
    parents: list[int],  # [N+1] parent row (parents[0] = -1, parents[r] < r)
) -> torch.Tensor:  # [N+1] log P(path to row): 0 on the target's greedy path, else -inf
    """``path_log_probs`` of one-hot rows, reading a row's argmax only under a live path.

    At temperature 0 an edge's mass is 1 where the token is its parent's argmax and 0
    elsewhere, so a path's log-probability is 0 while every edge follows the argmax and
    -inf from the first that does not, whatever the edges below. The rows under a dead path
    are never read: a tree of ``W x gamma`` nodes reads the rows of its greedy path only
    (a random draft: the root and the node it matches), where the dense form takes the
    argmax of every scored row; a chain, its rows up to the first miss. The values are
    ``path_log_probs``'s of the candidates' edge masses (``tests/verify/test_threshold_host.py``)."""
    out = [0.0] * len(parents)
    for r in range(1, len(parents)):  # parents precede children
        up = parents[r]
        out[r] = 0.0 if out[up] == 0.0 and tokens[r] == scores.argmax(up) else -math.inf
    return torch.tensor(out, dtype=scores.row_candidates(0)[1].dtype)  # the masses' dtype


def _host_float(dtype: torch.dtype):
    """Rounding of one Python float operation's result to ``dtype`` (``mtad.core.hostfloat``:
    float64 as is, float32 rounded once); None for other dtypes."""
    r = hostfloat.rounding(dtype)
    return None if r is None else r[0]


def beams_of(tree: TokenTree, rule: str) -> Beams:
    """The tree's beam-sampling history; ValueError when no beam proposer made the tree."""
    if tree.beams is None:
        raise ValueError(f"{rule} reads the beam history of a beam-sampled draft (tree.beams, "
                         f"filled by mtad.propose.beam.Beam); this tree has none")
    return tree.beams


class JointThreshold:
    """MTAD's rule on the best beam of a beam tree (``tree.beams``): see the module docstring."""

    target_pass = "chain"
    lossless = False
    knobs = (TAU,)
    needs = ("beam_history",)

    def __init__(self, tau: float):
        self.tau = tau

    def verify(self, ctx: StepContext, tree: TokenTree) -> StepOutput:
        beams = beams_of(tree, "MTAD's threshold")
        g = beams.gamma
        best = beams.best()
        draft = beams.path_tokens(best)  # [g]
        scores = score(ctx, TokenTree.chain(draft))  # the best beam's path only
        if ctx.warping.greedy and scores.device.type == "cpu":
            # a chain's path sums, 0 up to the first miss and -inf from it, are the edges' own log
            # p_i(x_i) there; after it every R_d is -inf whatever the later terms (rows not read)
            log_p = greedy_path_log_probs(scores, [-1, *draft], [-1, *range(g)])[1:]
        else:
            x, _ = scores.fed()  # the pass's own copy of the tokens
            log_p = scores.masses(torch.arange(g, device=x.device), x, log=True)  # [g] log p_i(x_i), host
        cum_logq = beams.path_cum_logq(best).to(log_p.dtype)  # on the host (beam sampling's)
        r = cumulative_log_ratio(log_p, cum_logq)
        a, passes = accept_length(r, self.tau)
        y = scores.sample(a, ctx.generator)  # y ~ p_(a+1)
        return StepOutput(
            tokens=draft[:a] + [y],
            drafted=g,
            accepted=a,
            tree_size=g,
            info={"pass": passes, "log_ratio": r.tolist()},
        )


class TreeThreshold:
    """Tree-MTAD's rule on every node of a beam tree: see the module docstring."""

    target_pass = "tree"
    lossless = False
    knobs = (TAU, Knob("compat_slot_index", Rule("bool", means="the authors' fixed-slot reading of the "
                                                  "reference, for comparison only", example="false"), False))
    needs = ("beam_history",)

    def __init__(self, tau: float, compat_slot_index: bool = False):
        self.tau = tau
        self.compat_slot_index = compat_slot_index

    def reference(self, beams: Beams) -> torch.Tensor:  # [g]
        best = beams.best()
        if not self.compat_slot_index:
            return beams.path_cum_logq(best)
        return torch.stack([c[min(best, len(c) - 1)] for c in beams.cum_logq])

    def verify(self, ctx: StepContext, tree: TokenTree) -> StepOutput:
        beams = beams_of(tree, "tree-MTAD's threshold")
        scores = score(ctx, tree)  # one pass over the whole tree
        nodes = scores.nodes  # one row per distinct beam node
        tokens, parents, depth = nodes.tokens, nodes.parents, nodes.depths
        g = tree.depth
        if ctx.warping.greedy and scores.device.type == "cpu":
            log_path_p = greedy_path_log_probs(scores, tokens, parents)  # rows read top-down
        else:
            x, par = scores.fed(parents=True)  # the pass's own copy
            edge_p = scores.masses(par, x)  # [N] on the host: the edge probabilities p[parent, token]
            log_path_p = path_log_probs(edge_p, parents)  # [N+1] on the host, row 0: log 1
        ref = self.reference(beams).to(log_path_p.dtype)  # [g] on the host (beam sampling's)
        a, node, per_depth = tree_accept(log_path_p, depth, ref, self.tau)
        y = scores.sample(node, ctx.generator)  # node = ROOT (0) is the root row
        return StepOutput(
            tokens=nodes.path_tokens(nodes.path(node)) + [y],
            drafted=g,
            accepted=a,
            tree_size=len(tokens) - 1,
            info={"pass": per_depth, "ref": ref.tolist()},
        )

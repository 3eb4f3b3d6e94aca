"""MTJD / MJGD: multi-token joint decoding, the ideal that MTAD approximates. Target only.

Each step emits the next ``gamma`` tokens at once from the target's joint distribution

    P(x_1..x_g | ctx) = prod_i p(x_i | ctx, x_<i)        (p = the target's plain softmax)

with the warping applied **at the joint level**: temperature, top-k and top-p act on
the ``V**g`` joint log-probabilities as if they were one vocabulary's logits.

* MTJD (``MTJD``, multi-token joint sampling) draws one block from the warped joint;
* MJGD (``MJGD``, multi-token joint greedy decoding) takes the joint argmax (first on
  ties); warping does not move the argmax. ``MJGD(gamma=1)`` is greedy decoding.

Methods:

* ``exact``: enumerate every block. The target scores the full enumeration tree
  (all ``V + V**2 + ... + V**(g-1)`` prefixes as tree nodes) in ONE pass. Feasible
  for toy vocabularies only: more than ``max_enumeration`` blocks (``V**g``) is a
  configuration error naming the fields to change.
* ``beam``: a wide beam search on the target's joint log-probabilities (``beam_width``
  prefixes per depth, one target pass per depth); the last depth keeps all
  ``beam_width * V`` expansions as candidates, and MJGD / MTJD take the argmax / a
  joint-warped sample over them. An approximation usable on real models.
* ``auto``: ``exact`` when ``V**g <= max_enumeration``, else ``beam``; the step's
  ``info["method"]`` says which ran.

Not a proposer + verifier composition: there is no draft and nothing to accept; the
target itself is searched (the enumeration tree is a ``mtad.core.tree.TokenTree`` fed to
the target). The decoder base still clips the block to the remaining length
(``shape_knobs = ("gamma",)``, ``reserve = 0``).

Records: every step emits ``g`` tokens (``g = min(gamma, remaining)``); there is no
draft, so ``accepted = drafted = g - 1`` makes block efficiency (accepted + steps) /
steps equal to the tokens per step. ``tree_size`` = target nodes scored.
"""

from __future__ import annotations

import torch

from mtad.core.decoder import Decoder, StepContext, StepOutput, sample
from mtad.core.knobs import GAMMA, Knob, Rule
from mtad.core.protocols import ROOT
from mtad.core.sampling import DENSE_MAX, draw, top_entries
from mtad.core.topk import argmax_rows, topk_rows
from mtad.core.tree import TokenTree
from mtad.core.warping import _top_p_of

METHODS = ("exact", "beam", "auto")


def enumeration_tree(vocab: int, depth: int) -> TokenTree:
    """Every prefix of length 1..depth as tree rows, breadth-first, lexicographic.

    Rows as in ``mtad.core.runner`` (root = row 0, the i-th listed prefix is row i).
    """
    tree = TokenTree(depth=depth)
    prev = [ROOT]
    for _ in range(depth):
        prev = [tree.add(par, v) for par in prev for v in range(vocab)]
    return tree


def joint_log_probs(
    root_logp: torch.Tensor,  # [V] log p(. | ctx)
    node_logp: torch.Tensor,  # [N, V] log p(. | node), nodes as in enumeration_tree(V, g-1)
    gamma: int,
) -> torch.Tensor:  # [V**gamma] log P(x_1..x_g), blocks in lexicographic order
    vocab = root_logp.numel()
    joint = root_logp
    start = 0
    for t in range(1, gamma):
        n = vocab**t
        joint = (joint[:, None] + node_logp[start : start + n]).flatten()
        start += n
    return joint


_ROW_MARGIN = 8  # entries read per row past those a selection needs (ties past them: dense)


def joint_candidates(
    rows: torch.Tensor,  # [n, V] log p(. | prefix i), on the CPU
    score: torch.Tensor,  # [n] log P(prefix i)
    k: int,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor] | None:  # flat ids [c] ascending, their values [c]; or None
    """Entries of ``joint = (score[:, None] + rows).flatten()`` (``/ temperature`` unless 1)
    that hold its ``k`` largest, read on each row's top ``k + 8`` instead of the ``n x V``
    vector: every flattened index ``i * V + v`` with its value, the very float64 sum (and
    quotient) the vector holds there.

    A row's entries outside its top ``m`` are at most its ``m``-th (adding a row's ``score`` and
    dividing by a positive temperature round monotonically), so when every row's ``m``-th is
    strictly below the candidates' ``k``-th largest, no entry outside them reaches it, and the
    candidates' first ``k`` by (value descending, index ascending) are the vector's. None where
    that is not shown (ties or too many entries at a row's ``m``-th, NaN): the caller builds the
    vector."""
    n, vocab = rows.shape
    m = min(vocab, k + _ROW_MARGIN)
    vals, ids = topk_rows(rows, m)  # [n, m], descending (NaN first)
    joint = score[:, None] + vals
    if temperature != 1.0:
        joint = joint / temperature
    flat = joint.flatten()
    if k > flat.numel() or bool(torch.isnan(flat).any()):
        return None
    kth = torch.topk(flat, k).values[-1]
    if m < vocab and not bool((joint[:, -1] < kth).all()):
        return None
    ids = (torch.arange(n)[:, None] * vocab + ids).flatten()
    order = torch.argsort(ids)
    return ids[order], flat[order]


def unravel(index: int, vocab: int, gamma: int) -> list[int]:
    out = []
    for _ in range(gamma):
        out.append(index % vocab)
        index //= vocab
    return out[::-1]


class JointDecoder(Decoder):
    """Shared machinery of MTJD (``sample = True``) and MJGD (``sample = False``)."""

    uses_draft = False
    lossless = False
    sample_joint = False
    shape_knobs = ("gamma",)
    reserve = 0  # a block may fill the remaining length
    knobs = (
        GAMMA.without_auto(),  # no draft: the cost model has no profile for it
        Knob("method", Rule("choice", options=METHODS, example="auto"), "exact"),
        Knob("beam_width", Rule("integer", 1, means="prefixes kept per depth", example="16"), 16),
        Knob("max_enumeration", Rule("integer", 1, means="most blocks V**gamma method=exact enumerates",
                                     example="100000"), 100_000),
    )

    def __init__(self, *args, name: str | None = None, **values):
        super().__init__(name)
        self.set_fields(args, values)
        self._ws: tuple[torch.Tensor, torch.Tensor] | None = None  # CPU workspace (``_log_probs``)

    def _log_probs(self, logits: torch.Tensor) -> torch.Tensor:  # [n, V] -> [n, V] float64
        """``logits.double().log_softmax(-1)``, on the CPU into two float64 buffers kept across
        depths and steps: the same kernel (its ``out=`` form) on the same float64 copy, so the same
        values, without two fresh ``n x V`` float64 tensors per depth (19 MB each at 16 x 151,936:
        fresh ones may fault their pages in on every call, depending on the allocator's state:
        ``results/bench/depth_parts_cpu.txt``). The result is valid until the next call."""
        if logits.device.type != "cpu" or logits.dim() != 2:
            return logits.double().log_softmax(-1)
        n, vocab = logits.shape
        ws = self._ws
        if ws is None or ws[0].shape[1] != vocab or ws[0].shape[0] < n:
            rows = max(n, self.beam_width)
            ws = self._ws = (torch.empty(rows, vocab, dtype=torch.float64),
                             torch.empty(rows, vocab, dtype=torch.float64))
        src, out = ws[0][:n], ws[1][:n]
        src.copy_(logits)
        return torch.log_softmax(src, -1, out=out)

    def _choose(self, ctx: StepContext, joint: torch.Tensor) -> int:  # joint [M] log-probabilities
        if self.sample_joint:
            return sample(ctx.warping(joint), ctx.generator, ctx.warping.support_bound)
        return int(argmax_rows(joint))  # torch.argmax's (first maximum); one transfer

    def _choose_rows(self, ctx: StepContext, rows: torch.Tensor, score: torch.Tensor) -> int | None:
        """``_choose`` over ``joint = (score[:, None] + rows).flatten()`` read on each row's top
        entries (CPU, see ``joint_candidates``): the same block and the same draw, or None where
        that is not shown (the caller builds ``joint``)."""
        w = ctx.warping
        if not self.sample_joint or w.greedy:  # the joint argmax (a one-hot warped joint at T = 0)
            if self.sample_joint and rows.numel() <= DENSE_MAX:
                return None  # a short joint is drawn over every entry (``support``)
            got = joint_candidates(rows, score, 1)
            if got is None:
                return None
            ids, vals = got
            first = int(ids[torch.sort(vals, descending=True, stable=True).indices[0]])
            if self.sample_joint:  # the draw ``sample`` makes on the one-hot joint's support
                return int(draw(ids[:1].new_tensor([first]), vals.new_ones(1), ctx.generator)[0])
            return first
        if not (0 < w.top_k < rows.numel()) or rows.numel() <= DENSE_MAX:
            return None  # no top-k (a nucleus over the joint), or a short joint drawn densely
        # the warping's top-k fast path (``warp_probs``) on the candidates: its top k + 1
        # strictly decreasing, so the k candidates and their warped masses are the joint's
        got = joint_candidates(rows, score, w.top_k + 1, w.temperature)
        if got is None:
            return None
        ids, vals = got
        top, pos = torch.topk(vals, w.top_k + 1)
        if not bool((top[:-1] > top[1:]).all()):
            return None
        idx, probs = _top_p_of(top[:-1].contiguous(), pos[:-1].contiguous(), w.top_p)
        nz = probs > 0
        flat, mass = ids[idx[nz]], probs[nz]
        order = torch.argsort(flat)  # the support in ascending order, as ``sample`` reads it
        return int(draw(flat[order], mass[order], ctx.generator)[0])

    def decode(self, ctx: StepContext, g: int) -> StepOutput:
        # the vocabulary size without a forward pass: the exact method scores root and tree in one
        vocab = ctx.target.vocab_size or ctx.target.model.get_output_embeddings().weight.shape[0]
        method = self.method
        too_big = vocab**g > self.max_enumeration
        if method == "auto":
            method = "beam" if too_big else "exact"
        if method == "exact" and too_big:
            raise ValueError(
                f"{self.name}: method=exact enumerates V**gamma = {vocab}**{g} = {vocab**g} blocks, "
                f"more than max_enumeration={self.max_enumeration}; set decoder.method=beam "
                f"(with decoder.beam_width) or lower gamma, or raise decoder.max_enumeration"
            )
        tokens, tree_size = (
            self._exact(ctx, g, vocab) if method == "exact" else self._beam(ctx, g, vocab)
        )
        return StepOutput(
            tokens=tokens,
            drafted=g - 1,
            accepted=g - 1,
            tree_size=tree_size,
            info={"method": method},
        )

    def _exact(self, ctx: StepContext, g: int, vocab: int) -> tuple[list[int], int]:
        tree = enumeration_tree(vocab, g - 1)
        tokens = tree.tokens[1:]
        logits = ctx.target.forward(tokens, tree.parents[1:])  # [N, V], one pass over the enumeration tree
        root = ctx.target.root_logits
        node_logp = logits.double().log_softmax(-1) if logits.numel() else logits.double()
        joint = joint_log_probs(root.double().log_softmax(-1), node_logp, g)  # [V**g]
        return unravel(self._choose(ctx, joint), vocab, g), len(tokens)

    def _beam(self, ctx: StepContext, g: int, vocab: int) -> tuple[list[int], int]:
        rows = self._log_probs(ctx.target.root_logits[None])  # [1, V]
        score = torch.zeros(1, dtype=torch.float64, device=rows.device)  # [n] joint log-prob per prefix
        prefixes: list[list[int]] = [[]]
        nodes = [ROOT]  # target tree row of each beam's last token
        fed = 0
        for t in range(g):
            if t > 0:
                first = ctx.target.num_nodes
                logits = ctx.target.forward([pre[-1] for pre in prefixes], nodes)  # [n, V]
                fed += len(prefixes)
                nodes = list(range(first + 1, first + 1 + len(prefixes)))
                rows = self._log_probs(logits)
            cpu = rows.device.type == "cpu"
            if t == g - 1:
                k = self._choose_rows(ctx, rows, score) if cpu else None
                if k is None:
                    k = self._choose(ctx, (score[:, None] + rows).flatten())  # [n * V]
                return prefixes[k // vocab] + [k % vocab], fed
            width = min(self.beam_width, rows.numel())
            got = joint_candidates(rows, score, width) if cpu else None
            if got is not None:  # the first beam_width of the stable sort, from each row's top
                ids, vals = got
                pos = torch.sort(vals, descending=True, stable=True).indices[:width]
                fin = pos[torch.isfinite(vals[pos])]
                keep, order = torch.sort(ids[fin])  # lexicographic: full width = exact
                score = vals[fin][order]
            elif cpu:  # the same, on the n x V vector: without sorting all of it
                cand = (score[:, None] + rows).flatten()  # [n * V]
                top, vals, _ = top_entries(cand, width)
                keep = torch.sort(top[torch.isfinite(vals)]).values
                score = cand[keep]
            else:
                cand = (score[:, None] + rows).flatten()  # [n * V]
                top = torch.sort(cand, descending=True, stable=True).indices[: self.beam_width]
                host = torch.stack([top, torch.isfinite(cand[top]).long()]).cpu()  # one transfer per depth
                keep = torch.sort(host[0][host[1].bool()]).values  # lexicographic: full width = exact
                # the same entries picked on the device (no index copied over): finite ones first, sorted
                last = torch.where(torch.isfinite(cand[top]), top, torch.full_like(top, cand.numel()))
                score = cand[torch.sort(last).values[: len(keep)]]
            prefixes = [prefixes[i // vocab] + [i % vocab] for i in keep.tolist()]
            nodes = [nodes[i // vocab] for i in keep.tolist()]
        raise AssertionError("unreachable")


class MJGD(JointDecoder):
    """Multi-token joint greedy decoding: the argmax block of the target's joint distribution."""

    name = "mjgd"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    sample_joint = False


class MTJD(JointDecoder):
    """Multi-token joint decoding by sampling: one block from the joint-level-warped joint."""

    name = "mtjd"
    version = "1"  # bump when the behaviour changes (a point's identity includes it)
    sample_joint = True

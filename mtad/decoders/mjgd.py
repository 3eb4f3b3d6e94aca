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
from mtad.core.sampling import top_entries
from mtad.core.tree import TokenTree

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

    def _choose(self, ctx: StepContext, joint: torch.Tensor) -> int:  # joint [M] log-probabilities
        if self.sample_joint:
            return sample(ctx.warping(joint), ctx.generator, ctx.warping.support_bound)
        return int(torch.argmax(joint))  # one transfer

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
        rows = ctx.target.root_logits.double().log_softmax(-1)[None]  # [1, V]
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
                rows = logits.double().log_softmax(-1)
            cand = (score[:, None] + rows).flatten()  # [n * V]
            if t == g - 1:
                k = self._choose(ctx, cand)
                return prefixes[k // vocab] + [k % vocab], fed
            if cand.device.type == "cpu":  # the first beam_width of the stable sort, without sorting all
                top, vals, _ = top_entries(cand, min(self.beam_width, cand.numel()))
                keep = torch.sort(top[torch.isfinite(vals)]).values  # lexicographic: full width = exact
                score = cand[keep]
            else:
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

"""Greedy match: the canonical verifier of greedy speculative decoding. Lossless at
temperature 0, which is the only setting it supports.

A draft chain x_1..x_g is checked against the target's argmaxes, with no draw:

    target  one pass (``mtad.verify.score``): logits l_1..l_(g+1) (row i scores x_i)
    accept  x_i while x_i == argmax l_i   (longest run from x_1; ``torch.argmax``'s first maximum)
    emit    x_1..x_a, then argmax l_(a+1)   (the correction at the first mismatch, or the bonus)

So every emitted token is the target's argmax after the tokens before it: the output equals
greedy decoding (``mtad.decoders.autoregressive.Greedy``) token for token, whatever the draft.
At temperature > 0 the rule would not follow the warped target (it would be greedy decoding
whatever the warping says), so its ``sampling`` declaration is temperature 0 only and a run
at another temperature is refused before anything loads. Speculative sampling
(``mtad.verify.chain``) gives the same tokens at temperature 0 through one-hot rows; this rule
reads only the argmaxes and needs neither the draft's rows q nor a random draw.

Devices: the argmaxes of the scored rows are compared with the pass's own copy of the tokens on
the target's device; both cross to the host in one transfer.
"""

from __future__ import annotations

import torch

from mtad.core.decoder import StepContext, StepOutput
from mtad.core.knobs import Sampling
from mtad.core.topk import argmax_rows
from mtad.core.tree import TokenTree
from mtad.verify.score import chain_tokens, score


def greedy_match_length(
    draft_tokens: torch.Tensor,  # [g] on the logits' device
    best: torch.Tensor,  # [>= g + 1] the target's argmax after each row (row i scores draft_tokens[i])
) -> tuple[int, int]:
    """(number accepted, the target's token after them): the longest prefix of ``draft_tokens``
    equal to ``best``, and ``best`` at the first mismatch (or after the last token). One transfer."""
    g = draft_tokens.numel()
    host = torch.cat([(draft_tokens == best[:g]).long(), best[: g + 1]]).tolist()
    a = next((i for i, ok in enumerate(host[:g]) if not ok), g)
    return a, int(host[g + a])


class GreedyMatch:
    """Greedy match of a chain tree (rows 1..g): accept while the draft token is the target's argmax."""

    target_pass = "chain"
    lossless = True  # at the one setting it supports: equal to greedy decoding
    knobs = ()
    needs = ("chain",)
    sampling = Sampling(sampled=False, why="it accepts a draft token iff it is the target's argmax")

    def verify(self, ctx: StepContext, tree: TokenTree) -> StepOutput:
        tokens = chain_tokens(tree, "greedy match")
        g = len(tokens)
        scores = score(ctx, tree)
        x, _ = scores.fed()  # [g] on the logits' device
        a, y = greedy_match_length(x, argmax_rows(scores.logits))
        return StepOutput(tokens=tokens[:a] + [y], drafted=g, accepted=a, tree_size=g)

"""Statistical tools for proving decoders lossless (used by the tests and the approximation study).

``exact_joint`` enumerates every continuation of a toy model (small vocabulary,
short length) and returns the exact warped target joint distribution;
``sample_sequences`` runs a decoder through the engine many times;
``chi_square_gof`` compares the two with cells of expected count < 5 merged, and names
any sample outside the reference's support; ``prefix_marginal`` reduces either to the
first ``k`` tokens, where a fixed sample has more counts per cell (more power against an
error in the first block than the full joint's many sparse cells).
``tiny_pair`` is the float64 40-token pair the decoder tests run every decoder on;
``unsupported_by`` says why a decoder does not support a warping (a test skips that setting);
``sampling_overrides`` gives the run config's overrides for sampling settings it supports.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch
from scipy import stats

from mtad.core.warping import Warping


def tiny_pair(vocab_size: int = 40):
    """The decoder tests' float64 pair: a 2-layer target and a 1-layer draft of another seed,
    logits scaled so that drafts are accepted and rejected (deterministic on any CPU)."""
    from mtad.models.tiny import tiny_causal_lm

    t = tiny_causal_lm("qwen2", vocab_size=vocab_size, dtype=torch.float64, seed=0, logit_scale=4.0)
    d = tiny_causal_lm("qwen2", vocab_size=vocab_size, hidden_size=16, num_heads=2, num_layers=1,
                       dtype=torch.float64, seed=1, logit_scale=4.0)
    return t, d


def unsupported_by(decoder, warping: Warping) -> str | None:
    """Why ``decoder`` does not support ``warping`` (the sampling settings its pieces declare,
    ``mtad.core.knobs.Sampling``), in one line; None where it does. A test that runs every
    decoder skips such a setting with this reason (the engine refuses it)."""
    check = getattr(decoder, "sampling_problem", None)
    problem = check(warping.temperature, warping.top_k, warping.top_p) if check else None
    return f"{decoder.name}: {problem}" if problem else None


def sampling_overrides(decoder) -> list[str]:
    """The run config's overrides (``temperature=0``) that put it at sampling settings ``decoder``
    supports: none where ``conf/config.yaml``'s defaults are supported, else the first of
    temperature 0 and plain temperature 1 that is. A test that composes and checks every decoder's
    config with the run's defaults adds them."""
    from mtad.run.config import MtadConfig

    default = {f: MtadConfig.__dataclass_fields__[f].default for f in ("temperature", "top_k", "top_p")}
    for over, warping in (([], Warping(default["temperature"], default["top_k"], default["top_p"])),
                          (["temperature=0"], Warping(0.0)),
                          (["top_k=0", "top_p=1.0"], Warping(default["temperature"]))):
        if not unsupported_by(decoder, warping):
            return over
    raise ValueError(f"{decoder.name} supports none of the settings tried")


@torch.no_grad()
def exact_joint(
    model, prompt: Sequence[int], length: int, warping: Warping, vocab_size: int | None = None
) -> dict[tuple[int, ...], float]:
    """P(x1..xL | prompt) = prod_i warp(p(. | prompt, x<i))[xi], for every sequence of ``length``."""
    vocab = vocab_size or model.config.vocab_size
    joint: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        prefixes = [s for s, pr in joint.items() if pr > 0]
        ids = torch.tensor([list(prompt) + list(s) for s in prefixes])
        logits = model(input_ids=ids).logits[:, -1, :vocab]
        probs = warping(logits.double())
        nxt = {}
        for s, row in zip(prefixes, probs):
            for v in torch.nonzero(row).flatten().tolist():
                nxt[s + (v,)] = joint[s] * float(row[v])
        joint = nxt
    return joint


def sample_sequences(engine, prompt: Sequence[int], length: int, n: int, seed0: int = 0) -> Counter:
    """Counts of the first ``length`` generated tokens over ``n`` seeded runs."""
    counts: Counter = Counter()
    for i in range(n):
        out = engine.generate(prompt, length, seed=seed0 + i).output_ids
        counts[tuple(out[:length])] += 1
    return counts


def homogeneity_test(a: Counter, b: Counter, min_cells: int = 10) -> float:
    """Two-sample chi-square homogeneity p-value of two samples' counts: cells with at least 10
    counts in the two together, the rest pooled into one cell when it has 10; AssertionError
    when fewer than ``min_cells`` cells remain (the test would have little power)."""
    cells = sorted(set(a) | set(b), key=lambda s: -(a[s] + b[s]))
    big = [s for s in cells if a[s] + b[s] >= 10]
    table = [[a[s] for s in big], [b[s] for s in big]]
    rest = [sum(a[s] for s in cells if s not in big), sum(b[s] for s in cells if s not in big)]
    if sum(rest) >= 10:
        table = [row + [r] for row, r in zip(table, rest)]
    assert len(table[0]) >= min_cells, f"{len(table[0])} cells: too few for the test to have power"
    return float(stats.chi2_contingency(table).pvalue)


def prefix_marginal(dist: dict, k: int) -> dict:
    """Counts or probabilities of whole sequences summed over their first ``k`` tokens."""
    out: dict = {}
    for seq, v in dist.items():
        out[seq[:k]] = out.get(seq[:k], 0) + v
    return Counter(out) if isinstance(dist, Counter) else out


class OutsideSupport(AssertionError):
    """Samples the reference gives probability 0: no goodness-of-fit statistic is needed."""


def chi_square_gof(
    counts: Counter, probs: dict, min_expected: float = 5.0, allow_outside: bool = False
) -> tuple[float, float, int]:
    """Pearson chi-square goodness of fit; returns (statistic, p-value, degrees of freedom).

    Cells with expected count < ``min_expected`` are merged into one pooled cell.
    Observations outside the support of ``probs`` raise ``OutsideSupport`` naming them
    (the reason a test fails, not a small p-value); with ``allow_outside`` they give
    statistic inf and p-value 0 instead, for controls that only need a rejection.
    """
    n = sum(counts.values())
    outside = {k: c for k, c in counts.items() if probs.get(k, 0.0) <= 0}
    if outside and not allow_outside:
        shown = dict(sorted(outside.items(), key=lambda kc: -kc[1])[:10])
        more = f" and {len(outside) - len(shown)} more" if len(outside) > len(shown) else ""
        raise OutsideSupport(
            f"samples outside the target's support: {sum(outside.values())} of {n} ({shown}{more})"
        )
    obs, exp = [], []
    pool_o, pool_e = 0.0, 0.0
    for k, p in sorted(probs.items(), key=lambda kv: -kv[1]):
        e = n * p
        if e >= min_expected:
            obs.append(counts.get(k, 0))
            exp.append(e)
        else:
            pool_o += counts.get(k, 0)
            pool_e += e
    if pool_e > 0:
        if pool_e >= min_expected or not exp:
            obs.append(pool_o)
            exp.append(pool_e)
        else:  # too small to stand alone: merge into the smallest kept cell
            obs[-1] += pool_o
            exp[-1] += pool_e
    obs_a, exp_a = np.asarray(obs, float), np.asarray(exp, float)
    if outside:  # allowed: an outright rejection, over the cells the table would have had
        return float("inf"), 0.0, len(obs_a) - 1
    exp_a *= obs_a.sum() / exp_a.sum()
    if len(obs_a) < 2:
        return 0.0, 1.0, 0
    stat, pval = stats.chisquare(obs_a, exp_a)
    return float(stat), float(pval), len(obs_a) - 1


def all_sequences(vocab: int, length: int):
    return itertools.product(range(vocab), repeat=length)


def regenerate(folder, n: int = 1) -> list[tuple[list[int], list[int]]]:
    """Re-run the first ``n`` first-turn generations of a results folder with today's code.

    Reads the point as its folder describes it and rebuilds it from ``conf/``
    (``mtad.run.results.described``: nothing the folder names is imported or resolved, its
    host settings are this machine's), builds its pair, decoder and task as the run did
    (``mtad.run.evaluate.build``) and generates each example's first turn with the record's
    seed. Returns (recorded, regenerated) ``output_ids`` per record: equal when the code
    still produces what is committed (on a CPU whose float kernels match the recording one).
    """
    from pathlib import Path

    from mtad.core.io import read_jsonl
    from mtad.run.evaluate import build
    from mtad.run.results.described import describe, rebuild, report

    folder = Path(folder)
    rebuilt = rebuild(describe(folder))
    report(rebuilt, folder)
    cfg = rebuilt.cfg
    records = read_jsonl(folder / "samples.jsonl")
    records = sorted((r for r in records if r.get("turn", 0) == 0), key=lambda r: r["index"])[:n]
    pair, _, task, _, engine, _ = build(cfg)
    examples = task.load()
    out = []
    for r in records:
        ex = examples[r["index"]]
        assert ex.id == r["example_id"], f"example {r['index']} is {ex.id}, the record says {r['example_id']}"
        ids = task.render(ex, pair.tokenizer, 0, [])
        res = engine.generate(ids, int(cfg.max_new_tokens), seed=int(cfg.seed) + 1000 * r["index"])
        out.append((list(r["output_ids"]), res.output_ids))
    return out

"""Every metric, defined once, with its convention.

- tokens/s: generated tokens / decoding wall time, summed over examples (prefill and
  perplexity scoring excluded; warm-up runs excluded).
- ms/token: 1000 / tokens/s.
- J/token: energy over the timed decoding windows / generated tokens; None when the
  energy meter is unavailable (never 0).
- block efficiency: emitted tokens / steps, i.e. mean tokens committed per decoding step
  (accepted draft tokens plus the correction/bonus token, as emitted: a last step cut short
  by ``max_new_tokens`` or EOS counts the tokens it kept, not accepted + 1); autoregressive
  = 1.0. From records: ``sum(emitted_per_step) / steps`` = ``new_tokens / steps``
  (``records_block_efficiency``: over a run's examples, or over one example's turns). The one
  definition for the engine (``GenerationResult.block_efficiency``), summaries, the claims
  report (per example) and ``bench/speed.py``.
- tokens per target pass: new tokens / target forward passes while decoding. Equals block
  efficiency except for decoders that sometimes emit without calling the target (BiLD);
  ``bench/speed.py`` shows it for HF's decoders, which report no steps.
- acceptance rate (chain drafts): accepted / drafted.
- per-depth acceptance: share of steps whose accepted length is >= d, for d = 1..max.
- perplexity: exp(-mean log p_target(generated token | context)) under the unwarped
  target, per example, computed after generation outside the timed window; the
  summary reports the arithmetic mean of per-record perplexities (``perplexity_mean``, also
  under its old key ``perplexity``), the geometric mean over examples that tables show
  (``perplexity_geomean``) and the token-weighted (pooled) perplexity (``perplexity_pooled``).
- speedup: tokens/s of a run / tokens/s of the baseline run in the same sweep.

What tables, figures and the claims report show (``example_values``, ``cell_statistics``): one
value per example (a multi-turn example pools its turns), then
- perplexity: the geometric mean over examples of the per-example perplexity, an example's
  log-perplexity being its turns' summed NLL / summed tokens (``example_log_perplexity``). The
  ratio of two such cells over the same examples is the claims report's paired ratio of
  geometric means; the arithmetic mean of per-record perplexities (``summarize``'s
  ``perplexity_mean``, and ``perplexity`` in summaries written before the key said so) is kept
  in summaries only;
- block efficiency: the mean over examples of the per-example block efficiency (emitted tokens /
  steps over its turns, ``example_block_efficiency``), so every example weighs the same, as in
  the report's paired differences; ``summarize``'s pools tokens and steps over the examples;
- score: the mean over examples of the example's scored record (last turn);
- tokens/s: total generated tokens / total decoding time over the examples (``summarize``).
Confidence intervals: bootstrap over the examples that have the metric (``mtad.core.stats``:
``bootstrap_ci`` of ``present`` values, the one bootstrap).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from mtad.core import stats


def block_efficiency(emitted: int, steps: int) -> float:
    """Emitted tokens per decoding step; NaN without steps."""
    return emitted / steps if steps else float("nan")


def emitted_tokens(record: dict) -> int:
    """Tokens a record's steps emitted: ``sum(emitted_per_step)``, else ``new_tokens`` (equal)."""
    if record.get("emitted_per_step") is not None:
        return int(sum(record["emitted_per_step"]))
    return int(record.get("new_tokens") or 0)


def records_block_efficiency(records: Sequence[dict]) -> float:
    """``block_efficiency`` of records taken together (a run's examples, an example's turns):
    their emitted tokens / their steps; NaN without steps."""
    steps = sum(int(r.get("steps") or 0) for r in records)
    return block_efficiency(sum(emitted_tokens(r) for r in records), steps)


def tokens_per_target_pass(tokens: int, passes: int) -> float:
    """New tokens per target forward pass while decoding; NaN without passes."""
    return tokens / passes if passes else float("nan")


def acceptance_rate(accepted: int, drafted: int) -> float:
    return accepted / drafted if drafted else float("nan")


def per_depth_acceptance(accepted_per_step: Sequence[int]) -> list[float]:
    if not accepted_per_step:
        return []
    a = np.asarray(accepted_per_step)
    return [float((a >= d).mean()) for d in range(1, int(a.max()) + 1)]


def tokens_per_second(new_tokens: int, seconds: float) -> float:
    return new_tokens / seconds if seconds > 0 else float("nan")


@torch.no_grad()
def token_logprobs(model, prompt_ids: Sequence[int], output_ids: Sequence[int], vocab_size: int | None = None,
                   ) -> torch.Tensor:
    """log p_target(output_i | prompt, output_<i) under the unwarped target, float64 [len(output)]."""
    if not output_ids:
        return torch.empty(0, dtype=torch.float64)
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(output_ids)], device=device)
    n_out = len(output_ids)
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=n_out + 1).logits[0, :-1]
    if vocab_size is not None:
        logits = logits[:, :vocab_size]
    logp = torch.log_softmax(logits.double(), -1)
    return logp.gather(-1, ids[0, -n_out:, None].to(logp.device))[:, 0].cpu()


def perplexity(logprobs: torch.Tensor) -> float:
    return float(torch.exp(-logprobs.mean())) if logprobs.numel() else float("nan")


# ----------------------------------------------------------------- per example (tables, report)

#: The statistic of each table column and figure axis, as printed in table notes and labels.
DEFINITIONS = {
    "perplexity": "PPL = geometric mean over examples of per-example perplexity (an example's turns pooled: exp(sum NLL / sum tokens))",
    "block_efficiency": "BE = mean over examples of per-example block efficiency (emitted tokens / steps over its turns)",
    "score": "score = mean over examples of the example's score",
    "tokens_per_s": "tok/s = total tokens / total decoding time over the examples",
}
#: Short forms for figure axes.
AXIS_LABELS = {
    "perplexity": "perplexity (geom. mean over examples)",
    "block_efficiency": "block efficiency (mean over examples)",
    "tokens_per_s": "tokens/s (total tokens / total time)",
}


def example_log_perplexity(turns: Sequence[dict]) -> float | None:
    """An example's log-perplexity over its turns: summed NLL / summed tokens (``nll_sum``, else
    ``log(perplexity) * new_tokens``); None when a turn has neither or there are no tokens."""
    if len(turns) == 1 and isinstance(turns[0].get("perplexity"), (int, float)) and turns[0]["perplexity"] > 0 \
            and not (turns[0].get("nll_sum") is not None and turns[0].get("new_tokens")):
        return math.log(float(turns[0]["perplexity"]))  # one turn: its own log-perplexity
    nll = tokens = 0.0
    for r in turns:
        n = r.get("new_tokens") or 0
        if r.get("nll_sum") is not None:
            nll += float(r["nll_sum"])
        elif r.get("perplexity") is not None and n:
            nll += math.log(float(r["perplexity"])) * n
        else:
            return None
        tokens += n
    return nll / tokens if tokens else None


def example_block_efficiency(turns: Sequence[dict]) -> float | None:
    """An example's block efficiency over its turns (``records_block_efficiency``: emitted
    tokens / steps); None without steps."""
    value = records_block_efficiency(turns)
    return None if math.isnan(value) else value


def example_score(turns: Sequence[dict]) -> float | None:
    """An example's score: that of its last scored record (multi-turn tasks score the last turn)."""
    scored = [r["score"] for r in turns if isinstance(r.get("score"), (int, float))]
    return float(scored[-1]) if scored else None


def by_example(records: Sequence[dict]) -> dict[str, list[dict]]:
    """Records grouped by example id, turns in order."""
    out: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: (int(r.get("index", 0)), int(r.get("turn", 0)))):
        out.setdefault(str(r.get("example_id", r.get("index"))), []).append(r)
    return out


def cell_statistics(records: Sequence[dict]) -> dict[str, float | tuple[float, float] | int]:
    """The statistics a table cell shows (``DEFINITIONS``) with their 95% bootstrap intervals
    over examples (resampling examples; the perplexity interval is the exponential of the
    interval of the mean log-perplexity): ``examples``, ``perplexity``, ``block_efficiency``,
    ``score`` (NaN without scores), ``tokens_per_s`` and each ``<name>_ci``."""
    groups = list(by_example(records).values())
    logs = stats.present([example_log_perplexity(t) for t in groups])
    bes = stats.present([example_block_efficiency(t) for t in groups])
    scores = stats.present([example_score(t) for t in groups])
    nan2 = (math.nan, math.nan)
    out: dict = {"examples": len(groups)}
    out["perplexity"] = math.exp(float(np.mean(logs))) if logs else math.nan
    lo, hi = stats.bootstrap_ci(logs) if len(logs) > 1 else nan2
    out["perplexity_ci"] = (math.exp(lo), math.exp(hi))
    out["block_efficiency"] = float(np.mean(bes)) if bes else math.nan
    out["block_efficiency_ci"] = stats.bootstrap_ci(bes) if len(bes) > 1 else nan2
    out["score"] = float(np.mean(scores)) if scores else math.nan
    out["score_ci"] = stats.bootstrap_ci(scores) if len(scores) > 1 else nan2
    tokens = sum(int(r.get("new_tokens") or 0) for r in records)
    wall = sum(float(r.get("wall_time") or 0.0) for r in records)
    out["tokens_per_s"] = tokens_per_second(tokens, wall)
    out["tokens_per_s_ci"] = tokens_per_s_interval(list(records))
    return out


def tokens_per_s_interval(records: list[dict]) -> tuple[float, float]:
    """95% bootstrap interval of tokens/s as ``summarize`` estimates it (total new tokens / total
    decoding time), resampling examples: the interval of the estimate's own statistic."""
    pairs = [(r["new_tokens"], r["wall_time"]) for r in records
             if r.get("new_tokens") is not None and r.get("wall_time")]
    return stats.ratio_ci([t for t, _ in pairs], [w for _, w in pairs])


def block_efficiency_interval(records: list[dict]) -> tuple[float, float]:
    """95% bootstrap interval of block efficiency as ``summarize`` estimates it (emitted tokens /
    steps over all records, ``records_block_efficiency``), resampling examples."""
    pairs = [(emitted_tokens(r), int(r["steps"])) for r in records if r.get("steps")]
    return stats.ratio_ci([e for e, _ in pairs], [s for _, s in pairs])


def summarize(records: list[dict]) -> dict:
    """Aggregate per-example records of one run into the run's summary metrics."""
    if not records:
        return {"examples": 0}
    tokens = sum(r["new_tokens"] for r in records)
    wall = sum(r["wall_time"] for r in records)
    steps = sum(r["steps"] for r in records)
    accepted = sum(sum(r["accepted_per_step"]) for r in records)
    drafted = sum(sum(r["drafted_per_step"]) for r in records)
    fwd = sum(r["target_forward_time"] + r["draft_forward_time"] for r in records)
    out = {
        "examples": len(records),
        "new_tokens": tokens,
        "decode_seconds": wall,
        "tokens_per_s": tokens_per_second(tokens, wall),
        "ms_per_token": 1000 * wall / tokens if tokens else float("nan"),
        "steps": steps,
        "block_efficiency": records_block_efficiency(records),
        "acceptance_rate": acceptance_rate(accepted, drafted),
        "tokens_per_target_pass": tokens_per_target_pass(tokens, sum(r.get("target_passes", 0) for r in records)),
        "per_depth_acceptance": per_depth_acceptance([a for r in records for a in r["accepted_per_step"]]),
        "target_forward_seconds": sum(r["target_forward_time"] for r in records),
        "draft_forward_seconds": sum(r["draft_forward_time"] for r in records),
        "overhead_share": 1 - fwd / wall if wall > 0 else float("nan"),
    }
    out["tokens_per_s_ci"] = tokens_per_s_interval(records)
    out["block_efficiency_ci"] = block_efficiency_interval(records)
    ppl = [r.get("perplexity") for r in records if r.get("perplexity") is not None]
    if ppl:
        # ``perplexity`` (kept for readers of older summaries) and ``perplexity_mean``: the
        # arithmetic mean of per-record perplexities; ``perplexity_geomean``: what tables show
        # (``cell_statistics``: geometric mean over examples, an example's turns pooled)
        out["perplexity"] = out["perplexity_mean"] = float(np.mean(ppl))
        out["perplexity_ci"] = out["perplexity_mean_ci"] = stats.bootstrap_ci(stats.present(ppl))
        logs = stats.present([example_log_perplexity(t) for t in by_example(records).values()])
        out["perplexity_geomean"] = math.exp(float(np.mean(logs))) if logs else float("nan")
        nll = sum(r["nll_sum"] for r in records if r.get("nll_sum") is not None)
        ntok = sum(r["new_tokens"] for r in records if r.get("nll_sum") is not None)
        out["perplexity_pooled"] = math.exp(nll / ntok) if ntok else float("nan")
    energy = [r.get("energy_j") for r in records]
    if records and all(e is not None for e in energy):
        out["joules"] = float(sum(energy))
        out["j_per_token"] = float(sum(energy)) / tokens if tokens else float("nan")
    else:
        out["joules"] = None
        out["j_per_token"] = None
    return out

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
  summary reports the mean of per-example perplexities and the token-weighted
  (pooled) perplexity.
- speedup: tokens/s of a run / tokens/s of the baseline run in the same sweep.
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
        out["perplexity"] = float(np.mean(ppl))
        out["perplexity_ci"] = stats.bootstrap_ci(stats.present(ppl))
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

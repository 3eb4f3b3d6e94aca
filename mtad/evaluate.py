"""The main job: run one decoder on one task with one model pair and record everything.

Writes into the run directory:
- ``samples.jsonl``: one line per (example, turn): ids, text, new tokens, steps,
  accepted per step, wall and forward times, energy, perplexity, score;
- ``summary.json``: resolved config, provenance (git hash, package versions, seed,
  device), model ids and checksums, data source, aggregate metrics.
A rerun on the same directory resumes: finished (example, turn) records are kept
and skipped. Perplexity is computed after each generation, outside the timed window.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from mtad.energy import EnergyMeter
from mtad.engine import Engine
from mtad.metrics import perplexity, summarize, token_logprobs
from mtad.models.pair import load_pair
from mtad.records import append_jsonl, provenance, read_jsonl, write_json_atomic
from mtad.warping import Warping

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config field has a bad value; the message names the field and the fix."""


def check_config(cfg: DictConfig) -> None:
    """Validate the top-level knobs before any model is loaded."""
    def _num(field, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{field} must be a number, got {v!r}")
        return v
    g = cfg.get("gamma")
    if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 1):
        raise ConfigError(f"gamma must be an integer >= 1 (draft tokens per step), got {g!r}; e.g. gamma=4")
    if _num("temperature", cfg.temperature) < 0:
        raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {cfg.temperature}; e.g. temperature=1.0")
    if not (0 < _num("top_p", cfg.top_p) <= 1):
        raise ConfigError(f"top_p must be in (0, 1], got {cfg.top_p}; use top_p=1.0 to disable")
    if isinstance(cfg.top_k, bool) or not isinstance(cfg.top_k, int) or cfg.top_k < 0:
        raise ConfigError(f"top_k must be an integer >= 0 (0 = disabled), got {cfg.top_k!r}")
    t = cfg.get("tau")
    if t is not None and not (_num("tau", t) > 0):
        raise ConfigError(f"tau must be > 0 (MTAD acceptance threshold; .inf allowed), got {t}")
    w = cfg.get("width")
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
        raise ConfigError(f"width must be an integer >= 1 (beam width W), got {w!r}")
    m = cfg.max_new_tokens
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ConfigError(f"max_new_tokens must be an integer >= 1, got {m!r}")


def build(cfg: DictConfig):
    """Instantiate pair, decoder, task, scorer, logger and engine from a composed config."""
    check_config(cfg)
    warping = Warping(float(cfg.temperature), int(cfg.top_k), float(cfg.top_p))
    decoder = instantiate(cfg.decoder)
    task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
    scorer_cfg = task_cfg.pop("scorer", None)
    task = instantiate(task_cfg)
    # a task may build its own scorer (e.g. MT-Bench's optional judge hook)
    scorer = instantiate(scorer_cfg) if scorer_cfg else getattr(task, "scorer", None)
    pair = load_pair(cfg.model)
    engine = Engine(pair.target, pair.draft, decoder, warping, pair.vocab_size, pair.eos_token_ids)
    logger = instantiate(cfg.logger) if cfg.get("logger") else None
    return pair, decoder, task, scorer, engine, logger


def run(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, Any]:
    out_dir = Path(output_dir or cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pair, decoder, task, scorer, engine, logger = build(cfg)
    examples = task.load()
    if cfg.get("limit") is not None:
        examples = examples[: int(cfg.limit)]
    resolved = OmegaConf.to_container(cfg, resolve=True)
    write_json_atomic(out_dir / "config.json", resolved)
    samples_path = out_dir / "samples.jsonl"
    done = {(r["example_id"], r["turn"]): r for r in read_jsonl(samples_path)} if cfg.get("resume", True) else {}
    if done:
        log.info("resuming: %d finished records in %s", len(done), samples_path)
    if logger is not None:
        logger.start(resolved, name=f"{cfg.decoder._target_.rsplit('.', 1)[-1]}-{task.name}")

    tok = pair.tokenizer
    meter = EnergyMeter.for_models(pair.target, pair.draft, default=pair.device)
    if examples and cfg.get("warmup", 0):
        ids = task.render(examples[0], tok, 0, [])
        for _ in range(int(cfg.warmup)):
            engine.generate(ids, min(8, int(cfg.max_new_tokens)), seed=int(cfg.seed))

    bar = tqdm(total=len(examples), desc=f"{decoder.name}/{task.name}", unit="ex", dynamic_ncols=True)
    tokens_so_far, secs_so_far = 0, 0.0
    for index, ex in enumerate(examples):
        previous: list[str] = []
        n_turns = task.num_turns(ex)
        for turn in range(n_turns):
            if (ex.id, turn) in done:
                previous.append(done[(ex.id, turn)]["text"])
                continue
            ids = task.render(ex, tok, turn, previous)
            meter.start()
            res = engine.generate(ids, int(cfg.max_new_tokens), seed=int(cfg.seed) + 1000 * index + turn)
            energy = meter.stop()
            text = tok.decode(res.output_ids, skip_special_tokens=True)
            previous.append(text)
            record: dict[str, Any] = {"example_id": ex.id, "turn": turn, "index": index, **res.to_record(),
                                      "text": text, "energy_j": energy,
                                      "tokens_per_s": res.new_tokens / res.wall_time if res.wall_time else None}
            if cfg.get("perplexity", True):
                lp = token_logprobs(pair.target, ids, res.output_ids, pair.vocab_size)
                record["perplexity"] = perplexity(lp)
                record["nll_sum"] = float(-lp.sum())
            if scorer is not None and turn == n_turns - 1:
                # multi-turn tasks are scored on every answer (a list), single-turn on the text
                record["score"] = scorer.score(ex, list(previous) if n_turns > 1 else text)
            append_jsonl(samples_path, record)
            done[(ex.id, turn)] = record
            if logger is not None:
                logger.log_example(record)
            tokens_so_far += res.new_tokens
            secs_so_far += res.wall_time
        bar.update(1)
        bar.set_postfix(tok_s=f"{tokens_so_far / secs_so_far:.2f}" if secs_so_far else "-")
    bar.close()

    ids_wanted = {ex.id for ex in examples}
    records = [r for r in done.values() if r["example_id"] in ids_wanted]
    summary: dict[str, Any] = {
        "decoder": decoder.name,
        "decoder_config": decoder.config_dict(),
        "lossless": getattr(decoder, "lossless", None),
        "task": task.name,
        "data_source": getattr(task, "source", None),
        "data_substitute": getattr(task, "substitute", False),
        "data_skipped": getattr(task, "skipped", None),
        "model": {"pair": pair.name, "target": pair.target_id, "draft": pair.draft_id, **pair.info},
        "sampling": {"temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p},
        "energy_source": meter.source,
        "energy_unavailable_reason": meter.reason,
        "energy_devices": meter.devices,
        "metrics": summarize(records),
        "config": resolved,
        "provenance": provenance(seed=int(cfg.seed), extra={"torch_threads": torch.get_num_threads()}),
    }
    if scorer is not None:
        scores = [r["score"] for r in records if r.get("score") is not None]
        summary["score"] = scorer.aggregate(scores)
    write_json_atomic(out_dir / "summary.json", summary)
    if logger is not None:
        logger.log_summary({**summary["metrics"], "score": (summary.get("score") or {}).get("value")})
        logger.finish()
    m = summary["metrics"]
    log.info("%s on %s: %d examples, %.3f tokens/s, block efficiency %.3f, perplexity %s -> %s",
             decoder.name, task.name, m.get("examples", 0), m.get("tokens_per_s", math.nan),
             m.get("block_efficiency", math.nan), m.get("perplexity"), out_dir)
    return summary

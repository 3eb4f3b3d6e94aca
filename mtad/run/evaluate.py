"""The main job: run one decoder on one task with one model pair and record everything.

Writes a results folder (``mtad.run.results``; format in docs/results.md): ``point.json`` (the
point's identity), ``config.json`` (resolved config), ``samples.jsonl`` (one line per
(example, turn): ids, text, new tokens, steps, accepted per step, wall and forward times,
energy, perplexity, score with its scorer and version) and ``summary.json`` (provenance,
model ids and checksums, data source, aggregates over the requested examples).

A rerun on the same folder resumes under the folder's lock: the folder must hold the same
point (else it is refused, naming the differing keys), ``samples.jsonl`` is self-checked (a
torn or duplicated line is dropped and recomputed), and only missing (example, turn) records
are generated. Perplexity is computed after each generation, outside the timed window.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mtad.core import allocator
from mtad.core.engine import Engine
from mtad.core.metrics import perplexity, summarize, token_logprobs
from mtad.core.stack import check_versions
from mtad.core.stopping import StopSequences
from mtad.core.warping import Warping
from mtad.models.pair import load_pair
from mtad.run.config import ConfigError, validate  # noqa: F401  (ConfigError: the runner's error type)
from mtad.run.energy import EnergyMeter
from mtad.run.progress import Progress
from mtad.run.provenance import provenance
from mtad.run.results import (
    SAMPLES_FILE,
    SUMMARY_FILE,
    PointFolder,
    identity,
    identity_hash,
    now_utc,
    record_key,
    requested_limit,
    write_json_atomic,
)
from mtad.run.results.described import report_resume
from mtad.run.results.segments import SEGMENT_FIELD, begin_segment, segments_summary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checked:
    """A config that passed the checks and the identity of the point it runs: made once by
    ``check`` and passed down, so neither is done again on the way to the engine."""

    cfg: DictConfig
    identity: dict[str, Any]
    hash: str
    limit: int | None  # examples requested (None: all of the task's)


def check(cfg: DictConfig) -> Checked:
    """Check a composed config (``mtad.run.config.validate``: ConfigError names the first bad
    field) and read the identity of its point."""
    validate(cfg)
    ident = identity(cfg)
    return Checked(cfg, ident, identity_hash(ident), requested_limit(cfg))


def build(cfg: DictConfig):
    """Instantiate pair, decoder, task, scorer, logger and engine from a composed config (checked
    here; ``run`` builds from the config it checked)."""
    validate(cfg)
    return _build(cfg)


def warping_of(cfg: DictConfig) -> Warping:
    """The run's warping: temperature, top_k, top_p and, where given (``+draws=race``), the draw
    scheme (``mtad.core.warping.DRAW_SCHEMES``; unset: the settings' default)."""
    draws = cfg.get("draws")
    return Warping(float(cfg.temperature), int(cfg.top_k), float(cfg.top_p), None if draws is None else str(draws))


def _build(cfg: DictConfig):
    warping = warping_of(cfg)
    decoder = instantiate(cfg.decoder)
    task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
    scorer_cfg = task_cfg.pop("scorer", None)
    task = instantiate(task_cfg)
    # a task may build its own scorer (e.g. MT-Bench's optional judge hook)
    scorer = instantiate(scorer_cfg) if scorer_cfg else getattr(task, "scorer", None)
    check_versions()  # before any model loads: a stack outside the tested range is refused
    pair = load_pair(cfg.model)
    context = getattr(getattr(pair.target, "config", None), "max_position_embeddings", None)
    if isinstance(context, int) and int(cfg.max_new_tokens) >= context:
        raise ConfigError(f"max_new_tokens must be below the context of model pair {pair.name} "
                          f"({context} tokens, prompt included), got {int(cfg.max_new_tokens)}")
    stop_sequences = StopSequences.from_tokenizer(getattr(task, "stop", ()), pair.tokenizer)
    engine = Engine(pair.target, pair.draft, decoder, warping, pair.vocab_size, pair.eos_token_ids,
                    stop_sequences)
    logger = instantiate(cfg.logger) if cfg.get("logger") else None
    return pair, decoder, task, scorer, engine, logger


def run(
    cfg: DictConfig | Checked,
    output_dir: str | Path | None = None,
    overrides: Sequence[str] = (),
    choices: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the point ``cfg`` into ``output_dir`` (default ``cfg.output_dir``).

    ``cfg``: a composed config, checked here, or what ``check`` made of one (a caller that
    claimed the folder itself checks first and passes it down)."""
    allocator.tune()  # every run's process, however launched (mtad.core.allocator): in its provenance
    point = cfg if isinstance(cfg, Checked) else check(cfg)
    folder = PointFolder(output_dir or point.cfg.output_dir)
    with folder.lock(wait=bool(point.cfg.get("wait_lock", False))):
        folder.claim(point.identity, overrides, choices)
        report_resume(folder.path, point.cfg)  # the folder's stored settings never run
        if not point.cfg.get("resume", True) and folder.file(SAMPLES_FILE).exists():
            aside = folder.file(f"samples.replaced-{now_utc().replace(':', '')}.jsonl")
            folder.file(SAMPLES_FILE).rename(aside)
            folder.file(SUMMARY_FILE).unlink(missing_ok=True)
            log.info("resume=false: earlier records set aside as %s", aside.name)
        records = folder.check(repair=True).records
        return _run(point, folder, records)


def _resumable(records: list[dict]) -> dict[tuple[str, int], dict]:
    """Finished records by (example, turn), keeping for each example only its first turns
    without a gap (a later turn is conditioned on the earlier answers)."""
    by_key = {record_key(r): r for r in records}
    out = {}
    for (ex, turn), r in by_key.items():
        if all((ex, t) in by_key for t in range(turn)):
            out[(ex, turn)] = r
    return out


def _scored(scorer, value) -> dict[str, Any]:
    if hasattr(scorer, "record_fields"):
        return dict(scorer.record_fields(value))
    return {"score": value, "scorer": getattr(scorer, "name", None),
            "scorer_version": getattr(scorer, "version", None)}


def _provenance(cfg: DictConfig) -> dict[str, Any]:
    return provenance(seed=int(cfg.seed), extra={"torch_threads": torch.get_num_threads()})


def _run(point: Checked, folder: PointFolder, records: list[dict]) -> dict[str, Any]:
    cfg = point.cfg
    pair, decoder, task, scorer, engine, logger = _build(cfg)
    examples = task.load()
    if cfg.get("limit") is not None:
        examples = examples[: int(cfg.limit)]
    cfg_out = cfg.copy()
    OmegaConf.set_struct(cfg_out, False)
    cfg_out.output_dir = str(folder.path)
    resolved = OmegaConf.to_container(cfg_out, resolve=True)
    write_json_atomic(folder.file("config.json"), resolved)
    samples_path = folder.file(SAMPLES_FILE)
    done = _resumable(records)
    if done:
        log.info("resuming: %d finished records in %s", len(done), samples_path)
    if logger is not None:
        logger.start(resolved, labels={"decoder": decoder.name, "task": task.name, "pair": pair.name})

    tok = pair.tokenizer
    meter = EnergyMeter.for_models(pair.target, pair.draft, default=pair.device)
    todo = [ex for ex in examples if any((ex.id, t) not in done for t in range(task.num_turns(ex)))]
    if todo and cfg.get("warmup", 0):
        ids = task.render(todo[0], tok, 0, [])
        for _ in range(int(cfg.warmup)):
            engine.generate(ids, min(8, int(cfg.max_new_tokens)), seed=int(cfg.seed))

    # this run's records carry its segment: the provenance of the run that made them
    segment = begin_segment(folder, _provenance(cfg)) if todo else None

    bar = Progress(len(examples), f"{decoder.name}/{task.name}", "ex", log)
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
                                      "tokens_per_s": res.new_tokens / res.wall_time if res.wall_time else None,
                                      SEGMENT_FIELD: segment}
            if cfg.get("perplexity", True):
                lp = token_logprobs(pair.target, ids, res.output_ids, pair.vocab_size)
                record["perplexity"] = perplexity(lp)
                record["nll_sum"] = float(-lp.sum())
            if scorer is not None and turn == n_turns - 1:
                # multi-turn tasks are scored on every answer (a list), single-turn on the text
                record.update(_scored(scorer, scorer.score(ex, list(previous) if n_turns > 1 else text)))
            folder.append(record)
            done[(ex.id, turn)] = record
            if logger is not None:
                logger.log_example(record)
            tokens_so_far += res.new_tokens
            secs_so_far += res.wall_time
        bar.update(1, tok_s=f"{tokens_so_far / secs_so_far:.2f}" if secs_so_far else "-")
    bar.close()

    ids_wanted = {ex.id for ex in examples}
    covered = [r for r in done.values() if r["example_id"] in ids_wanted]
    summary: dict[str, Any] = {
        "decoder": decoder.name,
        "decoder_version": getattr(decoder, "version", None),
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
        "metrics": summarize(covered),
        "config": resolved,
        "provenance": _provenance(cfg),
        "segments": segments_summary(folder, covered),
    }
    if scorer is not None:
        scores = [r["score"] for r in covered if r.get("score") is not None]
        summary["score"] = scorer.aggregate(scores)
    folder.write_summary(summary, point.hash, point.limit, len(covered))
    if logger is not None:
        logger.log_summary(summary)
        logger.finish()
    m = summary["metrics"]
    log.info("%s on %s: %d examples, %.3f tokens/s, block efficiency %.3f, perplexity %s -> %s",
             decoder.name, task.name, m.get("examples", 0), m.get("tokens_per_s", math.nan),
             m.get("block_efficiency", math.nan), m.get("perplexity"), folder.path)
    return summary

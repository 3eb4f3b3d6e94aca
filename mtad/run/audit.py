"""``mtad-audit``: does today's code still make a point's records?

``mtad-audit POINT [POINT ...] [--n 5] [--seed S] [--out audit.jsonl] [--table audit.md]``
(``--all [ROOT]``: every committed point folder under ``ROOT``, ``results`` by default)
draws ``n`` records of each point folder at random (``--seed``: the same draw on every run),
regenerates each one with today's code (the point as its folder describes it, rebuilt from
``conf/`` by ``mtad.run.results.described``: nothing the folder names is imported or resolved,
and its host settings are this invocation's, ``--override KEY=VALUE``; the record's seed
``seed + 1000 * index + turn``, a later turn conditioned on the recorded earlier answers, as the
run did) and compares the whole record (``compare_records``): tokens, steps, accepted tokens per
step, the target's NLL and perplexity (``NUMBER_TOLERANCE``) and the score, in that order, and
reports ``identical`` or the first field that differs (``diverged at token k`` for the tokens),
together with the provenance of the segment that made the record (``mtad.run.results.segments``; records written
before segments were kept say so) and the machine the audit ran on.

Results are appended to ``--out`` one line per record as each finishes, and a rerun skips the
records already there: a long audit can be stopped and resumed. ``--table`` (re)writes the
Markdown table from ``--out`` after every record and names the points given that have no
audited record yet. Bit-identical regeneration needs the same float kernels: bfloat16 records
made on another kind of CPU (AVX-512 BF16 / AMX / AVX2 emulation) or GPU may diverge without
any code change; the table prints both machines so a reader can tell.

``--prefix K`` regenerates a record's steps up to its K-th token (``compare_prefix``);
``--stat-table`` compares metrics where bits cannot match (``mtad.run.audit_stats``);
``--bf16-linears float32`` computes the pair's bfloat16 linears in float32 on a CPU that
emulates bfloat16 (``mtad.models.kernels.bf16_linears_in_float32``; rows name it); ``--coverage
FILE.md`` lists every point with the audits that reached it (``mtad.run.audit_coverage``).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from mtad.core.escape import md_cell
from mtad.core.io import (
    append_jsonl,
    read_json,
    read_jsonl,
    refuse_link,
    shown_path,
    write_text_atomic,
)
from mtad.run.results import PointFolder, exit_on_bad_results, identity_hash, record_key
from mtad.run.results.segments import SEGMENT_FIELD, describe_provenance, segment_of

log = logging.getLogger(__name__)


def first_difference(recorded: list[int], now: list[int]) -> int | None:
    """The first token position where the two sequences differ (a shorter one ends there);
    None when they are equal."""
    for k, (a, b) in enumerate(zip(recorded, now)):
        if a != b:
            return k
    return None if len(recorded) == len(now) else min(len(recorded), len(now))


#: The fields an audit compares, in the order a difference is reported: the first one that
#: differs is the record's result. Numbers are compared with ``NUMBER_TOLERANCE``.
COMPARED = ("tokens", "steps", "accepted_per_step", "nll_sum", "perplexity", "score")
#: Relative tolerance for NLL and perplexity: the target pass that computes them is one batched
#: forward, whose float reductions may round differently with another thread count.
NUMBER_TOLERANCE = 1e-6


def _same_number(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(float(a) - float(b)) <= NUMBER_TOLERANCE * max(1.0, abs(float(a)))


def compare_records(recorded: dict, regenerated: dict) -> dict[str, Any]:
    """Field by field (``COMPARED``): ``same``, ``differs``, or ``not compared`` (the record
    holds no such field, or the audit did not compute it); ``first_field``: the first that
    differs (None when none does); ``diverged_at``: the first token that differs."""
    fields: dict[str, str] = {}
    k = first_difference(list(recorded["output_ids"]), list(regenerated["output_ids"]))
    fields["tokens"] = "same" if k is None else "differs"
    for name in ("steps", "accepted_per_step"):
        fields[name] = "same" if recorded.get(name) == regenerated.get(name) else "differs"
    for name in ("nll_sum", "perplexity", "score"):
        if name not in recorded or name not in regenerated:
            fields[name] = "not compared"
        elif name == "score":
            fields[name] = "same" if recorded[name] == regenerated[name] or _same_number(
                recorded[name], regenerated[name]) else "differs"
        else:
            fields[name] = "same" if _same_number(recorded[name], regenerated[name]) else "differs"
    first = next((f for f in COMPARED if fields[f] == "differs"), None)
    return {"fields": fields, "first_field": first, "diverged_at": k}


def compare_prefix(recorded: dict, regenerated: dict, nll_sum: float | None, score: Any) -> dict[str, Any]:
    """``compare_records`` for a regeneration stopped after its first steps (``--prefix``, the
    engine's ``stop_after``: the steps it ran are the full run's, drafts unshortened): tokens and
    accepted tokens per step over the steps it ran (``compared_tokens``, ``compared_steps``); the
    step count is not compared; NLL and perplexity of the *committed* tokens under today's target
    (``nll_sum``, one teacher-forced pass) and the score of the committed text today (``score``)."""
    n_tok, n_steps = len(regenerated["output_ids"]), int(regenerated["steps"])
    rec_tokens = list(recorded["output_ids"])
    k = first_difference(rec_tokens[:n_tok], list(regenerated["output_ids"]))
    fields: dict[str, str] = {"tokens": "same" if k is None else "differs", "steps": "not compared"}
    fields["accepted_per_step"] = ("same" if list(recorded.get("accepted_per_step") or [])[:n_steps]
                                   == list(regenerated.get("accepted_per_step") or []) else "differs")
    redone = {"nll_sum": nll_sum, "score": score}
    if nll_sum is not None and rec_tokens:
        import math
        redone["perplexity"] = math.exp(nll_sum / len(rec_tokens))
    for name in ("nll_sum", "perplexity", "score"):
        if name not in recorded or redone.get(name) is None:
            fields[name] = "not compared"
        elif name == "score":
            fields[name] = "same" if recorded[name] == redone[name] or _same_number(recorded[name], redone[name]) else "differs"
        else:
            fields[name] = "same" if _same_number(recorded[name], redone[name]) else "differs"
    first = next((f for f in COMPARED if fields[f] == "differs"), None)
    rel = None
    if nll_sum is not None and recorded.get("nll_sum"):
        rel = abs(nll_sum - float(recorded["nll_sum"])) / max(1.0, abs(float(recorded["nll_sum"])))
    return {"fields": fields, "first_field": first, "diverged_at": k, "compared_tokens": n_tok,
            "compared_steps": n_steps, "nll_relative_difference": rel}


def agrees(row: dict) -> bool:
    """Whether an audit row found its record identical (over a prefix: through it)."""
    return row.get("result") == "identical" or str(row.get("result", "")).startswith("identical through")


def result_line(compared: dict[str, Any]) -> str:
    """``identical``, ``diverged at token k``, or ``FIELD differs`` (tokens the same)."""
    first = compared["first_field"]
    if first is None:
        if compared.get("compared_tokens") is not None:
            return f"identical through token {compared['compared_tokens']}"
        return "identical"
    if first == "tokens":
        return f"diverged at token {compared['diverged_at']}"
    return f"{first} differs"


#: The per-record metrics an audit row keeps of both records (``metrics``), for the statistical
#: audit (``mtad.run.audit_stats``): what the tables aggregate per example.
METRICS = ("new_tokens", "steps", "nll_sum", "perplexity", "score")


def record_metrics(record: dict) -> dict[str, Any]:
    """``METRICS`` of a record (None where it holds no such field)."""
    return {k: record.get(k) for k in METRICS}


def sample_records(records: list[dict], n: int, seed: int, point: str) -> list[dict]:
    """``n`` records drawn without replacement, the same for the same (seed, point)."""
    rng = random.Random(f"{seed}:{point}")
    keyed = sorted(records, key=lambda r: (int(r["index"]), int(r["turn"])))
    picked = rng.sample(keyed, min(n, len(keyed)))
    return sorted(picked, key=lambda r: (int(r["index"]), int(r["turn"])))


def this_machine() -> dict[str, Any]:
    from mtad.run.provenance import device_info, git_info
    return {"git": git_info(), "device": device_info()}


class _Builder:
    """``mtad.run.evaluate.build`` with the model pair loaded once per model config."""

    def __init__(self, bf16_linears: str = "bfloat16"):
        self._pairs: dict[str, Any] = {}
        #: "float32": the pair's bfloat16 linears computed in float32 (``--bf16-linears``)
        self.bf16_linears = bf16_linears

    def build(self, cfg):
        from hydra.utils import instantiate
        from omegaconf import OmegaConf

        from mtad.core.engine import Engine
        from mtad.core.stopping import StopSequences
        from mtad.models.pair import load_pair
        from mtad.run.config import validate
        from mtad.run.evaluate import warping_of

        validate(cfg)
        key = json.dumps(OmegaConf.to_container(cfg.model, resolve=True), sort_keys=True)
        if key not in self._pairs:
            self._pairs.clear()  # one pair in memory at a time
            self._pairs[key] = load_pair(cfg.model)
            if self.bf16_linears == "float32":
                from mtad.models.kernels import bf16_linears_in_float32

                for model in (self._pairs[key].target, self._pairs[key].draft):
                    bf16_linears_in_float32(model)
        pair = self._pairs[key]
        task_cfg = OmegaConf.to_container(cfg.task, resolve=True)
        task_cfg.pop("scorer", None)
        task = instantiate(task_cfg)
        warping = warping_of(cfg)
        stop = StopSequences.from_tokenizer(getattr(task, "stop", ()), pair.tokenizer)
        engine = Engine(pair.target, pair.draft, instantiate(cfg.decoder), warping, pair.vocab_size,
                        pair.eos_token_ids, stop)
        return pair, task, engine


def _scorer(cfg, task):
    """The point's scorer (its stored ``task.scorer``, else the task's own), or None."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    scorer_cfg = OmegaConf.to_container(cfg.task, resolve=True).get("scorer")
    return instantiate(scorer_cfg) if scorer_cfg else getattr(task, "scorer", None)


def regenerated_record(pair, task, scorer, ex, ids, res, recorded: dict, turn: int, previous: list[str]) -> dict:
    """The fields ``compare_records`` compares, as the run computes them (``mtad.run.evaluate``):
    the engine's, the target's NLL and perplexity when the record holds them, the score when
    the record holds one."""
    from mtad.core.metrics import perplexity, token_logprobs

    now: dict[str, Any] = dict(res.to_record())
    if "perplexity" in recorded or "nll_sum" in recorded:
        lp = token_logprobs(pair.target, ids, res.output_ids, pair.vocab_size)
        now["perplexity"], now["nll_sum"] = perplexity(lp), float(-lp.sum())
    if "score" in recorded and scorer is not None:
        text = pair.tokenizer.decode(res.output_ids, skip_special_tokens=True)
        n_turns = task.num_turns(ex)
        value = scorer.score(ex, [*previous, text] if n_turns > 1 else text)
        fields = dict(scorer.record_fields(value)) if hasattr(scorer, "record_fields") else {"score": value}
        now["score"] = fields.get("score")
    return now


def committed_nll_and_score(pair, task, scorer, ex, ids, recorded: dict, previous: list[str],
                            max_new: int) -> tuple[float | None, Any]:
    """The NLL of the committed tokens under today's target (the run's own computation,
    ``regenerated_record``) and the score of the committed text today: None where the record
    holds no such field."""
    from mtad.core.metrics import token_logprobs

    nll = None
    if len(recorded["output_ids"]) > max_new:  # no teacher-forced pass over a forged, longer record
        raise ValueError(f"the record holds {len(recorded['output_ids'])} tokens, more than its point's "
                         f"max_new_tokens ({max_new}) allows")
    if "nll_sum" in recorded or "perplexity" in recorded:
        nll = float(-token_logprobs(pair.target, ids, recorded["output_ids"], pair.vocab_size).sum())
    score = None
    if "score" in recorded and scorer is not None:
        text = recorded["text"]
        value = scorer.score(ex, [*previous, text] if task.num_turns(ex) > 1 else text)
        fields = dict(scorer.record_fields(value)) if hasattr(scorer, "record_fields") else {"score": value}
        score = fields.get("score")
    return nll, score


def audit_point(folder: Path, n: int, seed: int, builder: _Builder, done: set, out: Path | None,
                machine: dict, indices: set[int] | None = None, overrides: list[str] | tuple = (),
                prefix: int | None = None) -> list[dict]:
    """Audit ``n`` sampled records of ``folder`` (those not in ``done``); append each row to
    ``out`` as it finishes; return the rows. ``indices``: these examples' records instead of a
    random draw. ``overrides``: this machine's settings (``key=value``), never the folder's."""
    from mtad.run.results.described import describe, rebuild, report

    pf = PointFolder(folder)
    stored, _ = pf.stored()
    if stored is None:
        raise SystemExit(f"mtad-audit: {folder} is not a point folder (no point.json or config.json)")
    h = identity_hash(stored)
    records = pf.check().records
    by_key = {record_key(r): r for r in records}
    chosen = ([r for r in records if int(r["index"]) in indices] if indices
              else sample_records(records, n, seed, h))
    picked = [r for r in chosen if (str(folder), int(r["index"]), int(r["turn"])) not in done]
    if not picked:
        return []
    rebuilt = rebuild(describe(folder), overrides)  # conf/ by name; refused in one line otherwise
    report(rebuilt, shown_path(folder))
    cfg = rebuilt.cfg
    summary = read_json(pf.file("summary.json")) or {}
    last_run = describe_provenance(summary.get("provenance"))
    pair, task, engine = builder.build(cfg)
    examples = task.load()
    import torch

    # the thread count of the run that made the records, at most this machine's CPUs
    # (described.recorded_threads); the last run's when the records predate segments
    from mtad.run.results.described import recorded_threads as threads_of

    use_threads = threads_of(summary, shown_path(folder))
    if use_threads is not None:
        torch.set_num_threads(use_threads)
    prov = summary.get("provenance") if isinstance(summary.get("provenance"), dict) else {}
    recorded_threads = prov.get("torch_threads") if isinstance(prov.get("torch_threads"), int) else None
    rows = []
    for r in picked:
        index, turn = int(r["index"]), int(r["turn"])
        row: dict[str, Any] = {
            "point": shown_path(folder), "identity_hash": h, "decoder": summary.get("decoder") or cfg.decoder._target_.split(".")[-1],
            "task": summary.get("task") or cfg.task.get("name"), "index": index, "turn": turn,
            "example_id": r["example_id"], "seed": seed,
            "made_by": describe_provenance(segment_of(pf, r)), "point_last_run": last_run,
            "segment": r.get(SEGMENT_FIELD),
            "audited_on": describe_provenance(machine),
            "threads": torch.get_num_threads(), "recorded_threads": recorded_threads,
        }
        t0 = time.perf_counter()
        try:
            ex = examples[index]
            if ex.id != r["example_id"]:
                raise ValueError(f"example {index} is {ex.id} today, the record says {r['example_id']}")
            previous = [by_key[(ex.id, t)]["text"] for t in range(turn)]
            ids = task.render(ex, pair.tokenizer, turn, previous)
            res = engine.generate(ids, int(cfg.max_new_tokens), seed=int(cfg.seed) + 1000 * index + turn,
                                  stop_after=prefix)
            if prefix is not None and res.stop_reason == "stop_after":
                compared = compare_prefix(r, res.to_record(), *committed_nll_and_score(
                    pair, task, _scorer(cfg, task), ex, ids, r, previous, int(cfg.max_new_tokens)))
                now = None
            else:
                now = regenerated_record(pair, task, _scorer(cfg, task), ex, ids, res, r, turn, previous)
                compared = compare_records(r, now)
            row.update(result=result_line(compared), **compared, recorded_tokens=len(r["output_ids"]),
                       regenerated_tokens=len(res.output_ids),
                       **({"metrics": {"recorded": record_metrics(r), "regenerated": record_metrics(now)}}
                          if now is not None else {"prefix": prefix}))
        except Exception as e:  # noqa: BLE001  (a record that cannot be regenerated is a finding)
            row.update(result=f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200],
                       diverged_at=None)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        if out is not None:
            append_jsonl(out, row)
        log.info("%s %s/%s #%d turn %d: %s (%.0f s)", shown_path(folder), row["decoder"], row["task"],
                 index, turn, row["result"], row["seconds"])
        rows.append(row)
    return rows


def _kind(described: str) -> str:
    """The machine part of ``describe_provenance``'s line (after "on ", before the torch version)."""
    return described.split(" on ", 1)[-1].split(", torch")[0]


#: Commits that changed what decoders draw for a seed without changing the points' identities
#: (no decoder ``version`` bumped), oldest first: the records a point holds from before such a
#: commit are not what today's code makes of that point. Found in the history: b32eec4 moved
#: sampling and verification onto the distributions' supports (``git show b32eec4``): a vector
#: longer than ``DENSE_MAX`` (every vocabulary row of the offline pair, top-k 10 or not) is drawn
#: over its nonzero entries, another random stream. ``bench/regen_at_commit.py`` shows it
#: (``results/audit/code/``): the code that made a tree-MTAD/Spider point regenerates its records
#: bit for bit on this machine, today's diverges; bisected, 14f95e2 keeps them, b32eec4 does not.
#: From 308b998 on, ``tests/decoders/test_draw_fingerprints.py``
#: refuses a change of a decoder's draws that bumps no version, and its fingerprints have only
#: been extended since (0d9b98c, 0f7b0b0: new decoders and cases). Decoder version bumps (BiLD's
#: 206271d) change the identity instead: records of the old version are another point.
DRAW_CHANGES = (("b32eec4", "draws on the distributions' supports; no decoder version bumped"),)


@functools.lru_cache(maxsize=4096)
def _is_ancestor(older: str, commit: str) -> bool | None:
    """Whether ``older`` is ``commit`` or one of its ancestors (None: not in this history)."""
    import subprocess

    from mtad.core.io import REPO_ROOT, git, is_commit_name

    if not (is_commit_name(older) and is_commit_name(commit)):  # stored values: hashes only, never options
        return None
    try:
        out = git(REPO_ROOT, "merge-base", "--is-ancestor", older, commit, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(out.returncode)


def record_origin(point: str, index: int, turn: int, cache: dict) -> dict | None:
    """The segment (recorded or derived) of the committed record (index, turn) of ``point``."""
    from mtad.run.results.segments import segments

    if point not in cache:
        pf = PointFolder(Path(point))
        known = segments(pf) if pf.file("samples.jsonl").exists() else {}
        recs = read_jsonl(pf.file("samples.jsonl")) if pf.file("samples.jsonl").exists() else []
        cache[point] = {(int(r["index"]), int(r["turn"])): known.get(str(r.get(SEGMENT_FIELD))) for r in recs}
    return cache[point].get((int(index), int(turn)))


def code_group(seg: dict | None, change: str) -> str:
    """Whether the code that made a record included ``change``: by the commit its run was on
    (the segment's ``git.commit``), else by the commit that added it (before the change: made
    before it); a dirty tree is said, as it may hold uncommitted code either way."""
    git = (seg or {}).get("git")
    commit = git.get("commit") if isinstance(git, dict) else None
    dirty = " (dirty tree)" if isinstance(git, dict) and git.get("dirty") else ""
    if commit:
        inside = _is_ancestor(change, commit)
        if inside is None:
            return "commit not in this history"
        return (f"run on a commit after {change}" if inside else f"run on a commit before {change}") + dirty
    added = ((seg or {}).get("derived") or {}).get("added_in")
    if added and added != "unknown" and _is_ancestor(change, added) is False:
        return f"added before {change} (run's commit not recorded)"
    return "run's commit not recorded"


def made_before_a_draw_change(seg: dict | None) -> bool:
    """Whether the code that made a record is from before some commit of ``DRAW_CHANGES`` (by
    ``code_group``: its run's commit, else the commit that added it)."""
    return any(code_group(seg, change).startswith(("run on a commit before", "added before"))
               for change, _ in DRAW_CHANGES)


def machine_group(seg: dict | None, audited_on: str) -> str:
    """The record's machine against the audit's: same kind, another kind, or not recorded."""
    from mtad.run.results.segments import machine

    made = machine(seg)
    if made == "machine not recorded":
        return "machine not recorded"
    return "same machine kind as the audit" if made == _kind(audited_on) else f"another machine kind ({made})"


def grouping(rows: list[dict]) -> list[str]:
    """Markdown: audited records grouped by what made them (the code, against each commit of
    ``DRAW_CHANGES``, and the machine kind against the audit's), with how many are identical and
    which field differs first in the others."""
    cache: dict = {}
    out = []
    for change, what in DRAW_CHANGES:
        groups: dict[tuple[str, str], list[dict]] = {}
        for r in rows:
            seg = record_origin(r["point"], r["index"], r["turn"], cache)
            groups.setdefault((code_group(seg, change), machine_group(seg, r["audited_on"])), []).append(r)
        out += [f"By what made the records: the code against `{change}` ({what}), by the commit of the "
                "record's segment (derived segments: the run's commit the summary of the time recorded), "
                "and the machine kind against the audit's.", "",
                "| code | machine | audited | identical | first differing field |", "|:--|:--|--:|--:|:--|"]
        for (code, mach), rs in sorted(groups.items()):
            firsts: dict[str, int] = {}
            for r in rs:
                if not agrees(r):
                    key = r.get("first_field") or ("tokens" if r.get("diverged_at") is not None else "error")
                    firsts[key] = firsts.get(key, 0) + 1
            shown = ", ".join(f"{k} {v}" for k, v in sorted(firsts.items())) or "–"
            out.append(f"| {code} | {mach} | {len(rs)} | {sum(agrees(r) for r in rs)} | {shown} |")
        out.append("")
    return out


def field_counts(rows: list[dict]) -> list[str]:
    """Markdown: per compared field, how many audited records have it the same / different / not
    compared (rows of token-only audits count under tokens alone)."""
    counts = {f: {"same": 0, "differs": 0, "not compared": 0} for f in COMPARED}
    for r in rows:
        fields = r.get("fields")
        if fields is None:  # a token-only row
            fields = {f: "not compared" for f in COMPARED}
            if agrees(r) or r.get("diverged_at") is not None:
                fields["tokens"] = "same" if agrees(r) else "differs"
        for f in COMPARED:
            counts[f][fields.get(f, "not compared")] += 1
    lines = ["Per field (the first differing one decides a record's result; NLL and perplexity within a "
             f"relative {NUMBER_TOLERANCE:g}):", "", "| field | same | differs | not compared |", "|:--|--:|--:|--:|"]
    lines += [f"| {f} | {c['same']} | {c['differs']} | {c['not compared']} |" for f, c in counts.items()]
    return lines + [""]


def render_table(rows: list[dict], points: list[str] | None = None, command: str | None = None,
                 notes: str | None = None) -> str:
    """The Markdown table of audited records, grouped by point, and the points not audited;
    every value from the records and folders escaped for Markdown (``mtad.core.escape.md_cell``)."""
    lines = ["# Audit: committed records regenerated with today's code", ""]
    if command:
        lines += [f"Made by `{command}` (`mtad.run.audit`).", ""]
    lines += [
        "Each row regenerates one randomly drawn record of a point (its stored config, its seed, "
        "earlier turns as recorded) and compares the record: tokens, steps, accepted tokens per step, "
        "NLL and perplexity, score, in that order (rows audited before whole records were compared "
        "compared the tokens only: their *fields* say `tokens`). The result is `identical`, "
        "`diverged at token k` (the first position that differs, 0-based), or the first other field "
        "that differs. *made by* is the provenance of the record's segment (commit, dirty flag, "
        "machine; `derived:` when derived from the repository's history, `docs/results.md`) and "
        "*point's last run* gives the summary's provenance (the last run that touched the point). "
        "Bit-identical regeneration of bfloat16 records needs the same float kernels: a divergence "
        "on another kind of machine is not by itself a code change. Rows audited over a prefix "
        "(`--prefix K`, `compare_prefix`) regenerate the run's steps up to its K-th token, drafts "
        "unshortened, and compare tokens and accepted tokens per step over those steps (`identical "
        "through token T`); their NLL and perplexity are those of the committed tokens under today's "
        "target (one pass; the relative difference is shown when not zero) and their score that of the "
        "committed text today, so those fields are compared whole; the step count is not compared.",
        "",
    ]
    machines = sorted({r["audited_on"] for r in rows})
    if machines:
        lines += ["Audited on: " + "; ".join(f"`{md_cell(m)}`" for m in machines), ""]
    by_point: dict[str, list[dict]] = {}
    for r in rows:
        by_point.setdefault(r["point"], []).append(r)
    lines += ["*threads*: torch threads of the audit / of the point's last run (rows without the "
              "first were audited at torch's default on this 2-core machine, 2).", "",
              "| point | decoder | task | record (index/turn) | result | fields | threads | made by | point's last run |",
              "|:--|:--|:--|:--|:--|:--|:--|:--|:--|"]
    origins: dict = {}
    for point in sorted(by_point):
        for r in sorted(by_point[point], key=lambda r: (r["index"], r["turn"])):
            threads = f"{r.get('threads', '2?')} / {r.get('recorded_threads') or '?'}"
            made_by = describe_provenance(record_origin(point, r["index"], r["turn"], origins))
            compared = ", ".join(f for f, v in (r.get("fields") or {"tokens": "same"}).items() if v != "not compared")
            result = r["result"] + (f" (NLL relative difference {r['nll_relative_difference']:.1e})"
                                    if r.get("nll_relative_difference") else "")
            cells = [f"`{point}`", r["decoder"], r["task"], f"{r['index']}/{r['turn']}", result,
                     compared, threads, made_by, r["point_last_run"]]
            lines.append("| " + " | ".join(map(md_cell, cells)) + " |")
    lines.append("")
    if by_point:
        lines += ["", "Per point: the point's last run (commit, machine) and whether that machine is the "
                  "audit's kind (same CPU model, bf16 kind and torch kernel level).", "",
                  "| point | audited | identical | first divergence | point's last run | same machine kind |",
                  "|:--|--:|--:|:--|:--|:--|"]
        for point in sorted(by_point):
            rs = by_point[point]
            ks = [r["diverged_at"] for r in rs if r.get("diverged_at") is not None]
            same = {_kind(r["point_last_run"]) == _kind(r["audited_on"]) for r in rs}
            lines.append(f"| `{md_cell(point)}` | {len(rs)} | {sum(agrees(r) for r in rs)} | "
                         f"{('token ' + str(min(ks))) if ks else '–'} | {md_cell(rs[0]['point_last_run'])} | "
                         f"{'unknown' if 'machine not recorded' in rs[0]['point_last_run'] else ('yes' if same == {True} else 'no')} |")
        lines.append("")
    identical = sum(1 for r in rows if agrees(r))
    prefixed = sum(1 for r in rows if r.get("compared_tokens") is not None)
    lines.append(f"{identical} of {len(rows)} audited records identical, over {len(by_point)} points"
                 + (f" ({prefixed} records audited over a prefix, {sum(1 for r in rows if r.get('compared_tokens') is not None and agrees(r))} "
                    "of them identical through it)." if prefixed else "."))
    if rows:
        lines += ["", *field_counts(rows), *grouping(rows)]
    not_repro = sorted(p for p, rs in by_point.items() if any(not agrees(r) for r in rs))
    if not_repro:
        lines += ["", "Points with a record not reproduced: " + ", ".join(f"`{md_cell(p)}`" for p in not_repro) + "."]
    if points is not None:
        missing = [p for p in points if p not in by_point]
        if missing:
            lines += ["", f"Not audited yet ({len(missing)} of {len(points)} points): "
                      + ", ".join(f"`{md_cell(p)}`" for p in missing) + "."]
    if notes:
        lines += ["", "## About this audit", "", notes.strip()]
    return "\n".join(lines) + "\n"


def staged_records(folder: Path, staging: Path = Path("reruns")) -> int:
    """How many of ``folder``'s (example, turn) records a rerun has staged (``mtad.run.rerun``)."""
    from mtad.run.rerun import staging_of

    stage = staging_of(folder, staging) / "samples.jsonl"
    if not stage.is_file():
        return 0
    want = {record_key(r) for r in read_jsonl(folder / "samples.jsonl")}
    return len(want & {record_key(r) for r in read_jsonl(stage)})


def made_before_draw_changes(folders: list[Path], staging: Path = Path("reruns")) -> list[str]:
    """Markdown: for every point folder, how many of its records were made before each commit of
    ``DRAW_CHANGES`` (by their segments, ``code_group``) and how many by runs whose commit
    nothing recorded: the points to regenerate with today's code so that every record of a
    point comes from one stream."""
    cache: dict = {}
    lines = []
    for change, what in DRAW_CHANGES:
        lines += [f"Records made before `{change}` ({what}), by point: *before* counts records whose "
                  "segment's run was on a commit before it, or that were added to the repository "
                  "before it; *not recorded*, records whose run's commit nothing recorded (added after "
                  "it: made before or after).", "",
                  "*rerun staged*: records of the point rerun by today's code so far (`mtad-rerun`, "
                  "`reruns/<point>/`; swapped in when all are).", "",
                  "| point | records | before | not recorded | rerun staged |", "|:--|--:|--:|--:|--:|"]
        totals = [0, 0, 0, 0]
        for f in folders:
            point = shown_path(f)
            record_origin(point, 0, 0, cache)
            groups = [code_group(seg, change) for seg in cache[point].values()]
            before = sum(g.startswith(("run on a commit before", "added before")) for g in groups)
            unknown = sum(g == "run's commit not recorded" for g in groups)
            if before or unknown:
                staged = staged_records(f, staging)
                lines.append(f"| `{point}` | {len(groups)} | {before} | {unknown} | {staged} |")
                totals = [totals[0] + 1, totals[1] + len(groups), totals[2] + before, totals[3] + unknown]
        lines += ["", f"{totals[0]} of {len(folders)} points hold such records: {totals[2]} records made "
                  f"before `{change}`, {totals[3]} whose run's commit is not recorded, of {totals[1]} records "
                  "in those points.", ""]
    return lines


def committed_points(root: Path) -> list[Path]:
    """Every point folder (one holding ``samples.jsonl``) under ``root`` that git does not ignore
    (``mtad.core.io.not_git_ignored``: a local run's own output under ``results/runs/`` is not a
    committed point), sorted. A linked folder under ``root`` is never entered, and refused
    (UnsafeResultsFile naming it) rather than passed over: a point there would otherwise go
    unaudited without a word."""
    from mtad.core.io import not_git_ignored

    found = []
    for here, dirs, files in os.walk(root):  # (followlinks=False: a link to a folder is listed, not entered)
        for d in dirs:
            refuse_link(Path(here, d))
        if "samples.jsonl" in files:
            found.append(Path(here, "samples.jsonl"))
    return sorted(p.parent for p in not_git_ignored(found))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mtad-audit", description=__doc__.split("\n\n")[0])
    p.add_argument("points", nargs="*", metavar="POINT", help="point folders (holding point.json and samples.jsonl)")
    p.add_argument("--all", nargs="?", const="results", default=None, metavar="ROOT",
                   help="every point folder under ROOT (default results) that git does not ignore, after the POINTs given")
    p.add_argument("--n", type=int, default=5, help="records drawn per point (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    p.add_argument("--out", type=Path, default=None, help="JSON lines of audited records (appended; resumes)")
    p.add_argument("--table", type=Path, default=None, help="Markdown table rewritten after every record")
    p.add_argument("--render-only", action="store_true", help="only (re)write --table from --out")
    p.add_argument("--made-before", type=Path, default=None, metavar="FILE.md",
                   help="write which points hold records made before a draw change (DRAW_CHANGES), then stop")
    p.add_argument("--records", default=None, metavar="I,J,...",
                   help="audit these example indices (every turn) instead of a random draw of --n")
    p.add_argument("--notes", type=Path, default=None, help="Markdown appended to --table (About this audit)")
    p.add_argument("--prefix", type=int, default=None, metavar="K",
                   help="regenerate each record's steps up to its K-th token only (compare_prefix): tokens "
                        "and accepted per step over those steps, NLL/perplexity of the committed tokens "
                        "and the committed text's score recomputed whole")
    p.add_argument("--stat-table", type=Path, default=None, metavar="FILE.md",
                   help="also (re)write the statistical audit of the POINTs (mtad.run.audit_stats) from --out")
    p.add_argument("--coverage", type=Path, default=None, metavar="FILE.md",
                   help="write which of the POINTs (or --all) the audits in --audits cover, and how "
                        "(mtad.run.audit_coverage), then stop")
    p.add_argument("--audits", type=Path, default=Path("results/audit"), metavar="DIR",
                   help="--coverage: the folder of audit files (*.jsonl) read (default results/audit)")
    p.add_argument("--bf16-linears", choices=("bfloat16", "float32"), default="bfloat16",
                   help="float32: compute the pair's bfloat16 linears in float32 (exact products, float32 "
                        "accumulation, one rounding to bfloat16; mtad.models.kernels.bf16_linears_in_float32), "
                        "several times faster on a CPU that emulates bfloat16; rows name it in audited_on")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="this machine's setting (e.g. task.data_dir=DIR), repeatable; never taken from a folder")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.prefix is not None and args.prefix < 1:
        print(f"mtad-audit: --prefix must be at least 1 token, not {args.prefix}", file=sys.stderr)
        return 2
    if args.n < 1:
        print(f"mtad-audit: --n must be at least 1, not {args.n}", file=sys.stderr)
        return 2
    try:
        indices = {int(x) for x in args.records.split(",")} if args.records else None
    except ValueError:
        print(f"mtad-audit: --records takes example indices like 3,17, not {args.records!r}", file=sys.stderr)
        return 2
    folders = [Path(x) for x in args.points]
    if args.all is not None:
        if not Path(args.all).is_dir():
            print(f"mtad-audit: --all {args.all}: no such folder; give the results folder", file=sys.stderr)
            return 2
        folders += [f for f in committed_points(Path(args.all)) if f not in folders]
    if not folders:
        print("mtad-audit: give point folders, or --all for every point under results/", file=sys.stderr)
        return 2
    for f in folders:
        PointFolder(f).check_entries()  # a link, FIFO or the like in its place: refused first, by name
        if not (f / "samples.jsonl").exists():
            print(f"mtad-audit: {f} holds no samples.jsonl; give point folders", file=sys.stderr)
            return 2
    shown = [shown_path(f) for f in folders]
    rows = read_jsonl(args.out) if args.out is not None and args.out.exists() else []
    command = "mtad-audit " + " ".join(
        ([f"--records {args.records}"] if args.records else [f"--n {args.n}"]) + [f"--seed {args.seed}"]
        + ([f"--prefix {args.prefix}"] if args.prefix else [])
        + ([f"--bf16-linears {args.bf16_linears}"] if args.bf16_linears != "bfloat16" else [])
        + ([f"--out {shown_path(args.out)}"] if args.out else [])
        + ([f"POINT x{len(args.points)}"] if args.points else []) + ([f"--all {args.all}"] if args.all else []))

    def write_table():
        if args.stat_table is not None:
            from mtad.run import audit_stats

            totals = {shown_path(f): len({r["example_id"] for r in read_jsonl(f / "samples.jsonl")}) for f in folders}
            args.stat_table.parent.mkdir(parents=True, exist_ok=True)
            notes = args.notes.read_text() if args.notes is not None and args.notes.exists() else None
            from mtad.run.audit_coverage import replaced

            cache: dict = {}
            gone = {r["point"] for r in rows if replaced(r, Path("."), cache)}
            write_text_atomic(args.stat_table, audit_stats.render(rows, shown, totals, command, notes, gone))
        if args.table is not None:
            args.table.parent.mkdir(parents=True, exist_ok=True)
            notes = args.notes.read_text() if args.notes is not None and args.notes.exists() else None
            write_text_atomic(args.table, render_table([r for r in rows if r["point"] in shown], shown, command, notes))

    if args.coverage is not None:
        from mtad.run import audit_coverage

        if not args.audits.is_dir():
            print(f"mtad-audit: --audits {args.audits}: no such folder", file=sys.stderr)
            return 2
        args.coverage.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.coverage, audit_coverage.render(
            folders, args.audits, f"mtad-audit{' --all ' + args.all if args.all else ''}"
            f"{' POINT x' + str(len(args.points)) if args.points else ''} --audits {shown_path(args.audits)} "
            f"--coverage {shown_path(args.coverage)}"))
        return 0
    if args.made_before is not None:
        args.made_before.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.made_before, "\n".join([
            "# Points to regenerate: records made before a change of draws", "",
            f"Made by `mtad-audit {' '.join(args.points) if len(args.points) < 4 else f'POINT x{len(args.points)}'}"
            f"{' --all ' + args.all if args.all else ''} --made-before {shown_path(args.made_before)}` "
            "from the records' segments (`docs/results.md`).", "",
            *made_before_draw_changes(folders)]))
        return 0
    if args.render_only:
        write_table()
        return 0
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    done = {(str(Path(r["point"])), r["index"], r["turn"]) for r in rows if r.get("seed") == args.seed}
    done |= {(str(f), i, t) for f in folders for (pt, i, t) in list(done) if pt == shown_path(f)}
    builder, machine = _Builder(args.bf16_linears), this_machine()
    if args.bf16_linears == "float32":  # another kernel: rows say so, and never count as this machine's kind
        from mtad.models.kernels import BF16_IN_FLOAT32

        machine = {**machine, "device": {**(machine.get("device") or {}), "kernel_note": BF16_IN_FLOAT32}}
    from mtad.run.config import ConfigError
    from mtad.run.results.described import describe, rebuild

    for f in folders:  # every folder checked before the first regeneration
        try:
            rebuild(describe(f), args.override)
        except ConfigError as e:  # today's config cannot rebuild the point. A results file that cannot
            # be used (BadResultsFile) or a stored config naming code (UntrustedConfig) is not caught
            # here: it reaches exit_on_bad_results around main, one line and exit 2, as every reader's
            print(f"error: {e}", file=sys.stderr)
            return 2
    for f in folders:
        for row in audit_point(f, args.n, args.seed, builder, done, args.out, machine, indices, args.override,
                               args.prefix):
            rows.append(row)
            if args.out is None:
                print(json.dumps(row))
            write_table()
    write_table()
    return 0


def cli() -> None:
    from mtad.core import allocator

    allocator.tune()  # as the audited run's own entry point did (mtad.core.allocator)
    exit_on_bad_results(main)


if __name__ == "__main__":
    cli()

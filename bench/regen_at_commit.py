"""Regenerate committed records with the code of another commit, on this machine.

    python bench/regen_at_commit.py --point results/claims/claims/73ed108fddbb --records 14,15 \\
        --commits 7d2faf40,HEAD --out results/audit/code/tree_spider.jsonl

For each commit, a detached worktree is made under a temporary folder and this script runs again
inside it (``--child``), importing *that* commit's ``mtad`` (the layouts of ``mtad.evaluate`` and
``mtad.run.evaluate`` both work) with this checkout's interpreter and packages. It composes the
commit's own ``conf/`` with the point's ``overrides`` and model choice (``point.json``),
regenerates each record's example with the record's seed (``seed + 1000 * index``, turn 0) up to
``--max-new`` tokens (default: the point's ``max_new_tokens``), and appends one JSON line per
(commit, record): the tokens, steps, accepted tokens per step, and the first token where they
differ from the committed record (``null``: identical over the regenerated length). A
``--max-new`` below the record's room cuts the drafts of the last steps to the room left, so
only the tokens made before that compare (a first difference within the first step, as in the
bisection of ``docs/results.md``, does not depend on it).

It answers *which code* makes a committed record when the machine is the same: run the commit
that made the records and today's side by side (``mtad-audit`` compares today's code only). With
``--bf16-linears float32`` the pair's bfloat16 linears are computed in float32 (exact products,
one rounding; several times faster where bfloat16 is emulated): the same kernel for every
commit, not the recorded one, so compare such rows only with each other. Rows are appended, and a
(commit, record, length, kernel, threads) already in ``--out`` is skipped: an interrupted run
resumes. ``--nll-only`` generates nothing: each commit's target NLL of the committed tokens (the
run's own one teacher-forced pass), beside the committed ``nll_sum``.
Threads: one (``--threads``), as the offline pair's committed runs recorded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _of_the_commit(*names: str):
    """The first of ``names`` that the commit's tree has: its modules moved over the history
    (``mtad.evaluate`` became ``mtad.run.evaluate``), and the child imports that commit's package,
    not this checkout's (whose layers ``tests/test_layers.py`` checks)."""
    import importlib

    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise SystemExit(f"the commit has none of {', '.join(names)}")


def _child(args) -> None:
    """Inside the commit's worktree: regenerate the records and print one JSON line each."""
    sys.path.insert(0, str(args.worktree))
    import torch
    from torch import nn

    torch.set_num_threads(args.threads)
    _of_the_commit("mtad.run.config", "mtad.config")  # registers the config resolvers of that commit
    build = _of_the_commit("mtad.run.evaluate", "mtad.evaluate").build
    from hydra import compose, initialize_config_dir

    point = Path(args.point)
    stored = json.loads((point / "point.json").read_text())
    # only the point's member choices (group=name, names of conf/) are taken from the folder; its
    # knobs are set below from the identity, on keys that commit's config has; nothing else it
    # stores (a path, a sandbox setting, an endpoint) reaches the composed config
    import re

    choices = stored.get("choices") if isinstance(stored.get("choices"), dict) else {}
    picked = []
    for group in ("decoder", "task", "model"):
        name = choices.get(group)
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_]+", name):
            raise SystemExit(f"{point}: point.json choices.{group} is not a conf/ member name: {name!r}")
        picked.append(f"{group}={name}")
    overrides = [*picked, "logger=none", "output_dir=" + tempfile.mkdtemp()]
    records = {}
    for line in (point / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["turn"] == 0:
            records[int(r["index"])] = r
    with initialize_config_dir(config_dir=str(Path(args.worktree) / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    # the point's own settings (its identity), where that commit's config has the key
    from omegaconf import OmegaConf

    ident = stored.get("identity") or {}
    wanted = {"seed": ident.get("seed"), "max_new_tokens": ident.get("max_new_tokens"),
              **{k: v for k, v in (ident.get("sampling") or {}).items()},
              **{f"decoder.{k}": v for k, v in (ident.get("decoder") or {}).items()
                 if k != "_target_" and not isinstance(v, (dict, list))}}
    missing = []
    OmegaConf.set_struct(cfg, False)
    for key, value in wanted.items():
        if value is None:
            continue
        if isinstance(value, str) and "${" in value:
            raise SystemExit(f"{point}: stored {key}={value!r} is an interpolation; refusing it (only data is read)")
        if OmegaConf.select(cfg, key, default="<absent>") == "<absent>":
            missing.append(key)
        else:
            OmegaConf.update(cfg, key, value, merge=False)
    pair, _decoder, task, _scorer, engine = build(cfg)[:5]
    if args.bf16_linears == "float32":
        def f32_forward(self, x):
            y = torch.mm(self._w32, x.reshape(-1, x.shape[-1]).float().t()).t()
            if self._b32 is not None:
                y = y + self._b32
            return y.to(x.dtype).reshape(*x.shape[:-1], self._w32.shape[0])

        n = 0
        for model in (pair.target, pair.draft):
            for m in model.modules():
                if isinstance(m, nn.Linear) and m.weight.dtype == torch.bfloat16 \
                        and getattr(m, "kernel", "default") == "default":
                    m._w32 = m.weight.detach().float()
                    m._b32 = None if m.bias is None else m.bias.detach().float()
                    m.forward = types.MethodType(f32_forward, m)
                    n += 1
        if n == 0:
            raise SystemExit("--bf16-linears float32: the pair has no bfloat16 linear")
    examples = task.load()
    max_new = args.max_new or int(cfg.max_new_tokens)
    for index in args.records:
        rec = records[index]
        ex = examples[index]
        if ex.id != rec["example_id"]:
            raise SystemExit(f"example {index} is {ex.id} at this commit, the record says {rec['example_id']}")
        ids = task.render(ex, pair.tokenizer, 0, [])
        if args.nll_only:  # the commit's NLL of the committed tokens, nothing generated
            token_logprobs = _of_the_commit("mtad.core.metrics", "mtad.metrics").token_logprobs
            t0 = time.perf_counter()
            lp = token_logprobs(pair.target, ids, rec["output_ids"], pair.vocab_size)
            print(json.dumps({"index": index, "example_id": rec["example_id"], "max_new": 0,
                              "prompt_tokens": len(ids), "committed_prompt_tokens": rec.get("prompt_tokens"),
                              "nll_sum_of_committed_tokens": float(-lp.sum()),
                              "committed_nll_sum": rec.get("nll_sum"), "settings_not_in_commit_conf": missing,
                              "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
            continue
        t0 = time.perf_counter()
        res = engine.generate(ids, max_new, seed=int(cfg.seed) + 1000 * index)
        out = [int(t) for t in res.output_ids]
        got = res.to_record()
        k = next((j for j, (a, b) in enumerate(zip(rec["output_ids"], out)) if a != b), None)
        if k is None and len(out) < len(rec["output_ids"]) and max_new >= len(rec["output_ids"]):
            k = len(out)
        print(json.dumps({"index": index, "example_id": rec["example_id"], "max_new": max_new,
                          "tokens": out, "steps": got["steps"], "accepted_per_step": got.get("accepted_per_step"),
                          "committed_steps": rec["steps"] if max_new >= len(rec["output_ids"]) else None,
                          "first_difference_vs_committed": k, "settings_not_in_commit_conf": missing,
                          "seconds": round(time.perf_counter() - t0, 1)}),
              flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--point", required=True, help="a committed point folder")
    p.add_argument("--records", required=True, help="example indices, e.g. 14,15 (turn 0)")
    p.add_argument("--commits", default="HEAD", help="commits to run, comma-separated (default HEAD)")
    p.add_argument("--max-new", type=int, default=None, help="tokens to regenerate (default the point's)")
    p.add_argument("--bf16-linears", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--nll-only", action="store_true",
                   help="generate nothing: each commit's target NLL of the committed tokens (one pass), "
                        "beside the committed nll_sum")
    p.add_argument("--out", type=Path, default=None, help="JSON lines, appended (resumes)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worktree", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.records = [int(x) for x in args.records.split(",")]
    except ValueError:
        print(f"--records takes example indices like 14,15, not {args.records!r}", file=sys.stderr)
        return 2
    if args.child:
        _child(args)
        return 0
    point = Path(args.point).resolve()
    if not (point / "point.json").is_file() or not (point / "samples.jsonl").is_file():
        print(f"--point {args.point}: not a committed point folder (point.json and samples.jsonl)", file=sys.stderr)
        return 2
    done = set()
    if args.out is not None and args.out.exists():
        for line in args.out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["code_commit"], r["point"], r["index"], r["max_new"], r["kernel"], r.get("threads", 1)))
    shown_point = str(point.relative_to(ROOT)) if point.is_relative_to(ROOT) else str(point)
    for commit in args.commits.split(","):
        full = subprocess.run(["git", "rev-parse", commit], cwd=ROOT, capture_output=True, text=True)
        if full.returncode != 0:
            print(f"--commits: {commit!r} is not a commit of this repository", file=sys.stderr)
            return 2
        sha = full.stdout.strip()
        length = 0 if args.nll_only else args.max_new
        todo = [i for i in args.records
                if (sha, shown_point, i, length, args.bf16_linears, args.threads) not in done]
        if not todo:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "tree"
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), sha], cwd=ROOT, check=True)
            try:
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--worktree", str(tree),
                       "--point", str(point), "--records", ",".join(map(str, todo)),
                       "--bf16-linears", args.bf16_linears, "--threads", str(args.threads)]
                if args.nll_only:
                    cmd += ["--nll-only"]
                if args.max_new:
                    cmd += ["--max-new", str(args.max_new)]
                child = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.PIPE, text=True)
                for line in child.stdout:
                    row = {"code_commit": sha, "point": shown_point, "kernel": args.bf16_linears,
                           "threads": args.threads, **json.loads(line)}
                    row["max_new"] = 0 if args.nll_only else args.max_new  # as given (None: the point's)
                    print(json.dumps(row), flush=True)
                    if args.out is not None:
                        args.out.parent.mkdir(parents=True, exist_ok=True)
                        with open(args.out, "a") as f:
                            f.write(json.dumps(row) + "\n")
                if child.wait() != 0:
                    print(f"{sha[:12]}: the regeneration failed (exit {child.returncode})", file=sys.stderr)
                    return 1
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The benchmark scripts run end to end on the tiny random pair (seconds), and their parsers."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import cost_model  # noqa: E402
import overhead  # noqa: E402
import profile_share  # noqa: E402
import spectr_rho  # noqa: E402
import speed  # noqa: E402
import transfers  # noqa: E402

TINY = ["model=tiny_random"]



def _doc() -> str:
    """docs/speed.md with its whitespace made single spaces (the docs-quote tests search it)."""
    return " ".join((Path(__file__).resolve().parent.parent / "docs/speed.md").read_text().split())


def _table(name: str, start: str = "| ") -> list[list[str]]:
    """The cells of a committed bench record's table rows (``results/bench/NAME``) starting ``start``."""
    path = Path(__file__).resolve().parent.parent / "results/bench" / name
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in path.read_text().splitlines() if line.startswith(start)]

def test_task_and_decoder_specs():
    assert speed.parse_task("humaneval", 3) == ("humaneval", 0, 2)
    assert speed.parse_task("humaneval:10-19", 3) == ("humaneval", 10, 19)
    with pytest.raises(SystemExit, match="--tasks"):
        speed.parse_task("humaneval:9-2", 3)
    assert speed.parse_decoder("tree_mtad/gamma=5/width=2", 4) == ("tree_mtad", {"gamma": "5", "width": "2"})
    assert speed.parse_decoder("ar", 4) == ("multinomial", {"gamma": 4})
    with pytest.raises(SystemExit, match="/knob=value"):
        speed.parse_decoder("spd/gamma", 4)


def test_speed_benchmark_runs_side_by_side(tmp_path, capsys):
    out = tmp_path / "speed.json"
    speed.main([*TINY, "--tasks", "humaneval:1-2", "--max-new-tokens", "6", "--repeats", "1",
                "--decoders", "hf_assisted,hf_heuristic,spd,spd/gamma=auto,tree_mtad/gamma=2/width=2",
                "--compare", "tree_mtad/gamma=2/width=2:spd", "--out", str(out)])
    data = json.loads(out.read_text())
    labels = {r["decoder"] for r in data["rows"]}
    assert labels == {"hf_assisted", "hf_heuristic", "spd", "spd/gamma=auto", "tree_mtad/gamma=2/width=2"}
    assert {r["prompt"] for r in data["rows"]} == {1, 2}  # the requested example range
    auto = [r for r in data["rows"] if r["decoder"] == "spd/gamma=auto"]
    # every drafting step's shape is recorded (a last target-only step, with one token of room, has none)
    assert all(r["steps"] - 1 <= sum(r["shapes"].values()) <= r["steps"] for r in auto)
    per = data["report"]["humaneval/sample"]
    assert per["spd"]["paired_vs_spd"]["estimate"] == pytest.approx(1.0)
    assert [c["mode"] for c in data["comparisons"]] == ["greedy", "sample"]
    assert "paired comparisons" in capsys.readouterr().out


def test_speed_reports_the_harness_time_outside_the_models(tmp_path, capsys):
    """Top-p alone is a mode; each decoder's time outside the forward passes per token is
    reported from its runs, paired with SpD's by prompt."""
    out = tmp_path / "speed.json"
    speed.main([*TINY, "--tasks", "humaneval:0-1", "--max-new-tokens", "5", "--repeats", "1",
                "--modes", "sample_nok", "--decoders", "spd,tree_mtad", "--out", str(out)])
    data = json.loads(out.read_text())
    per = data["report"]["humaneval/sample_nok"]
    for name, d in per.items():
        rs = [r for r in data["rows"] if r["decoder"] == name]
        outside = sum(r["wall"] - r["forward"] for r in rs) / sum(r["tokens"] for r in rs)
        assert d["outside_ms_per_token"] == pytest.approx(1000 * outside)
        assert 0 < d["outside_ms_per_token"]
    assert per["spd"]["outside_vs_spd"]["estimate"] == pytest.approx(1.0)
    assert per["tree_mtad"]["outside_vs_spd"]["n"] == 2  # paired over the two prompts
    r = per["tree_mtad"]["outside_vs_spd"]
    want = "met" if r["high"] <= 1.5 else "missed" if r["low"] > 1.5 else "unresolved"
    assert per["tree_mtad"]["outside_goal"] == want and per["spd"]["outside_goal"] is None
    capsys.readouterr()
    speed.main(["--report", str(out)])  # a saved run re-rendered, with what produced it
    head = capsys.readouterr().out.splitlines()[:2]
    assert head[0].startswith("# python bench/speed.py ") and "--modes sample_nok" in head[0]
    assert head[1].startswith(f"# git {data['provenance']['git']['commit'][:10]}")
    with pytest.raises(SystemExit, match="--modes"):
        speed.main([*TINY, "--modes", "greedy,topp", "--out", str(tmp_path / "x.json")])


def test_cost_model_runs_and_writes_a_prior(tmp_path):
    out, prior = tmp_path / "cm.json", tmp_path / "prior.json"
    cost_model.main([*TINY, "--tune-prompts", "humaneval:10-10", "--report-prompts", "humaneval:0-0",
                     "--n-prompts", "1", "--max-new-tokens", "6", "--repeats", "1", "--nodes", "1,2,4",
                     "--draft-widths", "1,2", "--spd-gammas", "1,2", "--tree-widths", "1,2",
                     "--tree-gammas", "2", "--mtad-widths", "1", "--no-auto",
                     "--out", str(out), "--plot", str(tmp_path / "cm.png"), "--prior", str(prior)])
    data = json.loads(out.read_text())
    assert {r["decoder"] for r in data["rows"]} == {"spd", "tree_mtad"}
    assert all(r["predicted_tokens_per_s"] > 0 for r in data["rows"])
    assert (tmp_path / "cm.png").stat().st_size > 0
    assert json.loads(prior.read_text())["entries"]


def test_profile_share_counts_model_samples_inside_generate():
    raw = "\n".join([
        "<module> (speed.py:1);Engine.generate (mtad/core/engine.py:111);ModelRunner.forward (mtad/core/runner.py:182);"
        "Module._call_impl (torch/nn/modules/module.py:1782) 30",
        "<module> (speed.py:1);Engine.generate (mtad/core/engine.py:111);sample (mtad/core/sampling.py:57) 10",
        "<module> (speed.py:1);load (mtad/models/pair.py:10) 99",  # outside generate: not counted
    ])
    in_gen, in_model, leaves = profile_share.parse_raw(raw)
    assert (in_gen, in_model) == (40, 30)
    assert leaves == {"sample (mtad/core/sampling.py)": 10}


def test_speed_fixed_length_times_decoding_on_equal_token_counts(tmp_path):
    """--fixed-length (make bench-claim4): every run emits exactly --max-new-tokens tokens, EOS
    ignored, and ``wall`` is the decoding time without the prefill; the claims report reads it."""
    from mtad.analysis import claims
    out = tmp_path / "speed.json"
    speed.main([*TINY, "--tasks", "humaneval:0-1", "--max-new-tokens", "9", "--repeats", "1",
                "--modes", "sample", "--decoders", "spd,tree_mtad", "--fixed-length", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["args"]["fixed_length"] and "prefill excluded" in data["timing"]
    assert {r["tokens"] for r in data["rows"]} == {9} and len(data["rows"]) == 4
    assert all(r["prefill"] > 0 and 0 < r["wall"] for r in data["rows"])
    assert all(r["block_efficiency"] == pytest.approx(9 / r["steps"]) for r in data["rows"])
    # the forward timers also time the prefill, which wall leaves out: the share's span has it
    assert all(r["timed"] == pytest.approx(r["wall"] + r["prefill"]) for r in data["rows"])
    shares = [d["forward_share"] for per in data["report"].values() for d in per.values()]
    assert shares and all(0 < s <= 1 for s in shares), shares
    rows = claims.speed_rows(out, seed=0)
    row = next(r for r in rows if r.task == "humaneval" and r.comparison == "tree_mtad vs spd")
    assert row.n == 2 and "fixed length 9 tokens" in row.detail
    with pytest.raises(SystemExit, match="--fixed-length"):
        speed.main([*TINY, "--decoders", "hf_assisted,spd", "--fixed-length", "--out", str(out)])


def test_overhead_tiny_mode_writes_side_by_side_ratios(tmp_path):
    """bench/overhead.py on minimal sizes: every system interleaved, every run the same length,
    overhead = wall - (target + draft forward) on every row, goals and a markdown table."""
    out = tmp_path / "ovh.json"
    overhead.main(["--vocabs", "50", "--hidden", "16", "--draft-hidden", "16", "--max-new-tokens", "3",
                   "--prompts", "2", "--repeats", "1", "--systems", "hf_assisted,spd,specinfer",
                   "--drafts", "random", "--modes", "greedy,sample", "--out", str(out)])
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert len(rows) == 2 * 2 * 3 and {r["tokens"] for r in rows} == {3}
    for r in rows:
        assert r["overhead"] == pytest.approx(r["wall"] - r["target_forward"] - r["draft_forward"])
        assert 0 < r["target_forward"] < r["wall"] and r["target_calls"] > 0 and r["draft_calls"] > 0
    # the order rotates: each prompt starts with a different system
    firsts = [next(r["system"] for r in rows if (r["mode"], r["prompt"]) == ("greedy", p)) for p in (0, 1)]
    assert firsts[0] != firsts[1]
    assert list(data["report"]) == ["V50/random/greedy", "V50/random/sample"]
    greedy = data["report"]["V50/random/greedy"]
    assert set(greedy["goals"]) == {"spd_le_hf_assisted", "specinfer_le_1.5x_spd"}
    assert greedy["systems"]["spd"]["vs_spd_per_token"]["estimate"] == pytest.approx(1.0)
    assert greedy["systems"]["spd"]["equals_hf_greedy"] == "2/2"  # SpD emits HF's greedy tokens
    assert greedy["systems"]["hf_assisted"]["steps"] == sum(
        r["target_calls"] for r in rows if r["system"] == "hf_assisted" and r["mode"] == "greedy")
    md = out.with_suffix(".md").read_text()
    assert "Command: `python bench/overhead.py --vocabs 50" in md and "| specinfer |" in md
    assert "Machine:" in md and "Load average" in md and data["load"]["before"]["loadavg"]
    assert greedy["goals"]["spd_le_hf_assisted"]["verdict"] in ("met", "missed", "unresolved")
    out.with_suffix(".md").unlink()
    overhead.main(["--report", str(out)])  # re-renders the same tables from the JSON
    assert out.with_suffix(".md").read_text() == md


def test_overhead_counts_model_time_as_forward_on_both_sides():
    """A model made slower inside its forward (a sleep in the inner decoder) adds that time to the
    measured forward, not to the overhead, for HF assisted generation and for ours alike."""
    import time as _time

    import torch

    from mtad.core.warping import Warping

    sleep = 0.02
    pair = overhead.build_pair(50, 16, 2, 16, 1, "random")
    timers = {"target": speed.ForwardTimer(pair.target), "draft": speed.ForwardTimer(pair.draft)}
    dec = overhead.load_decoder("spd", gamma=2)
    ids = overhead.make_prompts(1, 8, 50)[0]

    def both():
        return {s: overhead.measure(s, pair, timers, dec if s == "spd" else None, ids, 4, Warping(0.0), 2, 0)
                for s in ("hf_assisted", "spd")}

    torch.manual_seed(0)
    fast = both()
    hooks = [m.model.register_forward_pre_hook(lambda *_: _time.sleep(sleep)) for m in (pair.target, pair.draft)]
    try:
        slow = both()
    finally:
        for h in hooks:
            h.remove()
    for s in ("hf_assisted", "spd"):
        calls = slow[s]["target_calls"] + slow[s]["draft_calls"]
        assert calls >= 4 and slow[s]["draft_calls"] >= 2
        assert slow[s]["target_forward"] + slow[s]["draft_forward"] >= calls * sleep
        # had the sleeps landed outside the measured forward, the overhead would grow by calls * sleep
        assert slow[s]["overhead"] - fast[s]["overhead"] < 0.5 * calls * sleep, s


def test_transfers_table_counts_both_directions_and_the_largest_read(tmp_path):
    """``bench/transfers.py`` on two decoders at plain temperature and with top-k: the table has
    every setting's rows, and at plain temperature no read is a vocabulary row; a decoder that
    does not support a setting (greedy match: temperature 0 only) is skipped there, not a crash."""
    out = tmp_path / "transfers"
    transfers.main(["--out", str(out), "--decoders", "spd", "specinfer", "greedy_match", "--gammas", "2", "--widths", "2",
                    "--tokens", "4", "--vocab", "4500", "--settings", "1", "1 plain"])
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert {(r["setting"], r["decoder"]) for r in rows} == {(s, d) for s in ("1", "1 plain") for d in ("spd", "specinfer")}
    assert all(0 < r["largest_read"] < 4500 for r in rows)
    assert all(r["h2d_draft_mean"] == r["h2d_verify_mean"] == 0 for r in rows)
    assert "| 1 plain | specinfer | 2 | 2 |" in out.with_suffix(".md").read_text()


def test_op_counter_counts_vocabulary_rows_read_outside_the_models():
    """``OpCounter(vocab)``: a call reading [R, V] counts R rows, views and metadata none, and a
    watched model's forward nothing (its calls are the model's)."""
    import torch

    vocab = 36
    model = torch.nn.Linear(4, vocab)
    counter = overhead.OpCounter(vocab).watch(model)
    x = torch.randn(5, vocab)
    try:
        with counter:
            x.softmax(-1)  # 5 rows
            torch.topk(x[:2], 3, dim=-1)  # 2 rows (the slice: a view, none)
            x.shape, x.dim(), x.view(5, vocab)  # no entries read
            model(torch.randn(3, 4))  # the model's own: not counted
            torch.randn(3, vocab + 1).sum()  # another length: not a vocabulary row
            torch.randn(4 * vocab).topk(2)  # 4 rows flattened into one vector: 4
            torch.randn(2, 3 * vocab).reshape(2, 3, vocab).amax(1)  # 6 (the reshape: a view, none)
            torch.randn(2, vocab).reshape(2, 4, vocab // 4).amax(1)  # rows cut into blocks, read whole: 2
    finally:
        counter.close()
    assert counter.rows == 7 + 4 + 6 + 2 and counter.ops >= 5
    assert counter.meta == 2  # x.shape, x.dim(): host metadata, no kernel


def test_compare_commits_pairs_overhead_per_token(tmp_path):
    """bench/compare_commits.py's pieces: overhead per emitted token per (setting, system, prompt),
    repeats averaged; the geometric mean of ratios with an interval around it."""
    import compare_commits

    rows = [dict(setting="S", system="spd", prompt=0, overhead=2.0, wall=8.0, tokens=4),
            dict(setting="S", system="spd", prompt=0, overhead=4.0, wall=12.0, tokens=4),
            dict(setting="S", system="tree_mtad", prompt=0, overhead=3.0, wall=5.0, tokens=2)]
    (tmp_path / "r.json").write_text(json.dumps({"rows": rows}))
    got = compare_commits.per_token(tmp_path / "r.json")
    assert got == {("S", "spd", 0): pytest.approx(0.75), ("S", "tree_mtad", 0): pytest.approx(1.5)}
    wall = compare_commits.per_token(tmp_path / "r.json", "wall")  # models included
    assert wall == {("S", "spd", 0): pytest.approx(2.5), ("S", "tree_mtad", 0): pytest.approx(2.5)}
    g, lo, hi = compare_commits._geo_ci([0.5, 2.0, 1.0])
    assert g == pytest.approx(1.0) and lo <= g <= hi and lo >= 0.5 and hi <= 2.0


def test_misses_table_takes_each_unmet_goal_apart():
    """bench/overhead.py's last table: one row per goal against SpD not settled as met, with its
    ratio per step, both systems' tokens per step and the op-count ratios; met goals and the
    goal against HF assisted generation are left out."""
    rows = []
    for prompt in range(3):
        rows += [dict(setting="S", system="spd", prompt=prompt, repeat=0, overhead=1.0, wall=4.0, tokens=8,
                      steps=2, target_calls=2, draft_calls=8, target_forward=2.0, draft_forward=1.0),
                 dict(setting="S", system="bild", prompt=prompt, repeat=0, overhead=1.5 + 0.01 * prompt, wall=5.0,
                      tokens=4, steps=4, target_calls=4, draft_calls=4, target_forward=2.0, draft_forward=1.5),
                 dict(setting="S", system="typical", prompt=prompt, repeat=0, overhead=0.9 + 0.01 * prompt, wall=4.0, tokens=8,
                      steps=2, target_calls=2, draft_calls=8, target_forward=2.0, draft_forward=1.0)]
    report = overhead.summarize(rows, ["spd", "bild", "typical"], 1.5)
    ops = {"S": {"spd": dict(rows_per_token=2.0, ops_per_token=100), "bild": dict(rows_per_token=3.0, ops_per_token=50)}}
    table = overhead.misses_table(report, ops)
    lines = [line for line in table.splitlines() if line.startswith("| S |")]
    assert len(lines) == 1  # typical's goal is met
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    # bild: 3x SpD per token = 0.75x per step x (4 tokens per step / 1)
    assert cells[1] == "bild" and cells[2].startswith("3.0") and cells[3] == "missed"
    assert cells[4] == "0.75x" and cells[5] == "1.00 (4.00)" and cells[6] == "4.00"
    assert cells[7] == "tokens per step" and cells[8] == "1.50x" and cells[9] == "0.50x"
    assert overhead.misses_table(overhead.summarize(rows, ["spd", "typical"], 1.5), {}) == ""


def test_compare_commits_summary_gives_the_ranges_docs_quote():
    """``--summary``: a record's new / old estimates as ranges per system and vocabulary; the
    ranges docs/speed.md quotes for the argmax / BiLD change are the record's."""
    import compare_commits

    root = Path(__file__).resolve().parent.parent
    got = compare_commits.summary(root / "results/bench/compare_commits_argmax_bild_cpu.md")
    assert len(got) == 18 and all(lo <= hi for lo, hi in got.values())

    def r(system, vocab):
        lo, hi = got[(system, vocab)]
        return f"{lo:.2f}-{hi:.2f}x"

    doc = " ".join((root / "docs/speed.md").read_text().split())
    for claim in (f"BiLD {r('bild', 'V151936')} at 151,936 tokens and {r('bild', 'V32000')} at 32,000",
                  f"BiLD in sampling mode {r('bild_sampling', 'V151936')} and {r('bild_sampling', 'V32000')}",
                  f"the greedy decoder {r('greedy', 'V151936')} and {r('greedy', 'V32000')}"):
        assert claim in doc, claim
    final = compare_commits.summary(root / "results/bench/compare_commits_argmax_final_heldout_cpu.md")

    def f(system, vocab):
        lo, hi = final[(system, vocab)]
        return f"{lo:.2f}-{hi:.2f}x"

    assert (f"BiLD {f('bild', 'V151936')} at 151,936 tokens and {f('bild', 'V32000')} at 32,000, BiLD in sampling "
            f"mode {f('bild_sampling', 'V151936')} and {f('bild_sampling', 'V32000')}, the greedy decoder "
            f"{f('greedy', 'V151936')} and {f('greedy', 'V32000')}") in doc
    assert f"SpD and tree-MTAD came out at {f('spd', 'V151936')} at 151,936 tokens" in doc
    assert final[("tree_mtad", "V151936")] == final[("spd", "V151936")]
    others = [got[(s, v)] for s in ("spd", "specinfer", "beam_specinfer", "tree_mtad", "mtad", "typical")
              for v in ("V151936", "V32000")]
    assert f"{min(lo for lo, _ in others):.2f}-{max(hi for _, hi in others):.2f}x, within" in doc


def test_docs_quote_the_committed_overhead_runs_goal_counts():
    """docs/speed.md's count of the goals the committed overhead run meets, misses and leaves
    unresolved, and the commit it names, are the run's own (results/bench/overhead_tiny_cpu.json)."""
    from collections import Counter

    root = Path(__file__).resolve().parent.parent
    run = json.loads((root / "results/bench/overhead_tiny_cpu.json").read_text())
    n = Counter(g["verdict"] for v in run["report"].values() for g in v["goals"].values())
    commit = run["provenance"]["git"]["commit"][:7]
    doc = " ".join((root / "docs/speed.md").read_text().split())
    wall = next(int(h.split("run: ")[1].split(" s")[0]) for h in run["header"] if h.startswith("Wall time of the run"))
    assert (f"The latest overhead run ({commit}, this Intel Xeon, {wall:,} s)"
            f" meets {n['met']} of the {sum(n.values())} goal cells, misses {n['missed']} and leaves "
            f"{n['unresolved']} unresolved") in doc


def test_every_named_bench_script_is_there_or_named_with_its_commit():
    """A ``bench/NAME.py`` that docs, code, configs, the Makefile or a record name is in bench/, or
    the same file says which commit to ``git show`` it from (investigations whose records stay)."""
    import re

    root = Path(__file__).resolve().parent.parent
    files = [root / "README.md", root / "Makefile", *sorted((root / "docs").rglob("*.md")),
             *sorted((root / "results").rglob("*.md")), *sorted((root / "results").rglob("*.txt")),
             *sorted((root / "conf").rglob("*.yaml")), *sorted((root / "experiments").rglob("*")),
             *[p for d in ("mtad", "eval", "bench", "tests") for p in sorted((root / d).rglob("*.py"))]]
    bad = []
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for name in sorted(set(re.findall(r"bench/([a-z][a-z0-9_]{2,})\.py", text))):
            if not (root / "bench" / f"{name}.py").is_file() and not re.search(
                    rf"git show [0-9a-f]{{7,40}}:bench/{name}\.py", text):
                bad.append(f"{path.relative_to(root)}: bench/{name}.py")
    assert not bad, "scripts named but neither in bench/ nor given a commit:\n" + "\n".join(bad)


def test_compare_commits_reads_speed_rows_and_pools_rounds_into_a_goals_table(tmp_path):
    """``--bench speed``: speed's rows keyed by task/mode, outside = timed - forward; ``_goals``
    pools a commit's kept rounds as repeats of one run and writes overhead's goals table."""
    import compare_commits

    rows = [dict(task="humaneval", mode="sample", decoder="spd", prompt=3, tokens=4, wall=2.0, timed=3.0, forward=2.0),
            dict(task="humaneval", mode="sample", decoder="mcss", prompt=3, tokens=2, wall=2.0, forward=1.5)]
    (tmp_path / "s.json").write_text(json.dumps({"rows": rows}))
    assert compare_commits.per_token(tmp_path / "s.json") == {
        ("humaneval/sample", "spd", 3): pytest.approx(0.25), ("humaneval/sample", "mcss", 3): pytest.approx(0.25)}
    assert compare_commits.per_token(tmp_path / "s.json", "wall")[("humaneval/sample", "mcss", 3)] == pytest.approx(1.0)
    kept = tmp_path / "kept"
    kept.mkdir()
    for r in range(2):
        runs = []
        for prompt in range(3):
            runs += [dict(setting="S", system="spd", prompt=prompt, repeat=0, overhead=1.0, wall=4.0, tokens=8, steps=2,
                          target_calls=2, draft_calls=8, target_forward=2.0, draft_forward=1.0),
                     dict(setting="S", system="mcss", prompt=prompt, repeat=0, overhead=3.0 + r + 0.1 * prompt, wall=6.0, tokens=8,
                          steps=2, target_calls=2, draft_calls=8, target_forward=2.0, draft_forward=1.0)]
        (kept / f"abc_{r}.json").write_text(json.dumps({"rows": runs, "header": ["# h"],
                                                         "args": {"systems": "spd,mcss", "tree_limit": 1.5}}))
    compare_commits._goals(kept, "abc", 2, tmp_path / "cmp.md")
    text = (tmp_path / "cmp_goals_abc.md").read_text()
    # per prompt the two rounds pool: (3 + 4 + 0.2 p) / 2 over SpD's 1: 3.5, 3.6, 3.7
    assert "| S | mcss_le_1.5x_spd | 3.60 [" in text and "| missed |" in text


def test_beam_floor_sets_the_least_beam_work_beside_spd_measured_alongside(tmp_path):
    """``--beam-floor``: per greedy setting and beam decoder, the floor per depth, both tokens per
    step, the added floor per token against the goal's allowance, and a verdict; seconds on tiny
    sizes."""
    md = tmp_path / "floor.md"
    overhead.main(["--beam-floor", "--vocabs", "257", "--hidden", "16", "--draft-hidden", "16", "--drafts", "equal",
                   "--prompts", "1", "--max-new-tokens", "4", "--systems", "spd,tree_mtad", "--md", str(md)])
    lines = [x for x in md.read_text().splitlines() if x.startswith("| V257/equal/greedy")]
    assert [x.split("|")[2].strip() for x in lines] == ["tree_mtad"]
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    assert float(cells[3]) > 0 and float(cells[2]) > 0 and float(cells[11]) > 0
    assert cells[10].startswith(("floor alone", "reachable", "not a bound here"))
    # the added floor: (gamma - 1) W-row depths and the root's one-row depth, less SpD's argmaxes, per token
    tps = float(cells[4].split()[0])
    want = ((4 - 1) * (float(cells[3]) - float(cells[2])) + max(float(cells[11]) - float(cells[2]), 0)) / tps / 1000
    assert float(cells[5]) == pytest.approx(want, abs=0.002)


def test_a_floor_verdict_is_never_stronger_than_its_own_run():
    assert overhead._floor_verdict(1.0, 0.5, 1.2, 1.8, "misses", "reachable").startswith("not a bound here")
    assert overhead._floor_verdict(1.0, 0.5, 2.0, 1.8, "misses", "reachable") == "misses"
    assert overhead._floor_verdict(0.2, 0.5, 2.0, 1.2, "misses", "reachable") == "reachable"


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_draw_floor_at_plain_temperature_and_top_p(tmp_path, top_p):
    """``--draw-floor`` (and ``--floor-top-p``): per setting and multi-draft decoder, one draw's
    floor from a row (a nucleus's own search counted at top-p), both rows and tokens per step, the
    floor against the goal's allowance, a verdict; the setting names the warping; seconds."""
    md = tmp_path / "floor.md"
    extra = [] if top_p == 1.0 else ["--floor-top-p", str(top_p)]
    overhead.main(["--draw-floor", *extra, "--vocabs", "3000", "--hidden", "16", "--draft-hidden", "16",
                   "--drafts", "random", "--prompts", "1", "--max-new-tokens", "4",
                   "--systems", "specinfer,beam_specinfer,tree_mtad", "--md", str(md)])
    text = md.read_text()
    tag = "plain" if top_p == 1.0 else "topp0.9"
    lines = [x for x in text.splitlines() if x.startswith(f"| V3000/random/{tag} ")]
    assert [x.split("|")[2].strip() for x in lines] == ["specinfer", "beam_specinfer", "tree_mtad"]
    tree = [c.strip() for c in lines[2].strip("|").split("|")][15].split()  # "needed of read read (SpD's)"
    assert len(tree) == 2 or float(tree[0]) <= float(tree[2])  # a rule needs no row it does not read
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    # a verdict never stronger than its own run: "not a bound here" where this tiny run measured the
    # decoder below the floor (timing: either can happen on 4 tokens)
    assert float(cells[2]) > 0 and cells[10].startswith(("floor alone", "reachable", "not a bound here"))
    assert float(cells[11]) > 0 and cells[14].startswith(("misses after a pass", "reachable after a pass",
                                                          "not a bound here"))
    assert float(cells[13]) == pytest.approx((float(cells[6]) + float(cells[12])) / float(cells[6]), abs=0.006)
    # the target side: rows normalised per token (SpD's), one row's least normalisation after a target
    # pass, the rows beyond SpD's times it, both floors together, and their verdict
    assert len(cells) == 20 and float(cells[15].split()[0]) > 0 and float(cells[16]) > 0
    spd_target, target = float(cells[15].split("(")[1].rstrip(")")), float(cells[15].split()[0])
    assert float(cells[17]) == pytest.approx(float(cells[16]) / 1000 * max(target - spd_target, 0), abs=0.0006)
    assert float(cells[18]) == pytest.approx((float(cells[6]) + float(cells[12]) + float(cells[17]))
                                             / float(cells[6]), abs=0.006)
    assert cells[19].startswith(("misses with the target's rows", "reachable with the target's rows",
                                 "not a bound here"))
    assert "rows their draws pick (``PickedRowCounter``)" in text and "best of 3 draft passes over 8 tokens" in text
    assert "The target side:" in text.split("Command:")[0]
    beam = [c.strip() for c in next(x for x in text.splitlines()
                                     if x.startswith(f"| V3000/random/{tag} | beam_specinfer ")).strip("|").split("|")]
    assert 0 < float(beam[3].split()[0]) and beam[10].startswith(("floor alone", "reachable", "not a bound here"))
    assert ("top-p 0.9 alone" in text.splitlines()[0]) == (top_p < 1.0)
    assert ("--floor-top-p 0.9" in text) == (top_p < 1.0)
    assert ("With ``--floor-top-p P``" in text.split("Command:")[0]) == (top_p < 1.0)


def test_phases_split_the_time_outside_the_models_by_phase(tmp_path):
    """``bench/phases.py``: per system, the time outside the models per step split into named
    phases and a rest that together make it up; the wrappers are taken off again."""
    import phases

    import mtad.verify.multidraft as md

    walk = md._walk
    out = tmp_path / "phases.md"
    phases.main(["--vocab", "3000", "--hidden", "16", "--draft-hidden", "16", "--prompts", "1",
                 "--max-new-tokens", "6", "--systems", "spd,specinfer", "--out", str(out)])
    assert md._walk is walk  # unwrapped
    rows = {r[0]: r[1:] for r in ([c.strip() for c in line.strip("|").split("|")]
                                  for line in out.read_text().splitlines() if line.startswith("| "))}
    ms = {k: [float(c.split()[0]) for c in v] for k, v in rows.items()
          if k not in ("phase", "---", "tokens per step", "outside the models, ms per token")}
    total = ms.pop("outside the models, all")
    for i in range(2):
        assert abs(sum(v[i] for v in ms.values()) - total[i]) <= 0.01 + 0.01 * total[i]
    assert ms["walk"][1] > 0 and ms["walk"][0] == 0 and ms["tree draws"][1] > 0


def test_draw_paths_times_each_block_site_on_and_off(tmp_path):
    """``bench/draw_paths.py``: a cell per site and system; the sites are put back as they were;
    an unknown site is refused in one line."""
    import draw_paths

    from mtad.core import cdf_blocks
    from mtad.propose import beam

    before = dict(cdf_blocks.SITES)
    out = tmp_path / "paths.md"
    draw_paths.main(["--vocab", str(cdf_blocks.MIN_LENGTH + 3), "--hidden", "16", "--draft-hidden", "16",
                     "--prompts", "2", "--max-new-tokens", "4", "--systems", "spd,mcss,beam_specinfer",
                     "--sites", "level,without,beam_rows,host_beams", "--out", str(out)])
    assert cdf_blocks.SITES == before and beam.REUSE_DRAWN_ROWS is True and beam.HOST_BEAMS is True
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.read_text().splitlines()
            if line.startswith(("| level", "| without", "| beam_rows", "| host_beams"))]
    assert [r[0] for r in rows] == ["level", "without", "beam_rows", "host_beams"] and all(len(r) == 4 for r in rows)
    assert all(float(c.split()[0]) > 0 for r in rows for c in r[1:])
    with pytest.raises(SystemExit, match="unknown"):
        draw_paths.main(["--vocab", "300", "--sites", "everywhere"])


def test_docs_quote_the_held_out_goals_rerun_counts():
    """docs/speed.md's verdict counts for the goals table re-run commit against commit are the
    committed records' (each commit's goals table, recomputed from the kept runs)."""
    import compare_commits

    root = Path(__file__).resolve().parent.parent
    kept = root / "results/bench/goals_heldout_cpu"

    def counts(mode_dir: str, commit: str, rounds: int) -> dict[tuple[str, str], int]:
        saved = [json.loads((kept / mode_dir / f"{commit}_{r}.json").read_text()) for r in range(rounds)]
        rows = [dict(row, repeat=r * 100 + row["repeat"]) for r, one in enumerate(saved) for row in one["rows"]]
        report = overhead.summarize(rows, saved[0]["args"]["systems"].split(","), 1.5)
        out = {}
        for line in compare_commits.goal_counts(report).splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 3 and cells[2].isdigit():
                out[(cells[0], cells[1])] = int(cells[2])
        return out

    doc = " ".join((root / "docs/speed.md").read_text().split())
    old, new = counts("plain", "691f6ca7ea", 2), counts("plain", "32c4dacbec", 2)
    tps = ", tokens per step the larger factor"
    assert (f"before {old[('sample_nok', 'met')]} met, {old[('sample_nok', 'missed')]} missed, "
            f"{old[('sample_nok', 'missed' + tps)]} missed where tokens per step are the larger factor, "
            f"{old[('sample_nok', 'unresolved')]} unresolved; after {new[('sample_nok', 'met')]} met, "
            f"{new[('sample_nok', 'missed')]} missed, {new[('sample_nok', 'missed' + tps)]} missed and "
            f"{new[('sample_nok', 'unresolved' + tps)]} unresolved where tokens per step") in doc
    old, new = counts("modes", "691f6ca7ea", 1), counts("modes", "32c4dacbec", 1)
    assert f"greedy {new[('greedy', 'met')]} met after ({old[('greedy', 'met')]} before)" in doc
    assert f"top-k {new[('sample', 'met')]} met after and before" in doc and old[("sample", "met")] == new[("sample", "met")]
    assert f"cells {new[('sample_nok', 'met')]} met after, {old[('sample_nok', 'met')]} before" in doc


def test_docs_quote_the_committed_draw_floor():
    """docs/speed.md's draw-floor counts and ranges are the committed record's."""
    root = Path(__file__).resolve().parent.parent
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in (root / "results/bench/draw_floor_cpu.md").read_text().splitlines()
            if line.startswith("| V")]
    reach = [r for r in rows if r[-1].startswith("reachable")]
    miss = [r for r in rows if r[-1].startswith("floor alone misses")]
    assert len(reach) + len(miss) == len(rows) == 28
    doc = " ".join((root / "docs/speed.md").read_text().split())
    assert f"Of the {len(rows)} cells, {len(reach)} are reachable in principle" in doc
    assert f"In {len(miss)} cells the floor alone misses the goal" in doc
    for vocab, floor_words, measured_words in (("V32000/", "floor alone", "measured"), ("V151936/", "floor", "measured")):
        sub = [r for r in reach if r[0].startswith(vocab)]
        lo, hi = min(float(r[9]) for r in sub), max(float(r[9]) for r in sub)
        mlo, mhi = min(float(r[8]) for r in sub), max(float(r[8]) for r in sub)
        assert f"{floor_words} {lo:.2f}-{hi:.2f}x" in doc and f"{measured_words} {mlo:.2f}-{mhi:.2f}x" in doc
    assert {r[1] for r in miss if r[0].startswith("V32000/")} == {"mcns"}


def test_docs_quote_the_leaner_rows_record():
    """docs/speed.md's new / old ranges for 3e00381 are the committed record's (both vocabularies)."""
    import compare_commits

    root = Path(__file__).resolve().parent.parent
    got = compare_commits.summary(root / "results/bench/compare_commits_leaner_rows_plain_cpu.md")
    doc = " ".join((root / "docs/speed.md").read_text().split())
    names = {"specinfer": "SpecInfer", "mcns": "MCNS", "mcss": "MCSS", "spectr": "SpecTr",
             "beam_specinfer": "beam SpecInfer", "tree_mtad": "tree-MTAD", "mtad": "MTAD", "spd": "SpD"}
    for system, name in names.items():
        lo = min(got[(system, v)][0] for v in ("V32000", "V151936"))
        hi = max(got[(system, v)][1] for v in ("V32000", "V151936"))
        assert f"{name} {lo:.2f}-{hi:.2f}x" in doc, system


def test_docs_quote_the_offline_five_prompt_record():
    """docs/speed.md's wall and outside-the-models ratios on the offline pair (5 prompts) are the
    committed record's."""
    root = Path(__file__).resolve().parent.parent
    cells = {}
    for line in (root / "results/bench/compare_commits_offline5_plain_humaneval_cpu.md").read_text().splitlines():
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) == 8 and c[0] == "humaneval/sample":
            cells[c[1]] = [x.split()[0] for x in c[2:]]
    doc = " ".join((root / "docs/speed.md").read_text().split())
    names = {"specinfer": "SpecInfer", "mcss": "MCSS", "tree_mtad": "tree-MTAD"}
    for s, name in names.items():
        new_old, old_x, new_x, wall, old_wall, new_wall = cells[s]
        assert f"{name} {old_wall}x and {new_wall}x" in doc and f"{name} {old_x}x and {new_x}x" in doc
        assert f"{name} {wall}x" in doc and f"{name} {new_old}x" in doc
    assert f"SpD {cells['spd'][3]}x" in doc and f"SpD {cells['spd'][0]}x" in doc


def test_spectr_rho_bench_times_both_rules_side_by_side(tmp_path):
    out = tmp_path / "rho.md"
    text = spectr_rho.main(["--vocabs", "5000", "--ks", "2,4", "--rows", "2", "--repeats", "1", "--md", str(out)])
    assert out.read_text() == text
    rows = [line for line in text.splitlines() if line.startswith("| 5000 |")]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        sort_ms, sel_ms, ratio, diff = (float(c) for c in cells[2:])
        # the ratio is of the unrounded times: within what rounding each to 0.01 ms allows (a fixed
        # tolerance failed where a loaded machine's times were a few hundredths of a millisecond)
        assert sort_ms > 0 and sel_ms > 0
        assert (sel_ms - 0.005) / (sort_ms + 0.005) - 0.005 <= ratio <= (sel_ms + 0.005) / max(sort_ms - 0.005, 1e-9) + 0.005
        assert diff < 1e-5  # the same root up to float32 sums


def test_docs_quote_the_staged_walk_records():
    """docs/speed.md's staged-walk section: the plain-temperature before → after table is the
    commit-against-commit record's, and the draw floors' counts and ranges are their records'."""
    root = Path(__file__).resolve().parent.parent
    doc = " ".join((root / "docs/speed.md").read_text().split())
    rec = (root / "results/bench/compare_commits_staged_walk_modes_cpu.md").read_text()
    cells = {}
    for line in rec.splitlines():
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if line.startswith("| V") and c[0].endswith("sample_nok"):
            cells[(c[1], c[0])] = (c[3].split()[0], c[4].split()[0])
    names = {"specinfer": "SpecInfer", "mcss": "MCSS", "spectr": "SpecTr", "beam_specinfer": "beam SpecInfer",
             "tree_mtad": "tree-MTAD", "mtad": "MTAD"}
    cols = ["V32000/random", "V32000/equal", "V151936/random", "V151936/equal"]
    for s, n in names.items():
        row = f"| {n} | " + " | ".join("{} → {}".format(*cells[(s, f"{c}/sample_nok")]) for c in cols) + " |"
        assert row in doc, row

    def floor(name):
        rows = [[c.strip() for c in line.strip().strip("|").split("|")]
                for line in (root / "results/bench" / name).read_text().splitlines() if line.startswith("| V")]
        return {(r[0], r[1]): (float(r[8]), float(r[9]), r[10]) for r in rows}

    plain, topp = floor("draw_floor_staged_walk_cpu.md"), floor("draw_floor_topp_staged_walk_cpu.md")
    every_row = ("specinfer", "mcss", "spectr", "mcns")
    miss = [k for k, v in plain.items() if k[1] in every_row and v[2].startswith("floor alone misses")]
    assert f"The floor alone misses 1.5x SpD in {len(miss)} of the 16 cells" in doc
    assert all(v[2].startswith("no bound") for k, v in {**plain, **topp}.items() if k[1] in overhead.BEAM_SYSTEMS)
    assert all(v[2].startswith("floor alone misses") for k, v in topp.items() if k[1] in every_row)
    assert "in all 16 cells of SpecInfer" in doc
    for table, system, words in ((plain, "specinfer", "SpecInfer ("), (topp, "spectr", "SpecTr ("),
                                 (topp, "mcss", "MCSS (")):
        v = [x for k, x in table.items() if k[1] == system]
        lo, hi = min(x[1] for x in v), max(x[1] for x in v)
        mlo, mhi = min(x[0] for x in v), max(x[0] for x in v)
        assert f"{words}{lo:.2f}-{hi:.2f}x; measured {mlo:.2f}-{mhi:.2f}x" in doc or \
            f"{words}{lo:.2f}-{hi:.2f}x; {mlo:.2f}-{mhi:.2f}x" in doc, (system, lo, hi, mlo, mhi)


def test_docs_quote_the_block_sum_records():
    """docs/speed.md's block-sum section: the on / off table is the draw-paths records', the
    before → after ratios the commit-against-commit record's, and the floors' per-row costs,
    ranges and verdicts their records'."""
    doc, table = _doc(), _table

    r, e = ({c[0]: [x.split()[0] for x in c[1:]] for c in table(f"draw_paths_v151936_{d}_cpu.md")}
            for d in ("random", "equal"))
    for site in ("level", "without", "single", "rows"):
        assert f"| {site} | " + " | ".join(f"{a} / {b}" for a, b in zip(r[site], e[site])) + " |" in doc, site
    cells = {(c[1], c[0]): (c[3].split()[0], c[4].split()[0]) for c in table("compare_commits_block_sums_modes_cpu.md")
             if c[0].startswith("V") and c[0].endswith("sample_nok")}
    names = {"specinfer": "SpecInfer", "mcss": "MCSS", "spectr": "SpecTr", "beam_specinfer": "beam SpecInfer",
             "tree_mtad": "tree-MTAD", "mtad": "MTAD"}
    for s, n in names.items():
        row = f"| {n} | " + " | ".join("{} → {}".format(*cells[(s, f"V151936/{d}/sample_nok")])
                                       for d in ("random", "equal")) + " |"
        assert row in doc, row

    def floor(name):
        return [c for c in table(name) if c[0].startswith("V")]

    def per_row(rows):
        v32 = [float(c[2]) for c in rows if c[0].startswith("V32000/")]
        v15 = [float(c[2]) for c in rows if c[0].startswith("V151936/")]
        return f"{min(v32):.1f}-{max(v32):.1f} µs at 32,000 tokens and {min(v15):,.1f}-{max(v15):,.1f} µs at 151,936"

    plain, topp = floor("draw_floor_block_sums_cpu.md"), floor("draw_floor_topp_block_sums_cpu.md")
    assert per_row(plain) in doc and per_row(topp) in doc
    three = [c for c in plain if c[1] in ("specinfer", "mcss", "spectr")]
    assert len(three) == 12 and all(c[10].startswith("reachable") for c in three)
    lo, hi = min(float(c[9]) for c in three), max(float(c[9]) for c in three)
    mlo, mhi = min(float(c[8]) for c in three), max(float(c[8]) for c in three)
    assert f"floor {lo:.2f}-{hi:.2f}x SpD; measured {mlo:.2f}-{mhi:.2f}x SpD" in doc
    four = [c for c in topp if c[1] in ("specinfer", "mcss", "spectr", "mcns")]
    assert len(four) == 16 and all(c[10].startswith("floor alone misses") for c in four)
    assert all(c[10].startswith("floor alone misses") for c in plain if c[1] == "mcns")


def _goals_table(path, top_p, cells, tokens=()):
    """A goals table as ``bench/compare_commits.py`` writes one: ``cells`` (setting, system, ratio, verdict)."""
    rows = [f"| {st} | {s}_le_1.5x_spd | {r} [1.0, 2.0] | no | {v} |" for st, s, r, v in cells]
    apart = [f"| {st} | {s} | {r} | {v} | 1.0x | 1.00 (4.00) | 4.00 | "
             f"{'tokens per step' if (st, s) in tokens else 'per step'} | - | - |" for st, s, r, v in cells if v != "met"]
    path.write_text(f"Harness overhead ...; sample = T 1 top-k 10 top-p {top_p:g}, sample_nok = T 1 top-p {top_p:g} "
                    "without top-k; systems interleaved\n\n"
                    "### goals (overhead per token, paired ratio [95% CI])\n\n| setting | goal | ratio | estimate within "
                    "| 95% CI says |\n| --- | --- | ---: | --- | --- |\n" + "\n".join(rows) + "\n\n"
                    "### goals against SpD not met, taken apart (per token = per step / tokens per step)\n\n"
                    "| setting | system | x | verdict | a | b | c | larger factor | d | e |\n| --- |\n"
                    + "\n".join(apart) + "\n\n### Cells by verdict\n")


def test_verdicts_give_every_cell_one_reason_from_the_records(tmp_path):
    """``bench/verdicts.py``: met cells stay met; a cell not met takes the first reason that holds
    (tokens per step, the floor alone, the floor after a pass, the harness; no floor measured)."""
    import verdicts

    plain, topk = tmp_path / "plain.md", tmp_path / "topk.md"
    _goals_table(plain, 1.0, [("V9/random/sample_nok", "specinfer", "1.20", "met"),
                              ("V9/random/sample_nok", "mcss", "2.00", "missed"),
                              ("V9/random/sample_nok", "spectr", "1.60", "unresolved"),
                              ("V9/random/sample_nok", "mcns", "6.00", "missed"),
                              ("V9/random/sample_nok", "tree_mtad", "1.90", "missed"),
                              ("V9/random/sample_nok", "typical", "1.70", "missed")],
                 tokens={("V9/random/sample_nok", "mcns")})
    _goals_table(topk, 1.0, [("V9/random/sample", "specinfer", "1.70", "missed")])
    floor = tmp_path / "floor.md"
    verdict = {"mcss": ("floor alone misses x", "misses after a pass x"), "spectr": ("reachable x", "misses after a pass x"),
               "mcns": ("floor alone misses x", "misses after a pass x"), "tree_mtad": ("reachable x", "reachable after x")}
    floor.write_text("\n".join(f"| V9/random/plain | {s} | 1 | 1 | 1 | 1 | 1 | 1 | 1 | 1 | {a} | 1 | 1 | 1 | {b} |"
                               for s, (a, b) in verdict.items()) + "\n")
    text = verdicts.main(["--goals", str(plain), "--goals", f"{topk}:topk10", "--floor", str(floor)])
    row = {line.split("|")[1].strip(): line for line in text.split("### plain")[1].splitlines() if line.startswith("| ")}
    assert row["specinfer"].endswith("| 1.20 met |") and row["mcss"].endswith("| 2.00 missed F |")
    assert row["spectr"].endswith("| 1.60 unres P |") and row["mcns"].endswith("| 6.00 missed † |")
    assert row["tree_mtad"].endswith("| 1.90 missed H |") and row["typical"].endswith("| 1.70 missed h |")
    assert "| topk10 | missed: harness (no floor) | 1 |" in text and "| plain | missed: floor misses | 1 |" in text
    with pytest.raises(SystemExit, match="in two goals tables"):
        verdicts.main(["--goals", str(plain), "--goals", str(plain)])
    with pytest.raises(SystemExit, match="no such record"):
        verdicts.main(["--goals", str(tmp_path / "none.md")])
    bare = tmp_path / "bare.md"  # no description of its modes: refused, not guessed
    bare.write_text(plain.read_text().split("\n", 1)[1])
    with pytest.raises(SystemExit, match="not a goals table"):
        verdicts.main(["--goals", str(bare)])
    nucleus = tmp_path / "nucleus.md"  # bench/overhead.py's default top-p 0.9: its modes say so
    _goals_table(nucleus, 0.9, [("V9/random/sample", "mcss", "1.70", "missed"),
                                ("V9/random/sample_nok", "mcss", "2.70", "missed")])
    text = verdicts.main(["--goals", str(nucleus)])
    assert "### topk10_topp0.9" in text and "### topp0.9" in text and "### plain" not in text
    # --row-ops: each harness cell says what a faster row kernel could do there (that record's cell)
    ops = tmp_path / "row_ops.md"
    ops.write_text("\n".join(f"| V9/random/plain | {s} | 1 | 1 | 1 | 1 | 1 | 1 | 1 | {v} |" for s, v in (
        ("spd", "reference"), ("tree_mtad", "the rest alone misses: no row kernel closes it"),
        ("mcss", "faster row kernels could close it"))) + "\n")
    text = verdicts.main(["--goals", str(plain), "--goals", f"{topk}:topk10", "--floor", str(floor),
                          "--row-ops", str(ops)])
    row = {line.split("|")[1].strip(): line for line in text.split("### plain")[1].splitlines() if line.startswith("| ")}
    assert row["tree_mtad"].endswith("| 1.90 missed Hg |") and row["typical"].endswith("| 1.70 missed h- |")
    assert row["mcss"].endswith("| 2.00 missed F |")  # not a harness cell: no letter
    assert "| plain | missed: harness; the rest alone misses | 1 |" in text
    assert "| plain | missed: harness (no floor); not in the row-ops record | 1 |" in text
    ops.write_text("| V9/random/plain | mtad | 1 | 1 | 1 | 1 | 1 | 1 | 1 | fast |\n")
    with pytest.raises(SystemExit, match="unknown row-ops verdict"):
        verdicts.main(["--goals", str(plain), "--row-ops", str(ops)])


def test_the_committed_verdicts_recompute_from_their_records():
    """``results/bench/verdicts_cpu.md`` is what ``bench/verdicts.py`` makes of the records it names."""
    import verdicts

    bench = Path(__file__).resolve().parent.parent / "results/bench"
    rec = (bench / "verdicts_cpu.md").read_text()
    goals = [(bench / "compare_commits_block_sums_modes_cpu_goals_67a2e8c6b4.md", {"greedy", "topk10"}),
             (bench / "compare_commits_beam_rows_plain_cpu_goals_3f0fa92310.md", None),
             (bench / "compare_commits_beam_rows_topp_cpu_goals_3f0fa92310.md", None)]
    floors = [bench / n for n in ("draw_floor_in_situ_cpu.md", "draw_floor_topp_in_situ_cpu.md",
                                  "beam_floor_root_row_cpu.md")]
    assert verdicts.render(goals, floors) == rec
    session = [goals[0], (bench / "compare_commits_session_plain_cpu_goals_84827ddd8b.md", None),
               (bench / "compare_commits_nucleus_topp_cpu_goals_84827ddd8b.md", None)]
    floors[1] = bench / "draw_floor_topp_nucleus_cpu.md"
    assert verdicts.render(session, floors) == (bench / "verdicts_session_cpu.md").read_text()
    host = [(bench / "compare_commits_beam_host_modes_cpu_goals_2a2b63bb89.md", None),
            (bench / "compare_commits_beam_host_topp_cpu_goals_2a2b63bb89.md", None)]
    assert verdicts.render(host, floors) == (bench / "verdicts_beam_host_cpu.md").read_text()


def test_docs_quote_the_after_a_pass_records():
    """docs/speed.md's "After a pass" section: per-row costs, ranges, flipped cells and counts are
    the floor, beam-floor, draw-paths, commit-against-commit and verdicts records'."""
    bench = Path(__file__).resolve().parent.parent / "results/bench"
    doc = _doc()

    def rows(name):
        return _table(name, "| V")

    def span(vals, fmt="{:,.1f}"):
        return f"{fmt.format(min(vals))}-{fmt.format(max(vals))}"

    plain, topp = rows("draw_floor_in_situ_cpu.md"), rows("draw_floor_topp_in_situ_cpu.md")
    for v, alone, after in (("V32000/", "alone", "after a pass at 32,000"), ("V151936/", "alone", "after a pass at 151,936")):
        r = [c for c in plain if c[0].startswith(v)]
        assert f"{span([float(c[2]) for c in r])} µs {alone} and {span([float(c[11]) for c in r])} µs {after}" in doc
    names = {"specinfer": "SpecInfer", "mcss": "MCSS", "spectr": "SpecTr", "beam_specinfer": "beam SpecInfer",
             "tree_mtad": "tree-MTAD", "mtad": "MTAD"}
    for s, n in names.items():
        r = [c for c in plain if c[1] == s]
        cols = [span([float(c[i]) for c in r], "{:.2f}") for i in (9, 13, 8)]
        assert f"| {n} | " + " | ".join(cols) + " |" in doc, n
    flips = [(c[0], c[1], c[13]) for c in plain if c[10].startswith("reachable") and c[14].startswith("misses")]
    assert f"In {len(flips)} cells the floor after a pass exceeds the goal" in doc
    assert all(f"{x}x" in doc for _, _, x in flips)
    r32, r15 = ([c for c in topp if c[0].startswith(v)] for v in ("V32000/", "V151936/"))
    assert (f"{span([float(c[11]) for c in r32])} µs at 32,000 tokens and {span([float(c[11]) for c in r15])} µs at "
            f"151,936 (alone {span([float(c[2]) for c in r32])} and {span([float(c[2]) for c in r15])})") in doc
    both = [c for c in topp if c[10].startswith("floor alone misses") and c[14].startswith("misses")]
    assert len(both) == 20 and {c[1] for c in both} == {"specinfer", "mcss", "spectr", "mcns", "beam_specinfer"}
    beam = rows("beam_floor_root_row_cpu.md")
    r32, r15 = ([c for c in beam if c[0].startswith(v)] for v in ("V32000/", "V151936/"))
    assert (f"{span([float(c[3]) for c in r32])} µs at 32,000 tokens and {span([float(c[3]) for c in r15])} µs at "
            f"151,936 (the root's {span([float(c[11]) for c in r32])} and {span([float(c[11]) for c in r15])})") in doc
    assert [c[0] for c in beam if c[10].startswith("floor alone misses")] == ["V151936/equal/greedy"] * 3
    for t, col in (("", 1), ("topp_", 2)):
        for v in ("32000", "151936"):
            for d in ("random", "equal"):
                line = next(x for x in (bench / f"draw_paths_beam_rows_{t}v{v}_{d}_cpu.md").read_text().splitlines()
                            if x.startswith("| beam_rows"))
                c = [x.strip().split()[0] for x in line.strip().strip("|").split("|")]
                sec = doc.split("### After a pass")[1].split("###")[0]
                row = next(x for x in sec.split("| V") if x.startswith(f"{v} {d} |"))
                assert row.split("|")[col].strip() == f"{c[1]} / {c[2]}", (t, v, d)
    counts = (bench / "verdicts_cpu.md").read_text().split("### Cells by verdict and reason")[1]
    for line in counts.splitlines():
        if line.startswith("| ") and not line.startswith("| mode") and not line.startswith("| ---"):
            assert line in doc, line


def test_docs_quote_the_reverted_change_and_the_second_plain_run():
    """The "not kept" paragraph: MCSS's on / off and commit-against-commit values are the records'; the
    two plain-temperature goals tables' counts are theirs."""
    root = Path(__file__).resolve().parent.parent
    bench = root / "results/bench"
    doc = " ".join((root / "docs/speed.md").read_text().split())
    mcss = []
    for d in ("random", "equal"):
        line = next(x for x in (bench / f"draw_paths_level_without_v32000_{d}_cpu.md").read_text().splitlines()
                    if x.startswith("| level_without"))
        mcss.append(line.strip().strip("|").split("|")[3].split()[0])
    assert f"but {mcss[0]} and {mcss[1]} at seed 89" in doc
    cc = {(c[0], c[1]): c[2] for c in ([x.strip() for x in line.strip().strip("|").split("|")] for line in
          (bench / "compare_commits_level_without_plain_cpu.md").read_text().splitlines() if line.startswith("| V"))}
    assert (f"commit against commit {cc[('V32000/random/sample_nok', 'mcss')]} and "
            f"{cc[('V32000/equal/sample_nok', 'mcss')]}") in doc

    def counts(name):
        text = (bench / name).read_text().split("### Cells by verdict")[1]
        got = {}
        for line in text.splitlines():
            c = [x.strip() for x in line.strip().strip("|").split("|")]
            if line.startswith("| sample_nok"):
                got[c[1]] = int(c[2])
        return got

    a = counts("compare_commits_level_without_plain_cpu_goals_3f0fa92310.md")
    b = counts("compare_commits_beam_rows_plain_cpu_goals_3f0fa92310.md")
    tok = [sum(v for k, v in x.items() if "tokens per step" in k) for x in (a, b)]
    assert (f"{a['met']} cells met, {a['missed']} missed and {a['unresolved']} unresolved besides {tok[0]} where "
            f"tokens per step") in doc
    assert f"against {b['met']}, {b['missed']} and {b['unresolved']} (and {tok[1]}) at seed 73" in doc


def test_the_draw_floor_puts_beam_drafting_back_whatever_happens(monkeypatch):
    """``--draw-floor`` patches beam drafting's ``scoring_probs`` to count picked rows, and the
    warping, the scores' logits and tree-MTAD's rule to count the target's rows: all undone when
    the run fails too."""
    from mtad.core.warping import Warping
    from mtad.propose import beam
    from mtad.verify import score, threshold

    def now():
        return (beam.scoring_probs, Warping.__call__, score.Scores.logits, score.Scores._warp_rows,
                threshold.path_log_probs, threshold.tree_accept)

    before = now()

    def fail(*a, **k):
        assert all(x is not y for x, y in zip(now(), before))  # counting while it runs
        raise RuntimeError("planted")

    monkeypatch.setattr(overhead, "measure", fail)
    with pytest.raises(RuntimeError, match="planted"):
        overhead.main(["--draw-floor", "--vocabs", "300", "--hidden", "16", "--draft-hidden", "16", "--drafts", "random",
                       "--prompts", "1", "--max-new-tokens", "2", "--systems", "specinfer"])
    assert all(x is y for x, y in zip(now(), before))


def test_target_rows_are_counted_by_the_target_logits_they_read():
    """``TargetRowCounter`` counts a warping's rows only where they are (views of) a live output of
    the target, or the scores' concatenation of them: not the draft's, not a copy, and not a dead
    output's storage that a later tensor reuses."""
    import torch

    from mtad.core.warping import Warping

    model = torch.nn.Linear(4, 9)

    class Out:
        def __init__(self, logits):
            self.logits = logits

    wrapped = torch.nn.Module()
    wrapped.lin = model
    wrapped.forward = lambda x: Out(model(x))
    counter = overhead.TargetRowCounter(wrapped)
    try:
        w = Warping(1.0)
        out = wrapped(torch.randn(3, 4)).logits  # three target rows
        w(out[1:])  # a view: 2 rows
        w(out[0][None])  # 1 row
        w(out.clone())  # a copy: not the target's
        w(torch.randn(2, 9))  # the draft's, say
        assert counter.rows == 3
        del out
        w(torch.randn(3, 9))  # may reuse the freed storage: the output is dead, not counted
        assert counter.rows == 3
    finally:
        counter.close()
    assert Warping.__call__ is not None and counter.rows == 3


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tree_mtad_needs_only_rows_whose_subtree_may_pass(dtype):
    """``_needed_tree_rows``: a row with children is needed unless its own path's log-likelihood
    already fails at every depth below it (descendants' never rise); the row the token is drawn
    from always; each row once. Checked against a brute force over the rule's own pass test."""
    import math
    import random

    import torch

    from mtad.verify.threshold import _host_float, path_log_probs

    dtype = getattr(torch, dtype)
    rng = random.Random(5)
    pruned = 0
    for _ in range(200):
        n = rng.randint(1, 12)
        parents = [-1] + [rng.randrange(0, r) for r in range(1, n + 1)]
        depth = [0]
        for r in range(1, n + 1):
            depth.append(depth[parents[r]] + 1)
        g = max(depth)
        if g == 0:
            continue
        edge = torch.tensor([rng.choice([0.0, rng.random(), rng.random() ** 8]) for _ in range(n)], dtype=dtype)
        logp = path_log_probs(edge, parents)
        ref = torch.tensor([rng.uniform(-12, 0) for _ in range(g)], dtype=dtype)
        tau = rng.choice([0.1, 0.5, 1.0])
        chosen = rng.randrange(0, n + 1)
        got = overhead._needed_tree_rows(logp, depth, parents, ref, tau, chosen)
        assert got == len(_brute_needed(logp.tolist(), depth, parents, ref.tolist(), _host_float(dtype),
                                         _host_float(dtype)(math.log(tau)), chosen))
        pruned += got < len(set(parents[1:]) | {chosen})
    assert pruned > 20  # the cases prune rows (a count of every row with children fails)


def _brute_needed(vals, depth, parents, refs, rnd, bar, chosen) -> set[int]:
    """``_needed_tree_rows`` by brute force: each row whose descendants the row's own path does not
    rule out, and the chosen row; asserting on the way that every row on the path to a node that
    passes the rule's own test is among them (a pruning that skipped one would be wrong)."""
    import math

    n = len(depth) - 1

    def below(r):
        kids = [c for c in range(1, n + 1) if parents[c] == r]
        return kids + [d for c in kids for d in below(c)]

    need = {chosen} | {r for r in range(n + 1) if vals[r] != -math.inf
                       and any(rnd(vals[r] - refs[depth[v] - 1]) > bar for v in below(r))}
    for v in range(1, n + 1):
        if vals[v] != -math.inf and rnd(vals[v] - refs[depth[v] - 1]) > bar:
            r = parents[v]
            while r != -1:
                assert r in need
                r = parents[r]
    return need


def test_after_pass_times_the_same_work_after_a_pass_and_again(tmp_path):
    """``bench/after_pass.py``: both workloads timed after a pass and again, per vocabulary, with
    their ratio; a bad pass count is refused in one line."""
    import after_pass

    out = tmp_path / "after.md"
    text = after_pass.main(["--vocabs", "300", "--passes", "2", "--out", str(out)])
    assert out.read_text() == text
    row = next(line for line in text.splitlines() if line.startswith("| 300 |"))
    c = [float(x) for x in row.strip().strip("|").split("|")]
    assert all(x > 0 for x in c) and c[3] == pytest.approx(c[1] / c[2], abs=0.006)
    with pytest.raises(SystemExit, match="--passes"):
        after_pass.main(["--passes", "0"])


def test_docs_quote_the_after_pass_record():
    root = Path(__file__).resolve().parent.parent
    doc = " ".join((root / "docs/speed.md").read_text().split())
    rows = {line.split("|")[1].strip(): [x.strip() for x in line.strip().strip("|").split("|")]
            for line in (root / "results/bench/after_pass_cpu.md").read_text().splitlines() if line.startswith("| 3")
            or line.startswith("| 1")}
    a, b = rows["32,000"], rows["151,936"]
    assert (f"take {a[1]} µs right after a draft pass against {a[2]} µs again at once at 32,000 tokens ({a[3]}x), "
            f"and {b[1]} against {b[2]} µs at 151,936 ({b[3]}x); a softmax of the pass's 8 rows {a[6]}x at both") in doc
    assert a[6] == b[6]


def test_a_records_command_names_no_directory_of_this_machine(tmp_path):
    """``phases.command``: absolute paths shown relative to the repository, or by name outside it."""
    import phases

    root = Path(__file__).resolve().parent.parent
    got = phases.command("x.py", ["--out", str(tmp_path / "a.md"), "--out=/abs/b.md",
                                  str(root / "results/bench/c.md"), "rel/d.md", "--vocab", "7"])
    assert got == "python bench/x.py --out a.md --out=b.md results/bench/c.md rel/d.md --vocab 7"
    text = __import__("after_pass").main(["--vocabs", "300", "--passes", "1", "--out", str(tmp_path / "e.md")])
    assert str(tmp_path) not in text and "--out e.md" in text


def test_docs_quote_the_fewer_calls_records():
    """The section on fewer torch calls (179097a): its table is the commit-against-commit record's
    new / old cells, its ratios each commit's, its call counts the two goals tables'."""
    doc = _doc()
    cells = {(r[0].rsplit("/", 1)[0], r[1]): r for r in _table("compare_commits_fewer_calls_plain_cpu.md", "| V")}
    sets = ["V32000/random", "V32000/equal", "V151936/random", "V151936/equal"]
    names = {"spd": "SpD", "beam_specinfer": "beam SpecInfer", "tree_mtad": "tree-MTAD", "mtad": "MTAD",
             "specinfer": "SpecInfer", "mcss": "MCSS"}
    for system, name in names.items():
        assert f"| {name} | " + " | ".join(cells[(s, system)][2] for s in sets) + " |" in doc, system
    for system, name in (("tree_mtad", "tree-MTAD is"), ("mtad", "MTAD"), ("beam_specinfer", "beam SpecInfer")):
        new = [cells[(s, system)][4].split()[0] for s in sets]
        assert f"{name} {new[0]}, {new[1]}, {new[2]} and {new[3]}" in doc, system
    topp = [float(r[2].split()[0]) for r in _table("compare_commits_fewer_calls_topp_cpu.md", "| V")]
    assert f"gives {min(topp):.2f}-{max(topp):.2f} for every decoder" in doc
    calls = {}
    for commit in ("9ea6946", "179097a"):
        text = (Path(__file__).resolve().parent.parent / f"results/bench/torch_calls_plain_v32000_{commit}_cpu.md"
                ).read_text().split("### torch calls outside the models per emitted token")[1].split("###")[0]
        rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
        assert rows[0][1:] == ["V32000/random/sample_nok", "V32000/equal/sample_nok"]
        calls[commit] = {r[0]: f"{r[1].split()[0]} / {r[2].split()[0]}" for r in rows[2:]}
    old, new = calls["9ea6946"], calls["179097a"]
    assert (f"tree-MTAD {old['tree_mtad']} → {new['tree_mtad']}, MTAD {old['mtad']} → {new['mtad']}, "
            f"beam SpecInfer {old['beam_specinfer']} → {new['beam_specinfer']}; SpD {new['spd']} and "
            f"SpecInfer {new['specinfer']} either side") in doc
    assert old["spd"] == new["spd"] and old["specinfer"] == new["specinfer"]


_DECODER_NAMES = {"spd": "SpD", "specinfer": "SpecInfer", "mcss": "MCSS", "spectr": "SpecTr", "mcns": "MCNS",
                  "beam_specinfer": "beam SpecInfer", "tree_mtad": "tree-MTAD", "mtad": "MTAD",
                  "typical": "typical acceptance", "bild": "BiLD", "bild_sampling": "BiLD (sampling)"}


def _new_old_rows(record: str, mode: str) -> dict[str, str]:
    """Each decoder's docs row from a commit-against-commit record's cells of ``mode`` (a setting
    suffix, "" for every row): new / old per setting, and for the decoders, their ratios to SpD
    old → new in parentheses (SpD: new / old with its interval)."""
    cells = {(r[0].rsplit("/", 1)[0], r[1]): r for r in _table(record, "| V") if r[0].endswith(mode)}
    sets = ["V32000/random", "V32000/equal", "V151936/random", "V151936/equal"]
    rows = {}
    for s, n in _DECODER_NAMES.items():
        row = [cells[(k, s)][2] if s == "spd" else
               f"{cells[(k, s)][2].split()[0]} ({cells[(k, s)][3].split()[0]} → {cells[(k, s)][4].split()[0]})"
               for k in sets]
        rows[s] = f"| {n} | " + " | ".join(row) + " |"
    return rows


def test_docs_quote_the_nucleus_and_session_records():
    """The nucleus section's table, floor spans and counts, and the session's verdict counts, are
    the records'."""
    bench = Path(__file__).resolve().parent.parent / "results/bench"
    doc = _doc()
    for s, row in _new_old_rows("compare_commits_nucleus_topp_cpu.md", "").items():
        assert row in doc, s

    def span(vals):
        return f"{min(vals):,.1f}-{max(vals):,.1f}"

    for name in ("draw_floor_topp_nucleus_cpu.md", "draw_floor_topp_in_situ_cpu.md"):
        rows = _table(name, "| V")
        r32, r15 = ([c for c in rows if c[0].startswith(v)] for v in ("V32000/", "V151936/"))
        for r in (r32, r15):
            assert span([float(c[2]) for c in r]) in doc and span([float(c[11]) for c in r]) in doc, name
    both = [c for c in _table("draw_floor_topp_nucleus_cpu.md", "| V")
            if c[10].startswith("floor alone misses") and c[14].startswith("misses")]
    assert f"The floor misses both ways in {len(both)} cells" in doc
    counts = (bench / "verdicts_session_cpu.md").read_text().split("### Cells by verdict and reason")[1]
    lines = [x for x in counts.splitlines() if x.startswith("| ") and not x.startswith(("| mode", "| ---"))]
    sec = doc.split("### The goals table after this session's changes")[1].split("###")[0]
    assert lines and all(x in sec for x in lines)


def test_docs_quote_the_session_offline_record():
    """The session's offline-pair paragraph: new / old, ratios to SpD and wall ratios are the record's."""
    _assert_offline_paragraph("compare_commits_offline5_session_humaneval_cpu.md", _doc())


def _assert_offline_paragraph(record: str, text: str) -> None:
    """An offline-pair paragraph in ``text`` quotes its commit-against-commit record: new / old, the
    ratios to SpD before and after, the wall-time range and the wall ratios to SpD."""
    cells = {r[1]: r for r in _table(record, "| humaneval")}
    names = {"tree_mtad": "tree-MTAD", "mtad": "MTAD", "specinfer": "SpecInfer", "mcss": "MCSS", "spd": "SpD"}
    assert ", ".join(f"{n} {cells[s][2]}" for s, n in names.items()) in text
    assert ", ".join(f"{n} {cells[s][3].split()[0]} → {cells[s][4].split()[0]}" for s, n in names.items()
                     if s != "spd") in text
    walls = [float(cells[s][5].split()[0]) for s in names]
    assert f"Wall time per token new / old {min(walls):.2f}-{max(walls):.2f}" in text
    assert ", ".join(f"{n} {cells[s][7].split()[0]}" for s, n in names.items() if s != "spd") in text


def test_docs_quote_the_host_beams_records():
    """The host-bookkeeping section: its plain-temperature table, call counts, on / off ratios,
    verdict counts and offline paragraph are the records'."""
    bench = Path(__file__).resolve().parent.parent / "results/bench"
    doc = _doc()
    sec = doc.split("### The beams' bookkeeping on the host, and the goals table again")[1].split("###")[0]
    for s, row in _new_old_rows("compare_commits_beam_host_modes_cpu.md", "/sample_nok").items():
        assert row in sec, s

    def calls(name):
        text = (bench / name).read_text().split("### the same calls less attribute reads")[1].split("###")[0]
        rows = [[c.strip() for c in x.strip().strip("|").split("|")] for x in text.splitlines()
                if x.startswith("| ") and not x.startswith(("| system", "| ---"))]
        return {r[0]: (r[1], r[2]) for r in rows}

    old, new = calls("torch_calls_plain_v32000_179097a_cpu.md"), calls("torch_calls_plain_v32000_2a2b63b_cpu.md")
    for s, n in (("tree_mtad", "tree-MTAD"), ("mtad", "MTAD"), ("beam_specinfer", "beam SpecInfer"),
                 ("specinfer", "SpecInfer")):
        assert f"{n} {old[s][0]} / {old[s][1]} → {new[s][0]} / {new[s][1]}" in sec, s
    assert f"SpD {new['spd'][0]} / {new['spd'][1]} either side" in sec and old["spd"] == new["spd"]
    paths = {d: {r[0]: r[1:] for r in _table(f"draw_paths_host_beams_v32000_{d}_cpu.md", "| ")}
             for d in ("random", "equal")}
    for i, n in ((2, "tree-MTAD"), (3, "MTAD"), (4, "beam SpecInfer")):
        assert (f"{n} {paths['random']['host_beams'][i].split()[0]} and "
                f"{paths['equal']['host_beams'][i].split()[0]}") in sec, n
    assert (f"{paths['random']['without'][1].split()[0]} and {paths['equal']['without'][1].split()[0]} there"
            in sec)
    counts = (bench / "verdicts_beam_host_cpu.md").read_text().split("### Cells by verdict and reason")[1]
    lines = [x for x in counts.splitlines() if x.startswith("| ") and not x.startswith(("| mode", "| ---"))]
    assert lines and all(x in sec for x in lines)
    _assert_offline_paragraph("compare_commits_offline5_beam_host_humaneval_cpu.md", sec)


def test_row_ops_split_the_time_outside_the_models(tmp_path, capsys):
    """``bench/row_ops.py``: per setting and system, the time outside the models split into row
    operations and a rest that make it up; the ratios are per token against SpD's; the verdict
    follows from them; SpD must come first and an unknown mode is refused in one line."""
    import row_ops

    out, js = tmp_path / "rows.md", tmp_path / "rows.json"
    row_ops.main(["--vocabs", "300", "--drafts", "equal,random", "--hidden", "16", "--draft-hidden", "16",
                  "--prompts", "2", "--max-new-tokens", "5", "--systems", "spd,tree_mtad,specinfer",
                  "--modes", "plain,greedy", "--out", str(out), "--json", str(js)])
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.read_text().splitlines()
            if line.startswith("| V300/")]
    assert [r[:2] for r in rows[:3]] == [["V300/equal/plain", s] for s in ("spd", "tree_mtad", "specinfer")]
    assert len(rows) == 12
    data = json.loads(js.read_text())
    for r in rows:
        c = data[r[0]][r[1]]
        assert c["rows_step"] > 0 and c["row_calls_step"] > 0 and c["steps"] > 0  # the clock saw row operations
        spd = data[r[0]]["spd"]
        all_x, rest_x = c["outside_token"] / spd["outside_token"], c["rest_token"] / spd["rest_token"]
        assert (r[7], r[8]) == (f"{all_x:.2f}", f"{rest_x:.2f}")
        assert r[9] == ("reference" if r[1] == "spd" else row_ops.verdict(all_x, rest_x))
    assert row_ops.verdict(1.4, 9) == "within the goal"
    assert row_ops.verdict(1.6, 1.4) == "faster row kernels could close it"
    assert row_ops.verdict(1.6, 1.55) == "the rest alone misses: no row kernel closes it"
    for bad, msg in ((["--systems", "tree_mtad,spd"], "name spd first"), (["--modes", "hot"], "unknown hot")):
        with pytest.raises(SystemExit):
            row_ops.main(bad)
        err = capsys.readouterr().err.strip().splitlines()
        assert msg in err[-1] and ": error: --" in err[-1], err


def test_the_row_op_clock_counts_only_row_operations_outside_the_models():
    """``RowOpClock``: an operation on a whole vocabulary row or most of one is timed; a view of
    one, an operation on under half a row's entries and one inside a model pass are not."""
    import row_ops

    fwd = type("F", (), {"depth": 0})()
    clock = row_ops.RowOpClock(50, lambda: fwd.depth > 0, lambda: "here")
    import torch

    x = torch.randn(2, 50)
    with clock:
        x.softmax(-1)  # timed
        x[0]  # a view
        torch.randn(20).exp()  # under half a row
        x[0, :30].exp()  # most of a row (a block-wise pass over a row cut short)
        fwd.depth = 1
        x.softmax(-1)  # inside a pass
        fwd.depth = 0
        torch.zeros(3, 50)  # a fresh row: its result holds whole rows
    assert clock.calls == 3 and clock.seconds > 0 and dict(clock.by) == {"here": clock.seconds}


_ROW_OPS_NAMES = {"specinfer": "SpecInfer", "mcss": "MCSS", "spectr": "SpecTr", "beam_specinfer": "beam SpecInfer",
                  "tree_mtad": "tree-MTAD", "mtad": "MTAD"}
_GLUE_PARTS = {
    "drafting": ("chain drafting", "chain draws", "tree drafting", "draft rows warped", "tree draws", "beam drafting",
                 "beam draws"),
    "verification": ("chain verification", "multi-draft verification", "walk", "walk: supports merged",
                     "walk: outcome drawn", "walk: rule updates", "walk: SpecTr rho", "walk: correction or bonus",
                     "target rows warped (lazily)", "target pass's scores", "threshold verification"),
    "runner": ("runner around a pass", "runner after a step (cache kept)"),
    "rest": ("rest",),
}


def _phase_split(name: str) -> tuple[list[str], dict[str, list[tuple[float, float]]]]:
    """A ``bench/phases.py --rows`` record's split table: its systems, and per phase (glue, row ops) per system."""
    text = (Path(__file__).resolve().parent.parent / "results/bench" / name).read_text().split("### Each phase")[1]
    rows = [[c.strip() for c in x.strip().strip("|").split("|")] for x in text.splitlines() if x.startswith("| ")]
    systems = rows[0][1:]
    return systems, {r[0]: [tuple(float(v) for v in c.split(" + ")) for c in r[1:]] for r in rows[2:]}


def _row_ops_doc_parts() -> dict[str, str]:
    """What docs/speed.md's row-ops section quotes, computed from the records."""
    bench = Path(__file__).resolve().parent.parent / "results/bench"
    rows = _table("row_ops_cpu.md", "| V")
    cell = {(r[0], r[1]): r for r in rows}
    modes = ("greedy", "topk10", "plain", "topp0.9")
    tally = ["| mode | cells above the goal | the rest alone misses | a row kernel could close it |",
             "| --- | ---: | ---: | ---: |"]
    for m in modes:
        mine = [r for r in rows if r[0].endswith("/" + m) and r[1] != "spd" and r[9] != "within the goal"]
        tally.append(f"| {m} | {len(mine)} | {sum(r[9].startswith('the rest alone') for r in mine)} | "
                     f"{sum(r[9].startswith('faster row kernels') for r in mine)} |")
    sets = [f"V{v}/{d}/plain" for v in (32000, 151936) for d in ("random", "equal")]
    plain = [f"| {n} | " + " | ".join(f"{cell[(st, s)][7]} → {cell[(st, s)][8]}" for st in sets) + " |"
             for s, n in _ROW_OPS_NAMES.items()]
    shares = [int(cell[(st, "spd")][4].split("(")[1].rstrip("%)")) for st in sets]
    verdicts = (bench / "verdicts_row_ops_cpu.md").read_text().split("### Cells by verdict and reason")[1]
    vlines = [x for x in verdicts.splitlines() if x.startswith("| ") and "harness" in x]
    systems, split = _phase_split("phases_rows_plain_v32000_equal_cpu.md")
    names = {"spd": "SpD", **_ROW_OPS_NAMES}
    table = []
    for i, s in enumerate(systems):
        parts = [sum(split[p][i][0] for p in ps if p in split) for ps in _GLUE_PARTS.values()]
        table.append(f"| {names[s]} | " + " | ".join(f"{x:.3f}" for x in parts)
                     + f" | {split['outside the models, all'][i][0]:.3f} |")
    big = _phase_split("phases_rows_plain_v151936_equal_cpu.md")[1]
    data = json.loads((bench / "row_ops_cpu.json").read_text())
    cuts = []
    for s, n in (("tree_mtad", "tree-MTAD"), ("mtad", "MTAD"), ("specinfer", "SpecInfer"), ("beam_specinfer", "beam SpecInfer")):
        got = []
        for st in sets:
            c, spd = data[st][s], data[st]["spd"]
            if c["outside_token"] / spd["outside_token"] > 1.5:
                allowed = 1.5 * spd["outside_token"] - (c["outside_token"] - c["rest_token"])
                got.append(round(100 * (1 - allowed / c["rest_token"])))
        cuts.append(f"{n} {min(got)}-{max(got)}%")
    replica = [r for r in _table("row_ops_plain_seed157_cpu.md", "| V") if r[1] != "spd"]
    above = [r for r in replica if r[9] != "within the goal"]
    missed = sum(r[9].startswith("the rest alone misses") for r in above)
    return {"REPLICA": f"of its {len(replica)} cells, {len(above)} are above the goal and the rest alone misses in "
                       f"{missed} of them",
            "GLUE_CUTS": ", ".join(cuts),"ROW_OPS_TALLY": "\n".join(tally), "ROW_OPS_PLAIN": "\n".join(plain),
            "ROW_OPS_SPD_SHARE": f"{min(shares)}-{max(shares)}%", "VERDICT_TALLY": "\n".join(
                ["| mode | verdict: reason | cells |", "| --- | --- | ---: |", *vlines]),
            "PHASES_TABLE": "\n".join(table), "RUNNER_32": f"{split['runner around a pass'][0][0]:.3f}",
            "RUNNER_151": f"{big['runner around a pass'][0][0]:.3f}",
            "GLUE_32": f"{split['outside the models, all'][0][0]:.3f}",
            "GLUE_151": f"{big['outside the models, all'][0][0]:.3f}"}


def test_docs_quote_the_row_ops_records():
    """docs/speed.md's row-ops section: its tallies, plain-temperature table, SpD's share, verdict
    counts and glue table are the row-ops, verdicts and phases records'."""
    sec = _doc().split("### Row operations or glue: what a faster row kernel could buy")[1].split(" ### ")[0]
    for key, text in _row_ops_doc_parts().items():
        assert " ".join(text.split()) in sec, key
    _, split = _phase_split("phases_rows_plain_v32000_equal_cpu.md")
    i = _phase_split("phases_rows_plain_v32000_equal_cpu.md")[0].index("tree_mtad")
    draft = [sum(split[p][j][0] for p in _GLUE_PARTS["drafting"] if p in split) for j in (0, i)]
    whole = [split["outside the models, all"][j][0] for j in (0, i)]
    assert f"{draft[1] - draft[0]:.3f} of its {whole[1] - whole[0]:.3f} more" in sec
    rows = _table("row_ops_cpu.md", "| V")
    plain = [r for r in rows if r[0].endswith("/plain") and r[1] in _ROW_OPS_NAMES]
    rises = sum(float(r[8]) > float(r[7]) for r in plain)
    assert f"their ratios rise in {rises} of these {len(plain)} cells" in sec
    # the cells the prose names as ones a faster row kernel could close, and no other
    kernel = {(r[0], r[1]) for r in rows if r[9] == "faster row kernels could close it"}
    assert kernel == {("V151936/random/topp0.9", "tree_mtad"), ("V151936/equal/topp0.9", "tree_mtad"),
                      ("V151936/random/topp0.9", "specinfer"), ("V151936/random/topp0.9", "spectr"),
                      ("V151936/random/greedy", "beam_specinfer"), ("V151936/random/greedy", "tree_mtad"),
                      ("V151936/random/greedy", "mtad"), ("V151936/equal/greedy", "tree_mtad"),
                      ("V151936/equal/topk10", "tree_mtad")}
    assert "The cells a faster row kernel could close are all at 151,936 tokens" in sec
    names, small = _phase_split("phases_rows_plain_v32000_equal_cpu.md")
    big = _phase_split("phases_rows_plain_v151936_equal_cpu.md")[1]
    assert all(big[p][i][0] >= small[p][i][0] for p in small for i in range(len(names)))
    growth = [big["runner around a pass"][i][0] / small["runner around a pass"][i][0] for i in range(len(names))]
    assert f"grows {min(growth):.1f}-{max(growth):.1f}x for every decoder here" in sec


@pytest.mark.parametrize("name,cells", [("row_ops_cpu", 16 * 11), ("row_ops_plain_seed157_cpu", 4 * 7),
                                        ("row_ops_lean_loop_cpu", 16 * 11)])
def test_the_committed_row_ops_records_follow_from_their_numbers(name, cells):
    """The committed row-ops records: each row's per-step numbers, ratios and verdict are its JSON's."""
    import row_ops

    data = json.loads((Path(__file__).resolve().parent.parent / f"results/bench/{name}.json").read_text())
    rows = _table(f"{name}.md", "| V")
    assert len(rows) == cells
    for r in rows:
        c, spd = data[r[0]][r[1]], data[r[0]]["spd"]
        all_x, rest_x = c["outside_token"] / spd["outside_token"], c["rest_token"] / spd["rest_token"]
        assert r[2:9] == [f"{c['tokens_per_step']:.2f}", f"{c['outside_step']:.3f}",
                          f"{c['rows_step']:.3f} ({c['rows_step'] / c['outside_step']:.0%})",
                          f"{c['row_calls_step']:.1f}", f"{c['rest_step']:.3f}", f"{all_x:.2f}", f"{rest_x:.2f}"], r
        assert r[9] == ("reference" if r[1] == "spd" else row_ops.verdict(all_x, rest_x)), r


def test_the_committed_row_ops_verdicts_recompute_from_their_records():
    """``results/bench/verdicts_row_ops_cpu.md`` is ``bench/verdicts.py``'s join of last round's goals
    tables and floors with the row-ops record."""
    import verdicts

    bench = Path(__file__).resolve().parent.parent / "results/bench"
    goals = [(bench / "compare_commits_beam_host_modes_cpu_goals_2a2b63bb89.md", None),
             (bench / "compare_commits_beam_host_topp_cpu_goals_2a2b63bb89.md", None)]
    floors = [bench / n for n in ("draw_floor_in_situ_cpu.md", "draw_floor_topp_nucleus_cpu.md",
                                  "beam_floor_root_row_cpu.md")]
    assert verdicts.render(goals, floors, bench / "row_ops_cpu.md") == (bench / "verdicts_row_ops_cpu.md").read_text()


def test_phases_rows_split_each_phase_into_glue_and_row_operations(tmp_path):
    """``bench/phases.py --rows``: a second table splits each phase into its glue and its row
    operations, charged to the phase they run in (draws read rows; the runner's work around a
    pass, views of the logits, does not); the wrappers are taken off again."""
    import phases

    import mtad.propose.beam as bm

    before = bm._slot_then_row_host
    out = tmp_path / "phases.md"
    phases.main(["--vocab", "3000", "--hidden", "16", "--draft-hidden", "16", "--prompts", "1",
                 "--max-new-tokens", "6", "--systems", "spd,tree_mtad", "--rows", "--out", str(out)])
    assert bm._slot_then_row_host is before
    text = out.read_text().split("### Each phase less its operations on vocabulary rows")[1]
    rows = {r[0]: [tuple(float(v) for v in c.split(" + ")) for c in r[1:]]
            for r in ([c.strip() for c in x.strip().strip("|").split("|")] for x in text.splitlines()
                      if x.startswith("| ") and not x.startswith(("| phase", "| ---")))}
    assert rows["chain draws"][0][1] > 0 and rows["beam draws"][1][1] > 0
    assert rows["chain draws"][1] == (0.0, 0.0) and rows["beam draws"][0] == (0.0, 0.0)
    assert rows["runner around a pass"][0][1] == 0 and rows["runner around a pass"][1][1] == 0
    assert rows["threshold verification"][1][0] > 0


def _verdict_cells(name: str) -> dict[tuple[str, str], str]:
    """A committed verdicts record's cells: (setting, decoder) -> "ratio verdict [reason]"."""
    out, hdr = {}, None
    for line in (Path(__file__).resolve().parent.parent / "results/bench" / name).read_text().splitlines():
        if line.startswith("| decoder |"):
            hdr = [c.strip() for c in line.strip().strip("|").split("|")]
        elif hdr and line.startswith("| ") and not line.startswith("| ---"):
            c = [x.strip() for x in line.strip().strip("|").split("|")]
            out.update(((h, c[0]), v) for h, v in zip(hdr[1:], c[1:]))
        elif not line.startswith("|"):
            hdr = None
    return out


def test_the_lean_loop_verdicts_recompute_from_their_records():
    """Both lean-loop verdicts records are ``bench/verdicts.py``'s of the run's goals tables, one per commit."""
    import verdicts

    bench = Path(__file__).resolve().parent.parent / "results/bench"
    floors = [bench / n for n in ("draw_floor_in_situ_cpu.md", "draw_floor_topp_nucleus_cpu.md",
                                  "beam_floor_root_row_cpu.md")]
    for commit, name in (("3ec2475d5f", "verdicts_lean_loop_cpu.md"), ("d34d0e4bdc", "verdicts_lean_loop_before_cpu.md")):
        goals = [(bench / f"compare_commits_lean_loop_{m}_cpu_goals_{commit}.md", None) for m in ("modes", "topp")]
        assert verdicts.render(goals, floors) == (bench / name).read_text()
    goals = [(bench / f"compare_commits_lean_loop_{m}_cpu_goals_3ec2475d5f.md", None) for m in ("modes", "topp")]
    assert (verdicts.render(goals, floors, bench / "row_ops_lean_loop_cpu.md")
            == (bench / "verdicts_lean_loop_row_ops_cpu.md").read_text())


def test_docs_quote_the_lean_loop_records():
    """The lean-loop section: its plain-temperature table, the spans and claims its prose states,
    the verdict counts, every cell whose verdict differs between the two commits (and no other),
    and the offline paragraph are the records'."""
    bench = Path(__file__).resolve().parent.parent / "results/bench"
    sec = _doc().split("### One loop for beam drafting on the CPU, and the beams' history as lists")[1].split("###")[0]
    for s, row in _new_old_rows("compare_commits_lean_loop_modes_cpu.md", "/sample_nok").items():
        assert row in sec, s
    plain: dict[tuple[str, str], list[list[str]]] = {}  # (vocabulary, decoder) -> its two drafts' cells
    for r in _table("compare_commits_lean_loop_modes_cpu.md", "| V"):
        if r[0].endswith("/sample_nok"):
            plain.setdefault((r[0].split("/")[0], r[1]), []).append(r)
    topp = _table("compare_commits_lean_loop_topp_cpu.md", "| V")

    def span(cells):
        vals = [float(c[2].split()[0]) for c in cells]
        return f"{min(vals):.2f}-{max(vals):.2f}"

    def at(vocab, systems):
        return [c for s in systems for c in plain[(vocab, s)]]

    beam = ("beam_specinfer", "tree_mtad", "mtad")
    assert f"SpD's own new / old is {span(at('V32000', ['spd']))} there" in sec
    assert f"which run no changed path, {span(at('V32000', ['typical', 'bild', 'bild_sampling']))}" in sec
    assert (f"new / old is {span(at('V32000', beam))} at 32,000 tokens and "
            f"{span(at('V151936', beam))} at 151,936 (SpD {span(at('V151936', ['spd']))})") in sec
    falls = at("V32000", beam) + at("V151936", beam)
    assert len(falls) == 12 and all(float(c[4].split()[0]) < float(c[3].split()[0]) for c in falls)
    assert min(float(c[4].split()[0]) for c in falls if c[1] == "beam_specinfer") > 2
    assert (f"their new / old is {span([c for c in topp if c[1] in beam])} against SpD's "
            f"{span([c for c in topp if c[1] == 'spd'])}") in sec
    again = _table("compare_commits_lean_loop_plain_seed179_cpu.md", "| V")
    assert len(again) == 4 * 11
    assert (f"SpD's new / old is {span([c for c in again if c[1] == 'spd'])} there, the beam decoders' "
            f"{span([c for c in again if c[1] in beam])}") in sec
    assert all(float(c[4].split()[0]) < float(c[3].split()[0]) for c in again if c[1] in beam)
    for s, n in (("tree_mtad", "tree-MTAD"), ("mtad", "MTAD"), ("beam_specinfer", "beam SpecInfer")):
        old = [float(c[3].split()[0]) for c in again if c[1] == s]
        new = [float(c[4].split()[0]) for c in again if c[1] == s]
        assert f"{n} {min(old):.2f}-{max(old):.2f} → {min(new):.2f}-{max(new):.2f}" in sec, s
    for commit in ("d34d0e4bdc", "3ec2475d5f"):  # "None of those cells is met in either commit's goals table"
        goals = _table(f"compare_commits_lean_loop_plain_seed179_cpu_goals_{commit}.md", "| V")
        verdicts_of = [r[3] for r in goals if len(r) > 3 and r[1] in beam]
        assert len(verdicts_of) == 12 and "met" not in verdicts_of, commit
    counts = (bench / "verdicts_lean_loop_cpu.md").read_text().split("### Cells by verdict and reason")[1]
    lines = [x for x in counts.splitlines() if x.startswith("| ") and not x.startswith(("| mode", "| ---"))]
    assert lines and all(x in sec for x in lines)
    before, after = _verdict_cells("verdicts_lean_loop_before_cpu.md"), _verdict_cells("verdicts_lean_loop_cpu.md")
    assert before.keys() == after.keys() and len(before) == 4 * 4 * 10  # every decoder but SpD
    changed = [k for k in before if before[k].split()[1:] != after[k].split()[1:]]
    listed = [r for r in sec.split("| --- | --- | --- | --- |")[1].split(" Typical")[0].split("|") if r.strip()]
    assert len(listed) == 4 * len(changed) and changed
    for setting, s in changed:
        assert f"| {setting} | {_DECODER_NAMES[s]} | {before[(setting, s)]} | {after[(setting, s)]} |" in sec
    joined = (bench / "verdicts_lean_loop_row_ops_cpu.md").read_text().split("### Cells by verdict and reason")[1]
    harness = [x for x in joined.splitlines() if x.startswith("| ") and "harness" in x]
    assert harness and all(x in sec for x in harness)
    assert not any(x.startswith("| plain |") and "could close" in x for x in harness)  # "no harness cell ... could close"
    _assert_offline_paragraph("compare_commits_offline5_lean_loop_humaneval_cpu.md", sec)


def test_the_target_rows_verdicts_recompute_from_their_records():
    """Both target-rows verdicts records are ``bench/verdicts.py``'s of the session's goals tables,
    one per commit, with the floors that count the target's rows."""
    import verdicts

    bench = Path(__file__).resolve().parent.parent / "results/bench"
    floors = [bench / n for n in ("draw_floor_target_rows_cpu.md", "draw_floor_topp_target_rows_cpu.md",
                                  "beam_floor_root_row_cpu.md")]
    for commit, name in (("4ee1573aa2", "verdicts_target_rows_cpu.md"),
                         ("377e04ef0e", "verdicts_target_rows_before_cpu.md")):
        goals = [(bench / f"compare_commits_target_rows_{m}_cpu_goals_{commit}.md", None) for m in ("modes", "topp")]
        assert verdicts.render(goals, floors) == (bench / name).read_text()
    # the same cells with what the last row-ops record says of each harness cell (docs/speed.md's summary)
    goals = [(bench / f"compare_commits_target_rows_{m}_cpu_goals_4ee1573aa2.md", None) for m in ("modes", "topp")]
    assert verdicts.render(goals, floors, bench / "row_ops_lean_loop_cpu.md") == \
        (bench / "verdicts_target_rows_row_ops_cpu.md").read_text()


def test_docs_quote_the_target_rows_records():
    """The target-rows section: its top-p table, the spans and claims its prose states, the floor
    records' target rows, costs and the one cell they move, the verdict counts, and every cell
    whose verdict differs between the two commits (and no other) are the records'."""
    bench = Path(__file__).resolve().parent.parent / "results/bench"
    sec = _doc().split("### The target's rows: read only where a rule reads them at top-p")[1].split("###")[0]
    for s, row in _new_old_rows("compare_commits_target_rows_topp_cpu.md", "/sample_nok").items():
        assert row in sec, s
    cells = {(r[0].split("/")[0] + "/" + r[0].split("/")[1], r[1]): r
             for r in _table("compare_commits_target_rows_topp_cpu.md", "| V")}
    cols = ["V32000/random", "V32000/equal", "V151936/random", "V151936/equal"]

    def new_old(col, s):
        return float(cells[(col, s)][2].split()[0])

    def span(vals, fmt="{:.2f}"):
        return f"{fmt.format(min(vals))}-{fmt.format(max(vals))}"

    tree = [new_old(c, "tree_mtad") for c in cols]
    assert f"Tree-MTAD's new / old is {span(tree)}" in sec
    lowest = [all(new_old(c, "tree_mtad") < new_old(c, s) for s in _DECODER_NAMES if s != "tree_mtad") for c in cols]
    assert lowest.count(True) == 3 and new_old(cols[lowest.index(False)], "spd") == new_old(cols[lowest.index(False)],
                                                                                           "tree_mtad")
    ratio = [(float(cells[(c, "tree_mtad")][3].split()[0]), float(cells[(c, "tree_mtad")][4].split()[0])) for c in cols]
    assert sum(n < o for o, n in ratio) == 3 and ratio[2][0] == ratio[2][1] == 1.74
    assert f"SpD itself gained at 151,936 tokens ({span([new_old(c, 'spd') for c in cols[2:]])})" in sec
    assert f"not at 32,000 ({span([new_old(c, 'spd') for c in cols[:2]])}" in sec
    unchanged = [s for s in _DECODER_NAMES if s not in ("spd", "tree_mtad", "mtad")]
    assert len(unchanged) == 8 and f"at {span([new_old(c, s) for c in cols[:2] for s in unchanged])} there" in sec
    for c in cols[2:]:  # "every other decoder's ratio at 151,936 tokens rose"
        for s in _DECODER_NAMES:
            if s not in ("spd", "tree_mtad"):
                assert float(cells[(c, s)][4].split()[0]) > float(cells[(c, s)][3].split()[0]), (c, s)
    plain, topp = _table("draw_floor_target_rows_cpu.md", "| V"), _table("draw_floor_topp_target_rows_cpu.md", "| V")

    def needed(r):
        return float(r[15].split()[0])

    assert f"Tree-MTAD normalises {span([needed(r) for r in plain if r[1] == 'tree_mtad'])} target rows" in sec
    assert f"and {span([needed(r) for r in topp if r[1] == 'tree_mtad'])} at top-p" in sec
    assert f"every other decoder {span([needed(r) for r in plain + topp if r[1] != 'tree_mtad'])}" in sec
    assert f"SpD {span([float(r[15].split('(')[1].rstrip(')')) for r in plain + topp])}" in sec
    for rows, at in ((plain, "14.6-14.9 µs at 32,000 tokens and 67.1-67.2 µs at 151,936"),
                     (topp, "262.9-264.1 µs and 736.5-774.4 µs at top-p")):
        assert at in sec
        lo = span([float(r[16]) for r in rows if r[0].startswith("V32000/")], "{:.1f}")
        hi = span([float(r[16]) for r in rows if r[0].startswith("V151936/")], "{:.1f}")
        assert lo in at and hi in at
    moved = [r for r in plain + topp if r[19].startswith("misses with") and r[14].startswith("reachable")]
    assert [(r[0], r[1]) for r in moved] == [("V151936/equal/topp0.9", "tree_mtad")]
    assert f"are {moved[0][18]} x SpD's overhead" in sec
    assert f"floor with the target's rows is {span([float(r[18]) for r in plain if r[1] == 'tree_mtad'])} x" in sec
    assert f"SpD at {span([float(r[6]) for r in topp if r[0].startswith('V32000/')], '{:.3f}')} ms per token" in sec
    old = _table("draw_floor_topp_nucleus_cpu.md", "| V")
    assert f"run's {span([float(r[6]) for r in old if r[0].startswith('V32000/')], '{:.3f}')}" in sec
    counts = (bench / "verdicts_target_rows_cpu.md").read_text().split("### Cells by verdict and reason")[1]
    lines = [x for x in counts.splitlines() if x.startswith("| ") and not x.startswith(("| mode", "| ---"))]
    assert lines and all(x in sec for x in lines)
    before, after = _verdict_cells("verdicts_target_rows_before_cpu.md"), _verdict_cells("verdicts_target_rows_cpu.md")
    assert before.keys() == after.keys() and len(before) == 4 * 4 * 10
    changed = [k for k in before if before[k].split()[1:] != after[k].split()[1:]]
    listed = [r for r in sec.split("| --- | --- | --- | --- |")[1].split(" 4ee1573 changed no path")[0].split("|")
              if r.strip()]
    assert len(listed) == 4 * len(changed) and changed
    for setting, s in changed:
        assert f"| {setting} | {_DECODER_NAMES[s]} | {before[(setting, s)]} | {after[(setting, s)]} |" in sec
    assert [k for k in changed if k[0].endswith("topp0.9")] == [("V32000/random/topp0.9", "tree_mtad")]
    assert after[("V151936/equal/topp0.9", "tree_mtad")].endswith("T")


def test_docs_quote_the_one_call_record():
    """The one-call paragraph's spans are its record's, four settings per decoder."""
    rows = _table("compare_commits_one_call_topp_cpu.md", "| V")
    sec = _doc().split("0d2b6d4 then warps every wanted row at top-p")[1].split("###")[0]

    def span(s):
        v = [float(r[2].split()[0]) for r in rows if r[1] == s]
        assert len(v) == 4, s
        return f"{min(v):.2f}-{max(v):.2f}"

    assert (f"new / old {span('mtad')} for MTAD and {span('tree_mtad')} for tree-MTAD, against SpD's "
            f"{span('spd')} and typical acceptance's {span('typical')}") in sec


def test_docs_speed_summary_is_generated_from_the_committed_records():
    """``docs/speed.md``'s summary block is what ``bench/speed_summary.py`` makes of the records it names."""
    import re

    import speed_summary

    root = Path(__file__).resolve().parent.parent
    doc = (root / "docs/speed.md").read_text()
    block = speed_summary.BEGIN + doc.split(speed_summary.BEGIN, 1)[1].split(speed_summary.END, 1)[0] \
        + speed_summary.END
    m = re.search(r"--verdicts (\S+) --offline (\S+)`", block)
    assert m, "the block names its records"
    names = (m[1], m[2])
    assert block == speed_summary.summary(root / names[0], root / names[1], names)


def _summary_fixture(tmp_path):
    """A verdicts record, the goals table it names and that table's kept runs (six prompts a cell),
    and an offline record: specinfer missed at plain 32,000 (H) and greedy (†), unresolved at the
    other two (H); typical met everywhere, at plain 32,000 only by its own interval (two-sided p
    about 0.009, above 5% once Holm multiplies it); mtad unresolved everywhere."""
    from mtad.core import stats

    base = [0.01 * (1 + 0.1 * p) for p in range(6)]
    near = [1.3, 1.4, 1.5, 1.5, 1.6, 1.7]
    factors = {("V32000/equal/sample_nok", "specinfer"): ([2.0, 2.1, 2.2, 2.0, 2.1, 2.2], "H"),
               ("V151936/random/sample_nok", "specinfer"): (near, "H"),
               ("V32000/equal/greedy", "specinfer"): ([1.9, 2.0, 1.9, 2.0, 1.9, 2.0], "†"),
               ("V151936/random/greedy", "specinfer"): (near, "H"),
               ("V32000/equal/sample_nok", "typical"): ([1.2, 1.25, 1.3, 1.3, 1.35, 1.62], ""),
               **{(s, "typical"): ([1.0, 1.05, 1.1, 1.0, 1.05, 1.1], "") for s in
                  ("V151936/random/sample_nok", "V32000/equal/greedy", "V151936/random/greedy")},
               **{(s, "mtad"): (near, "H") for s in ("V32000/equal/sample_nok", "V151936/random/sample_nok",
                                                      "V32000/equal/greedy", "V151936/random/greedy")}}
    rows = []
    for (setting, system), (f, _) in factors.items():
        for p, b in enumerate(base):
            rows.append(dict(setting=setting, system=system, prompt=p, repeat=0, overhead=b * f[p], tokens=1, steps=1))
    for setting in dict.fromkeys(s for s, _ in factors):
        rows += [dict(setting=setting, system="spd", prompt=p, repeat=0, overhead=b, tokens=1, steps=1)
                 for p, b in enumerate(base)]
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "c0ffee_0.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "g_goals_c0ffee.md").write_text(
        "# g\n\nsample = T 1 top-k 10 top-p 1, sample_nok = T 1 top-p 1 without top-k\n\n"
        "Goals of commit c0ffee: its 1 run(s) of `bench/compare_commits.py` pooled, from `kept/c0ffee_*.json`.\n")
    table = {}
    for (setting, system), (f, why) in factors.items():
        iv = stats.ratio_of_geometric_means([b * x for b, x in zip(base, f)], base)
        v = "met" if iv.high <= 1.5 else "missed" if iv.low > 1.5 else "unres"
        mode = "plain" if setting.endswith("sample_nok") else "greedy"
        cell = setting.replace("sample_nok", "plain")
        table.setdefault(mode, {}).setdefault(system, {})[cell] = f"{iv.estimate:.2f} {v}" + (f" {why}" if why else "")
    text = ("## Every goals cell, its verdict and why (`bench/verdicts.py`)\n\nx\n\n"
            "Goals tables: `g_goals_c0ffee.md`. Floors: `f.md`.\n")
    for mode in ("plain", "greedy"):
        cols = list(table[mode]["specinfer"])
        text += f"\n### {mode}\n\n| decoder | " + " | ".join(cols) + " |\n| --- |" + " ---: |" * len(cols) + "\n"
        text += "".join(f"| {s} | " + " | ".join(c[k] for k in cols) + " |\n" for s, c in table[mode].items())
    text += "\n### Cells by verdict and reason\n\n| mode | x | 1 |\n"
    rec = tmp_path / "v.md"
    rec.write_text(text)
    off = tmp_path / "o.md"
    off.write_text("# t\n\nCommand: `python bench/compare_commits.py --old a --new b1 --bench speed -- "
                   "temperature=1 top_k=0 top_p=1.0 --tasks humaneval:0-4`\n\n| setting | system | a | b | c | d | e | f |\n"
                   "| --- | --- | --- | --- | --- | --- | --- | --- |\n"
                   "| humaneval/sample | spd | 0.9 [0.8, 1.0] | 1.00 | 1.00 | 1 | 1.00 | 1.00 |\n"
                   "| humaneval/sample | specinfer | 0.9 [0.8, 1.0] | 1.2 | 1.28 [1.07, 1.54] | 1 | 1 | 1.20 [1.02, 1.47] |\n")
    return rec, off


def test_speed_summary_reads_every_cell_adjusts_them_and_refuses_what_it_cannot_read(tmp_path):
    """Spans and tallies come from the record's cells, each verdict Holm-adjusted over every cell from
    the kept runs (a cell met only by its own interval becomes ``?``; an unresolved one keeps its
    letter with ``?``); a record whose cell its kept runs do not give, a cell it cannot parse, a
    record of another script or an offline record not at plain temperature is refused in one line."""
    import speed_summary

    rec, off = _summary_fixture(tmp_path)
    text = speed_summary.summary(rec, off, ("v.md", "o.md"))
    table: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("| "):
            table.setdefault(line.split(" | ")[0], line)  # the tiny pair's table comes first
    assert table["| specinfer"] == "| specinfer | 1.49-1.95: 1 †, 1 H? | 1.49-2.10: 1 H, 1 H? |"
    assert table["| typical"] == "| typical | 1.05: 2 met | 1.05-1.33: 1 met, 1 ? |"
    assert table["| mtad"] == "| mtad | 1.49: 2 H? | 1.49: 2 H? |"
    assert "greedy, 2 of 6 (2); plain, 1 of 6 (2)" in text
    assert "5 of the 5 decided cells have every resample on one side" in text
    assert "leaves 1 cell(s) unresolved that the record decides: typical at V32000/equal/plain (met)" in text
    assert "over all 12 cells" in text and "over its 6 prompts" in text
    assert "32,000 and 151,936 tokens, equal and random drafts" in text
    assert "| specinfer | 1.28 [1.07, 1.54] | 1.20 [1.02, 1.47] |" in text and "at b1:" in text
    assert "(† tokens per step; H harness)" in text
    for old, new, match in (("2.10 missed H", "2.19 missed H", "its kept runs give"),
                            ("2.10 missed H", "2.10 maybe", "is not 'ratio verdict")):
        bad = tmp_path / "bad.md"
        bad.write_text(rec.read_text().replace(old, new, 1))
        assert bad.read_text() != rec.read_text()
        with pytest.raises(SystemExit, match=match):
            speed_summary.summary(bad, off, ("bad.md", "o.md"))
    rows_rec = tmp_path / "vr.md"  # a record with the row-ops letters: g on one harness cell
    rows_rec.write_text(rec.read_text().replace("2.10 missed H", "2.10 missed Hg").replace(
        "Floors: `f.md`.", "Floors: `f.md`. Row operations: `r.md` (harness cells: g the rest alone misses)."))
    with pytest.raises(SystemExit, match="its row-ops record r.md is not beside it"):
        speed_summary.summary(rows_rec, off, ("vr.md", "o.md"))
    (tmp_path / "r.md").write_text("## row ops\n\nMachine: x; git 5eed123.\n")
    text = speed_summary.summary(rows_rec, off, ("vr.md", "o.md"))
    assert "| specinfer | 1.49-1.95: 1 †, 1 H? | 1.49-2.10: 1 H?, 1 Hg |" in text
    assert "second letter from `r.md` (other prompts, at 5eed123): g the rest alone misses)" in text
    assert "(goals at c0ffee)" in text
    assert "With g, the row-ops run found" in text and "k row kernels" not in text
    with pytest.raises(SystemExit, match="not a bench/verdicts.py record"):
        speed_summary.summary(off, off, ("o.md", "o.md"))
    hot = tmp_path / "hot.md"
    hot.write_text(off.read_text().replace("top_k=0", "top_k=10"))
    with pytest.raises(SystemExit, match="not at plain temperature"):
        speed_summary.summary(rec, hot, ("v.md", "hot.md"))
    (tmp_path / "kept" / "c0ffee_0.json").unlink()
    with pytest.raises(SystemExit, match="kept runs kept/c0ffee_"):
        speed_summary.summary(rec, off, ("v.md", "o.md"))


def test_speed_summary_rewrites_only_its_block(tmp_path):
    import speed_summary

    doc = tmp_path / "d.md"
    doc.write_text(f"a\n{speed_summary.BEGIN}\nold\n{speed_summary.END}\nb\n")
    assert speed_summary.rewrite(doc, f"{speed_summary.BEGIN}\nnew\n{speed_summary.END}")
    assert doc.read_text() == f"a\n{speed_summary.BEGIN}\nnew\n{speed_summary.END}\nb\n"
    assert not speed_summary.rewrite(doc, f"{speed_summary.BEGIN}\nnew\n{speed_summary.END}")
    doc.write_text("no block\n")
    with pytest.raises(SystemExit, match="no <!-- speed-summary:begin -->"):
        speed_summary.rewrite(doc, "x")


def test_the_spd_rows_verdicts_recompute_and_the_docs_quote_them():
    """The SpD-rows section's table, drift span, count of risen ratios and met counts are its
    records'; both verdicts records are ``bench/verdicts.py``'s of their goals tables."""
    import verdicts

    bench = Path(__file__).resolve().parent.parent / "results/bench"
    floors = [bench / n for n in ("draw_floor_target_rows_cpu.md", "draw_floor_topp_target_rows_cpu.md",
                                  "beam_floor_root_row_cpu.md")]
    row_ops = bench / "row_ops_lean_loop_cpu.md"
    goals = [(bench / "compare_commits_target_rows_modes_cpu_goals_4ee1573aa2.md", {"greedy", "topk10"}),
             (bench / "compare_commits_spd_rows_plain_cpu_goals_4473dcc8c3.md", None),
             (bench / "compare_commits_target_rows_topp_cpu_goals_4ee1573aa2.md", None)]
    assert verdicts.render(goals, floors, row_ops) == (bench / "verdicts_spd_rows_cpu.md").read_text()
    before = [(bench / "compare_commits_spd_rows_plain_cpu_goals_ef0dd4c2db.md", None)]
    assert verdicts.render(before, floors[:1], row_ops) == (bench / "verdicts_spd_rows_before_cpu.md").read_text()
    sec = _doc().split("### SpD at plain temperature: its rows up to the first rejection too")[1].split("###")[0]
    for s, row in _new_old_rows("compare_commits_spd_rows_plain_cpu.md", "/sample_nok").items():
        assert row in sec, s
    cells = [r for r in _table("compare_commits_spd_rows_plain_cpu.md", "| V") if r[0].endswith("/sample_nok")]
    others = [float(r[2].split()[0]) for r in cells if r[1] != "spd"]
    rose = sum(float(r[4].split()[0]) > float(r[3].split()[0]) for r in cells if r[1] != "spd")
    assert f"the other decoders' new / old ({min(others):.2f}-{max(others):.2f})" in sec
    assert f"they rise in {rose} of the {len(others)} cells" in sec

    def met(name):
        return sum(v.split()[1] == "met" for (s, _), v in _verdict_cells(name).items() if s.endswith("/plain"))

    assert (f"{met('verdicts_spd_rows_before_cpu.md')} of 40 cells met before, "
            f"{met('verdicts_spd_rows_cpu.md')} of 40 after") in sec.replace("\n", " ")


def test_docs_quote_the_spd_rows_offline_record():
    """The SpD-rows section's offline sentence: SpD's new / old and the largest move of a ratio to SpD."""
    sec = _doc().split("### SpD at plain temperature: its rows up to the first rejection too")[1].split("###")[0]
    rows = _table("compare_commits_offline5_spd_rows_humaneval_cpu.md", "| humaneval")
    spd = next(r[2] for r in rows if r[1] == "spd")
    move = max(abs(float(r[4].split()[0]) - float(r[3].split()[0])) for r in rows if r[1] != "spd")
    assert f"new / old is {spd}" in sec.replace("\n", " ")
    assert f"move by at most {move:.2f}" in sec.replace("\n", " ")

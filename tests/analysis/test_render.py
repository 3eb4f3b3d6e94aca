"""Rendering: Table 2 from hand-made result files ("–" for missing, "n/a" for no energy meter,
speedups from the same sweep), figures, W&B logging, and the analysis notebook on smoke results."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

from mtad.analysis import render
from mtad.core.metrics import AXIS_LABELS
from mtad.run.provenance import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]

BASE = {
    "seed": 42,
    "gamma": 4,
    "tau": 0.5,
    "width": 4,
    "temperature": 1.0,
    "top_k": 10,
    "top_p": 0.9,
    "max_new_tokens": 16,
    "limit": 2,
    "warmup": 0,
    "perplexity": True,
}


def _ident(pair, task, decoder, **knobs):
    # a decoder's config holds the knobs it uses (its YAML interpolates them)
    return {
        "model": {"name": pair},
        "decoder": {"_target_": f"mtad.decoders.x.{decoder}", **knobs},
        "task": {"name": task},
        **BASE,
        **knobs,
    }


def write_point(
    sweep_dir: Path,
    h: str,
    pair: str,
    task: str,
    decoder: str,
    *,
    metrics=None,
    score=None,
    energy_source=None,
    skipped=None,
    failed=None,
    substitute=False,
    **knobs,
) -> None:
    d = sweep_dir / h
    ident = _ident(pair, task, decoder, **knobs)
    write_json_atomic(
        d / "point.json",
        {
            "hash": h,
            "choices": {"model": pair, "task": task, "decoder": decoder},
            "identity": ident,
        },
    )
    if metrics is not None:
        write_json_atomic(
            d / "summary.json",
            {
                "decoder": decoder,
                "task": task,
                "model": {"pair": pair},
                "config": {**ident, "output_dir": str(d)},
                "metrics": {"examples": 2, **metrics},
                "energy_source": energy_source,
                "data_substitute": substitute,
                **(
                    {"score": {"metric": "pass@1", "value": score, "stderr": 0.0}}
                    if score is not None
                    else {}
                ),
            },
        )
    if skipped:
        write_json_atomic(
            d / "skipped.json", {"hash": h, "reason": skipped, "kind": "task_unavailable"}
        )
    if failed:
        write_json_atomic(d / "error.json", {"hash": h, "reason": failed})


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    s = tmp_path / "sweeps" / "demo"
    m = {"perplexity": 3.0, "block_efficiency": 1.0, "j_per_token": None, "joules": None}
    write_point(
        s, "a1", "p", "humaneval", "multinomial", metrics={**m, "tokens_per_s": 10.0}, score=0.25
    )
    write_point(
        s,
        "a2",
        "p",
        "humaneval",
        "spd",
        metrics={**m, "tokens_per_s": 20.0, "block_efficiency": 2.5},
        score=0.25,
    )
    write_point(
        s,
        "a3",
        "p",
        "humaneval",
        "mtad",
        metrics={
            **m,
            "tokens_per_s": 30.0,
            "perplexity": 2.5,
            "block_efficiency": 3.2,
            "j_per_token": 0.125,
            "joules": 4.0,
        },
        score=0.5,
        energy_source="rapl",
    )
    write_point(s, "a4", "p", "humaneval", "tree_mtad", failed="ValueError: bug")
    write_point(
        s,
        "b1",
        "p",
        "mt_bench",
        "multinomial",
        metrics={**m, "tokens_per_s": 5.0, "perplexity": None},
    )
    write_point(
        s, "b2", "p", "mt_bench", "mtad", metrics={**m, "tokens_per_s": 15.0}, substitute=True
    )
    write_point(
        s, "c1", "p", "chatalpaca", "mtad", skipped="TaskUnavailable: no ChatAlpaca offline"
    )
    write_point(
        s, "zz", "p", "humaneval", "bild", metrics={**m, "tokens_per_s": 1.0}
    )  # stale: not in sweep.json
    write_json_atomic(
        s / "sweep.json",
        {
            "name": "demo",
            "points": [{"hash": h} for h in ("a1", "a2", "a3", "a4", "b1", "b2", "c1")],
        },
    )
    return s


def test_table2_cells_missing_na_and_speedups(sweep_dir):
    df = render.load_points(sweep_dir)
    assert set(df["hash"]) == {"a1", "a2", "a3", "a4", "b1", "b2", "c1"}  # stale "zz" left out
    assert len(render.load_points(sweep_dir, only_current=False)) == 8
    text, nums = render.table2(df)["p"]
    assert list(text.index) == ["multinomial", "spd", "mtad", "tree_mtad"]  # paper order
    he = lambda row, col: text.loc[row, ("humaneval", col)]  # noqa: E731
    assert (
        he("mtad", "tok/s") == "30.00"
        and he("mtad", "×MN") == "3.00×"
        and he("mtad", "×SpD") == "1.50×"
    )
    assert he("spd", "×MN") == "2.00×" and he("multinomial", "×MN") == "1.00×"
    assert he("mtad", "J/tok") == "0.125" and he("spd", "J/tok") == "n/a"  # meter vs no meter
    assert all(v == "–" for v in text.loc["tree_mtad", "humaneval"])  # failed point
    assert text.loc["mtad", ("mt_bench", "×SpD")] == "–"  # no SpD run for mt_bench
    assert text.loc["multinomial", ("mt_bench", "PPL")] == "–"  # metric absent, not 0
    assert text.loc["mtad", ("mt_bench", "score")] == "–"  # task without a scorer
    assert all(v == "–" for v in text.loc["mtad", "chatalpaca"])  # skipped point
    assert text.loc["spd", ("mt_bench", "tok/s")] == "–"  # never run
    assert (
        math.isnan(nums.loc["spd", ("mt_bench", "tok/s")])
        and nums.loc["mtad", ("humaneval", "×MN")] == 3.0
    )
    for cell in text.values.ravel():
        assert cell not in ("0", "0.00", "nan", "None")


def test_render_writes_markdown_latex_csv_and_figures(sweep_dir, tmp_path):
    out = tmp_path / "out"
    written = render.render(sweep_dir, out)
    assert {
        "table2.md",
        "table2.tex",
        "table2.csv",
        "points.csv",
        "pareto.png",
        "pareto_humaneval.png",
    } <= set(written)
    md = (out / "table2.md").read_text()
    assert _md_row(md, "humaneval", "mtad") == [
        "2",
        "0.500",
        "2.50",
        "30.00",
        "0.125",
        "3.20",
        "3.00×",
        "1.50×",
    ]
    assert "skipped (chatalpaca: mtad): TaskUnavailable: no ChatAlpaca offline" in md
    assert "failed (humaneval: tree_mtad): ValueError: bug" in md
    assert "stand-in data (not the paper's): mt_bench" in md
    tex = (out / "table2.tex").read_text()
    assert r"{mt\_bench}" in tex and r"3.00$\times$" in tex and "tree\\_mtad & -- &" in tex
    import pandas as pd

    csv = pd.read_csv(out / "table2.csv", keep_default_na=False)
    row = csv[csv["decoder"] == "mtad"].iloc[0]
    assert row["humaneval/speedup_multinomial"] == "3" and row["humaneval/j_per_token"] == "0.125"
    assert csv[csv["decoder"] == "spd"].iloc[0]["mt_bench/tokens_per_s"] == "–"
    points = pd.read_csv(out / "points.csv")
    assert points.set_index("hash").loc["c1", "status"] == "skipped"
    assert (out / "pareto_humaneval.png").stat().st_size > 1000


def _md_row(md: str, task: str, label: str) -> list[str]:
    """The cells of ``label``'s row in the Markdown block of ``task``."""
    block = md.split(f"### {task}", 1)[1].split("###", 1)[0]
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == label:
            return cells[1:]
    raise AssertionError(f"no row {label!r} under ### {task}")


def test_variants_and_ablation_plot(tmp_path):
    s = tmp_path / "abl"
    for i, g in enumerate((6, 2, 4)):  # rows come out in numeric order
        for dec, rate in (("spd", 10.0 + g), ("mtad", 12.0 + 2 * g)):
            write_point(
                s,
                f"{dec}{i}",
                "p",
                "humaneval",
                dec,
                gamma=g,
                metrics={"tokens_per_s": rate, "perplexity": 3.0, "block_efficiency": 1 + g / 4},
            )
    df = render.load_points(s, only_current=False)
    assert set(df["label"]) >= {"spd (gamma=2)", "mtad (gamma=6)"}
    assert render.varying_knobs(df) == ["gamma"]
    mt = df.set_index("label")
    assert mt.loc["mtad (gamma=4)", "speedup_spd"] == pytest.approx(
        20.0 / 14.0
    )  # SpD with the same gamma
    written = render.render(s, tmp_path / "out", only_current=False)
    assert "ablation_gamma.png" in written
    text, _ = render.table2(df)["p"]
    assert list(text.index) == [f"{d} (gamma={g})" for d in ("spd", "mtad") for g in (2, 4, 6)]


def test_pareto_front():
    pts = [(10, 3.0), (20, 4.0), (15, 5.0), (5, 2.0), (20, 3.5), (float("nan"), 1.0)]
    assert render.pareto_front(pts) == [(5, 2.0), (10, 3.0), (20, 3.5)]


class FakeLogger:
    def __init__(self):
        self.calls = []

    def start(self, config, name=None):
        self.calls.append(("start", name))

    def log_table(self, name, dataframe):
        self.calls.append(("table", name, dataframe.shape))

    def log_image(self, name, path):
        assert Path(path).exists()
        self.calls.append(("image", name))

    def log_scatter(self, name, dataframe, x, y, title):
        assert {x, y} <= set(dataframe.columns) and dataframe[[x, y]].notna().all().all()
        self.calls.append(("scatter", name, len(dataframe)))

    def finish(self):
        self.calls.append(("finish",))


def test_render_logs_table_and_chart(sweep_dir, tmp_path):
    logger = FakeLogger()
    render.render(sweep_dir, tmp_path / "out", logger=logger)
    kinds = [c[:2] for c in logger.calls]
    assert kinds[0] == ("start", "render-demo") and kinds[-1] == ("finish",)
    assert (
        ("table", "table2/p") in kinds
        and ("image", "pareto") in kinds
        and ("image", "pareto/humaneval") in kinds
    )
    # finished with tokens/s and perplexity: a1, a2, a3 (humaneval), b2 (mt_bench); b1 has no perplexity
    assert ("scatter", "ppl_vs_speed", 4) in logger.calls


def test_render_to_wandb_offline(sweep_dir, tmp_path, monkeypatch):
    """The real W&B client in offline mode (no network): the table and the chart land in the run's files."""
    pytest.importorskip("wandb")
    from mtad.run.tracking import WandbLogger

    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    render.render(
        sweep_dir,
        tmp_path / "out",
        logger=WandbLogger(project="mtad-test", mode="offline", dir=str(tmp_path)),
    )
    files = [
        p.relative_to(tmp_path).as_posix() for p in (tmp_path / "wandb").rglob("*") if p.is_file()
    ]
    assert any("media/table/table2/p" in f for f in files)
    assert any("media/images/pareto" in f for f in files)
    from mtad.run.tracking import offline_runs

    (run,) = offline_runs(tmp_path)
    logged = {k for row in run["history"] for k in row}
    assert {"table2/p", "ppl_vs_speed_table", "pareto"} <= logged, logged


def test_cli(sweep_dir, tmp_path, capsys):
    assert render.main([str(sweep_dir), "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "table2.md").exists() and "rendered" in capsys.readouterr().out


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory) -> Path:
    """A real 2-point smoke sweep (tiny random pair, 1 prompt, 4 tokens) in a temp folder."""
    from mtad.run import sweep as sw
    root = tmp_path_factory.mktemp("sweeps")
    s = sw.load(
        ROOT / "experiments" / "table2.yaml",
        ["decoder=multinomial,spd", "limit=1", "max_new_tokens=4"],
        profile="smoke",
        root=root,
    )
    assert sw.run(s, progress=False).ok
    return s.dir


def test_block_efficiency_is_rendered_from_tokens_and_steps(tmp_path):
    """A summary written under the old convention ((accepted + steps) / steps = 4.0, its last
    step cut short) renders the one definition, emitted tokens / steps = 7 / 2."""
    s = tmp_path / "sweeps" / "be"
    write_point(s, "c1", "p", "humaneval", "spd",
                metrics={"tokens_per_s": 1.0, "block_efficiency": 4.0, "new_tokens": 7, "steps": 2})
    write_point(s, "c2", "p", "humaneval", "mtad", metrics={"tokens_per_s": 1.0, "block_efficiency": 2.5})
    df = render.load_points(s).set_index("decoder")
    assert df.loc["spd", "block_efficiency"] == pytest.approx(3.5)
    assert df.loc["mtad", "block_efficiency"] == pytest.approx(2.5)  # no counts: the stored value


def test_smoke_results_render(smoke_results, tmp_path):
    render.render(smoke_results, tmp_path)
    text, _ = render.table2(render.load_points(smoke_results))["tiny_random"]
    assert text.loc["spd", ("smoke", "×MN")].endswith("×")
    joules = text.loc["spd", ("smoke", "J/tok")]
    assert joules == "n/a" or float(joules) > 0  # n/a without RAPL/NVML, never 0


def test_notebook_runs_top_to_bottom(smoke_results, monkeypatch, tmp_path):
    nb = json.loads((ROOT / "notebooks" / "analysis.ipynb").read_text())
    for cell in nb["cells"]:
        assert not cell.get("outputs") and cell.get("execution_count") is None  # outputs stripped
    monkeypatch.setenv("MTAD_SWEEP_DIR", str(smoke_results))
    monkeypatch.setenv("MTAD_FIG_DIR", str(tmp_path / "figures"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(tmp_path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns: dict = {"__name__": "__main__"}
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        src = "".join(cell["source"])
        exec(compile(src, f"analysis.ipynb[code {i}]", "exec"), ns)  # noqa: S102
    plt.close("all")
    assert len(ns["points"]) == 2 and "tiny_random" in ns["tables"]
    assert os.path.exists(tmp_path / "figures" / "pareto.png")


def test_notes_one_per_reason_without_absolute_paths(tmp_path):
    s = tmp_path / "notes"
    m = {"perplexity": 3.0, "tokens_per_s": 10.0, "block_efficiency": 1.0}
    missing = (
        f"{Path.cwd() / 'data' / 'chatalpaca' / 'x.json'}, {Path.home() / '.cache' / 'x.json'}"
    )
    for i, dec in enumerate(("multinomial", "spd", "mtad")):
        write_point(s, f"h{i}", "p", "humaneval", dec, metrics=m)
        write_point(
            s, f"c{i}", "p", "chatalpaca", dec, skipped=f"TaskUnavailable: none found at {missing}"
        )
    write_point(s, "t0", "p", "spider", "spd", failed="ValueError: bug")
    notes = render.notes(render.load_points(s, only_current=False))
    skipped = [n for n in notes if n.startswith("skipped")]
    assert len(skipped) == 1 and skipped[0].startswith(
        "skipped (chatalpaca: every decoder): TaskUnavailable"
    )
    assert "./data/chatalpaca/x.json" in skipped[0] and "~/.cache/x.json" in skipped[0]
    assert [n for n in notes if n.startswith("failed")] == ["failed (spider: spd): ValueError: bug"]
    for n in notes:
        assert str(Path.cwd()) not in n and str(Path.home()) + "/" not in n
    assert render.scrub_paths("at /opt/data/sets/file.json now") == "at .../file.json now"


def test_speedup_cells_that_cannot_be_computed_say_why(sweep_dir):
    notes = render.notes(render.load_points(sweep_dir))
    assert "×SpD – on mt_bench: no spd run finished for this pair and task" in notes
    assert not any(
        n.startswith("×MN") for n in notes
    )  # every task with finished points has a multinomial run


def test_cells_show_intervals_and_n(tmp_path):
    """Every cell's statistic comes from the records, one definition each
    (``mtad.core.metrics.DEFINITIONS``), whatever the summary says."""
    from mtad.core.stats import bootstrap_ci
    from mtad.run.provenance import append_jsonl

    s = tmp_path / "ci"
    m = {"perplexity": 9.0, "tokens_per_s": 99.0, "block_efficiency": 9.0}  # not what is shown
    write_point(s, "a", "p", "humaneval", "spd", metrics=m, score=0.5)
    scores, ppl, steps = [1.0, 0.0, 1.0, 0.0], [1.5, 2.0, 3.0, 4.0], [5, 4, 10, 8]
    for i, (sc, p, st) in enumerate(zip(scores, ppl, steps)):
        append_jsonl(s / "a" / "samples.jsonl", {
            "example_id": str(i), "index": i, "turn": 0, "score": sc, "perplexity": p,
            "new_tokens": 20, "wall_time": 2.0 + i, "steps": st, "emitted_per_step": [20 / st] * st})
    df = render.load_points(s, only_current=False)
    text, _ = render.table2(df)["p"]
    lo, hi = bootstrap_ci(scores)
    assert text.loc["spd", ("humaneval", "score")] == f"0.500 [{lo:.3f}, {hi:.3f}]"
    logs = np.log(ppl)
    llo, lhi = bootstrap_ci(list(logs))
    geo = math.exp(logs.mean())  # the geometric mean, not the mean 2.625
    assert text.loc["spd", ("humaneval", "PPL")] == f"{geo:.2f} [{math.exp(llo):.2f}, {math.exp(lhi):.2f}]"
    assert text.loc["spd", ("humaneval", "tok/s")].startswith(f"{80 / 14:.2f} [")  # total / total
    bes = [20 / st for st in steps]  # per-example mean 3.5, not pooled 80 / 27
    blo, bhi = bootstrap_ci(bes)
    assert text.loc["spd", ("humaneval", "BE")] == f"{np.mean(bes):.2f} [{blo:.2f}, {bhi:.2f}]"
    assert text.loc["spd", ("humaneval", "n")] == "4"
    md = render.to_markdown(text, title="p", metrics={"humaneval": "pass@1"})
    assert "### humaneval (score: pass@1)" in md and re.search(r"\|\s*PPL \[95% CI\]\s*\|", md)


def test_cells_of_a_task_use_the_examples_every_point_has(tmp_path):
    """A point recorded on more examples than its task's other points is shown on the common
    ones, and the notes say how many it has."""
    from mtad.run.provenance import append_jsonl

    s = tmp_path / "same"
    for h, dec, n in (("a", "spd", 5), ("b", "multinomial", 3)):
        write_point(s, h, "p", "humaneval", dec, metrics={"perplexity": 1.0}, score=0.5)
        for i in range(n):
            append_jsonl(s / h / "samples.jsonl", {
                "example_id": str(i), "index": i, "turn": 0, "score": float(i % 2), "perplexity": 1.0 + i,
                "new_tokens": 10, "wall_time": 1.0, "steps": 5, "emitted_per_step": [2] * 5})
    df = render.load_points(s, only_current=False).set_index("decoder")
    assert df.loc["spd", "examples"] == 3 and df.loc["spd", "examples_recorded"] == 5
    assert df.loc["spd", "perplexity"] == pytest.approx(6 ** (1 / 3))  # examples 0..2 only
    assert any("every cell shows the 3 examples" in n and "spd 5" in n for n in render.notes(df.reset_index()))


def test_sample_intervals_recompute_rates_from_the_records(tmp_path):
    """tok/s and BE intervals come from samples.jsonl (the estimates' own statistics) when the
    records carry the counts; a point without samples has none."""
    from mtad.core.metrics import block_efficiency_interval, tokens_per_s_interval
    from mtad.run.provenance import append_jsonl

    recs = [{"new_tokens": 10 + i, "wall_time": 1.0 + 0.3 * i, "steps": 3 + i % 3,
             "emitted_per_step": [2] * (3 + i % 3)} for i in range(8)]
    for r in recs:
        append_jsonl(tmp_path / "samples.jsonl", r)
    cis = render.sample_intervals(tmp_path)
    assert cis["tokens_per_s_ci"] == pytest.approx(tokens_per_s_interval(recs))
    assert cis["block_efficiency_ci"] == pytest.approx((2.0, 2.0))  # every step emitted 2
    assert cis["block_efficiency_ci"] == pytest.approx(block_efficiency_interval(recs))
    assert render.sample_intervals(tmp_path / "none") == {}


@pytest.mark.parametrize("policy", ["requested", "all"])
def test_requested_examples_policy_shows_a_bigger_folder_at_the_points_limit(tmp_path, policy):
    """An ablation's default point is read from a folder of more examples; with
    ``sweep.examples: requested`` the rendering shows the first ``limit`` (every metric, score
    and interval recomputed from those records), with ``all`` every example."""
    from mtad.run.provenance import append_jsonl

    s = tmp_path / "abl"
    recs = [{"example_id": str(i), "index": i, "turn": 0, "score": float(i % 2 == 0),
             "perplexity": 1.0 + i, "new_tokens": 10, "wall_time": 1.0 + i, "steps": 5,
             "emitted_per_step": [2] * 5, "accepted_per_step": [1] * 5, "drafted_per_step": [3] * 5,
             "target_forward_time": 0.5, "draft_forward_time": 0.2} for i in range(6)]
    write_point(s, "a", "p", "humaneval", "mtad", metrics={"perplexity": 3.5, "block_efficiency": 2.0},
                score=0.5)
    for r in recs:
        append_jsonl(s / "a" / "samples.jsonl", r)
    summary = json.loads((s / "a" / "summary.json").read_text())
    summary["metrics"]["examples"] = 6
    (s / "a" / "summary.json").write_text(json.dumps(summary))
    (s / "sweep.json").write_text(json.dumps({"examples": policy, "points": [
        {"hash": "a", "dir": "a", "limit": 3, "status": "done", "overrides": ["tau=0.5"],
         "choices": {}}]}))
    row = render.load_points(s, only_current=False).iloc[0]
    if policy == "requested":
        assert row["examples"] == 3 and row["perplexity"] == pytest.approx(6 ** (1 / 3))  # geometric
        assert row["limit"] == 3 and row["label"] == "mtad"  # the limit shown is no ablation axis
        assert row["score"] == pytest.approx(2 / 3)  # examples 0 and 2 of 0..2
        assert row["tokens_per_s"] == pytest.approx(30 / 6)
    else:
        assert row["examples"] == 6 and row["perplexity"] == pytest.approx(720 ** (1 / 6))
        assert row["score"] == pytest.approx(0.5)


def test_ablation_pairs_each_point_with_the_default_over_shared_examples(tmp_path):
    """An ablation's table and figure carry perplexity over that at the knob's default (conf:
    tau=0.5), the ratio of geometric means over the examples both points have, with a paired
    bootstrap interval; a point with no default on its curve gets no ratio."""
    from mtad.core.stats import perplexity_ratio
    from mtad.run.provenance import append_jsonl

    s = tmp_path / "ablation_tau"
    rng = np.random.default_rng(0)
    base = rng.uniform(1.1, 2.0, size=8)
    ppl = {0.5: base, 0.1: base * rng.uniform(0.9, 1.0, size=8)}
    for tau, values in ppl.items():
        h = f"t{tau}"
        write_point(s, h, "p", "humaneval", "mtad", tau=tau,
                    metrics={"perplexity": float(values.mean()), "block_efficiency": 2.0})
        for i, v in enumerate(values[: 8 if tau == 0.5 else 6]):  # tau=0.1: 6 examples
            append_jsonl(s / h / "samples.jsonl", {"example_id": f"e{i}", "index": i, "turn": 0,
                                                  "perplexity": float(v)})
    write_point(s, "other", "p", "humaneval", "spd", tau=0.1, metrics={"perplexity": 1.5})
    df = render.load_points(s, only_current=False)
    paired = render.paired_vs_default(df, "tau", 0.5)
    row = paired[(paired["decoder"] == "mtad") & (paired["tau"] == 0.1)].iloc[0]
    want = perplexity_ratio(np.log(ppl[0.1][:6]), np.log(ppl[0.5][:6]))
    assert row["n"] == 6 and row["ratio"] == pytest.approx(want.estimate) and want.estimate < 1
    assert (row["low"], row["high"]) == pytest.approx((want.low, want.high))
    assert set(paired["decoder"]) == {"mtad"}  # spd has no point at the default
    written = render.render(s, tmp_path / "out", only_current=False)
    md = (tmp_path / "out" / "table2.md").read_text()
    assert "## Paired: perplexity ÷ perplexity at the default tau=0.5" in md
    assert f"| mtad | 0.1 | 6 | {want.estimate:.3f} [{want.low:.3f}, {want.high:.3f}] | – | – |" in md
    assert "| mtad | 0.5 | 6 | 1 (the default) | – | – |" in md  # the task's common examples; no step records: no cost
    assert "ablation_tau.png" in written
    fig = render.plot_ablation(df, "tau", paired, 0.5)
    assert fig.axes[-1].get_ylabel() == "PPL ÷ PPL at tau=0.5\n(paired over examples)" and len(fig.axes) == 3


def test_draft_cost_from_records():
    """Draft tokens per emitted token and target tree nodes per step, pooled over records."""
    recs = [{"drafted_per_step": [4, 4], "emitted_per_step": [3, 5], "tree_size_per_step": [4, 6]},
            {"drafted_per_step": [8], "emitted_per_step": [2], "tree_size_per_step": [8]}]
    assert render.draft_cost(recs) == {"drafted_per_token": 16 / 10, "nodes_per_step": 6.0}
    assert all(math.isnan(v) for v in render.draft_cost([{"new_tokens": 3}]).values())


def test_pareto_x_follows_the_sweeps_render_option(tmp_path):
    """``sweep.json``'s ``render.pareto_x``: block efficiency on the x axis (a shared machine's
    records), else tokens/s."""
    import matplotlib.pyplot as plt

    s = tmp_path / "t"
    write_point(s, "a", "p", "humaneval", "spd", metrics={"perplexity": 2.0, "tokens_per_s": 3.0,
                                                          "block_efficiency": 3.5})
    write_point(s, "b", "p", "humaneval", "multinomial",
                metrics={"perplexity": 2.1, "tokens_per_s": 9.0, "block_efficiency": 1.0})
    df = render.load_points(s, only_current=False)
    ax = render.plot_pareto(df, "humaneval", x="block_efficiency")
    assert ax.get_xlabel().startswith("block efficiency") and "vs block efficiency" in ax.get_title()
    plt.close(ax.figure)
    (s / "sweep.json").write_text(json.dumps({"render": {"pareto_x": "block_efficiency"}, "points": []}))
    assert render.render_options(s) == {"pareto_x": "block_efficiency"}
    render.render(s, tmp_path / "with", only_current=False)
    assert "×MN" in (tmp_path / "with" / "table2.md").read_text()
    (s / "sweep.json").write_text(json.dumps({"render": {"speedups": False}, "points": []}))
    render.render(s, tmp_path / "without", only_current=False)
    md = (tmp_path / "without" / "table2.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| decoder"))
    assert "×MN" not in header and "×SpD" not in header and "not speedups" in md
    assert "speedup" not in (tmp_path / "without" / "table2.csv").read_text()
    with pytest.raises(ValueError, match="pareto x='wall'"):
        render.plot_pareto(df, "humaneval", x="wall")


def test_one_block_per_task_and_distinct_figures(sweep_dir, tmp_path):
    import hashlib

    out = tmp_path / "out"
    written = render.render(sweep_dir, out)
    md = (out / "table2.md").read_text()
    assert [line for line in md.splitlines() if line.startswith("### ")] == [
        "### humaneval (score: pass@1)",
        "### mt_bench",
        "### chatalpaca",
    ]
    header = next(line for line in md.splitlines() if line.startswith("| decoder"))
    assert header.count("|") - 1 == 1 + len(
        render.COLUMNS
    )  # decoders as rows, the metrics as columns
    pngs = [p for p in written.values() if p.suffix == ".png"]
    digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in pngs]
    assert len(set(digests)) == len(digests)
    single = tmp_path / "single"
    write_point(
        single, "a", "p", "humaneval", "spd", metrics={"perplexity": 2.0, "tokens_per_s": 3.0}
    )
    assert "pareto.png" not in render.render(single, tmp_path / "out1", only_current=False)


def test_empty_pareto_panel_says_why(tmp_path):
    """A task with no finished point (e.g. its data unavailable offline) gets a panel that says
    what happened to its points, not just that it is empty."""
    import matplotlib.pyplot as plt

    s = tmp_path / "t"
    write_point(s, "a", "p", "humaneval", "spd", metrics={"perplexity": 2.0, "tokens_per_s": 3.0})
    write_point(s, "b", "p", "chatalpaca", "spd", skipped="TaskUnavailable: no data offline")
    ax = render.plot_pareto(render.load_points(s, only_current=False), "chatalpaca")
    texts = [t.get_text() for t in ax.texts]
    assert any(t.startswith("no finished runs") and "skipped" in t for t in texts), texts
    plt.close(ax.figure)


def test_pareto_joins_labels_of_coinciding_points(tmp_path):
    """Two runs at the same (x, perplexity) get one label naming both, not two labels on top
    of each other."""
    import matplotlib.pyplot as plt

    s = tmp_path / "t"
    m = {"perplexity": 1.5, "tokens_per_s": 3.0, "block_efficiency": 3.5}
    write_point(s, "a", "p", "humaneval", "mtad", metrics=m)
    write_point(s, "b", "p", "humaneval", "tree_mtad", metrics=m)
    write_point(s, "c", "p", "humaneval", "spd", metrics={**m, "perplexity": 2.0})
    ax = render.plot_pareto(render.load_points(s, only_current=False), "humaneval",
                            x="block_efficiency")
    labels = sorted(t.get_text().strip() for t in ax.texts)
    assert len(labels) == 2 and any(" = " in t and "mtad" in t and "tree_mtad" in t
                                    for t in labels), labels
    plt.close(ax.figure)


def test_begun_point_says_how_far_it_got(tmp_path):
    """A point with records but no summary (running, or interrupted) is pending, and the notes
    say how many examples it has so far; one with no records is plain pending."""
    s = tmp_path / "t"
    write_point(s, "a", "p", "humaneval", "spd", metrics={"perplexity": 2.0, "tokens_per_s": 3.0})
    write_point(s, "b", "p", "humaneval", "mtad")
    write_point(s, "c", "p", "humaneval", "tree_mtad")
    (s / "b" / "samples.jsonl").write_text(
        "".join(json.dumps({"index": i, "turn": t}) + "\n" for i in range(3) for t in (0, 1)))
    df = render.load_points(s, only_current=False)
    assert set(df.loc[df["decoder"].isin(["mtad", "tree_mtad"]), "status"]) == {"pending"}
    lines = render.notes(df)
    begun = [n for n in lines if "so far" in n]
    assert len(begun) == 1 and "mtad" in begun[0] and "tree_mtad" not in begun[0], lines
    assert "3 examples so far" in begun[0] and "resumes it" in begun[0]
    assert any(n.startswith("pending (") and "tree_mtad" in n and "so far" not in n for n in lines)


def test_pareto_marks_lossy_decoders_hollow(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = tmp_path / "lossy"
    m = {"perplexity": 2.0, "tokens_per_s": 3.0}
    write_point(s, "a", "p", "humaneval", "spd", metrics=m)
    write_point(s, "b", "p", "humaneval", "mtad", metrics={**m, "tokens_per_s": 4.0})
    for h, lossless in (("a", True), ("b", False)):
        path = s / h / "summary.json"
        write_json_atomic(path, {**json.loads(path.read_text()), "lossless": lossless})
    ax = render.plot_pareto(render.load_points(s, only_current=False), "humaneval")
    faces = {
        tuple(line.get_xdata()): matplotlib.colors.to_rgba(line.get_markerfacecolor())
        for line in ax.lines
        if line.get_marker() not in (None, "None", "")
    }
    assert faces[(4.0,)] == (1.0, 1.0, 1.0, 1.0) and faces[(3.0,)] != (1.0, 1.0, 1.0, 1.0)
    assert "humaneval" in ax.get_title() and "p" in ax.get_title()
    plt.close(ax.figure)


def test_ablation_titled_and_on_a_log2_axis(tmp_path):
    s = tmp_path / "ablation_gamma"
    for g in (2, 4, 8):
        write_point(
            s,
            f"s{g}",
            "p",
            "humaneval",
            "spd",
            gamma=g,
            metrics={"tokens_per_s": 10.0 + g, "perplexity": 3.0, "block_efficiency": 1 + g / 4},
        )
    written = render.render(s, tmp_path / "out", only_current=False)
    assert (
        (tmp_path / "out" / "table2.md")
        .read_text()
        .startswith("# ablation_gamma: ablation over gamma")
    )
    assert "ablation_gamma.png" in written
    fig = render.plot_ablation(render.load_points(s, only_current=False), "gamma")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == [
        "2",
        "4",
        "8",
    ]
    assert fig._suptitle.get_text().startswith("Ablation over gamma")
    # a row per task, the paper's quantities first; each line's markers at the values swept
    assert [a.get_ylabel() for a in fig.axes] == [AXIS_LABELS["perplexity"], AXIS_LABELS["block_efficiency"]]
    line = fig.axes[1].get_lines()[0]
    assert list(line.get_xdata()) == [2, 4, 8] and list(line.get_ydata()) == [1.5, 2.0, 3.0]


def _committed_renderings() -> list[tuple[str, Path | None]]:
    """Rendered folders under results/ whose sweep index is committed, with their notes file
    (the Makefile's rule: experiments/<name>_notes.md, ablations: ablations_<profile>_notes.md)."""
    out = []
    for index in sorted((ROOT / "results" / "sweeps").glob("*/sweep.json")):
        name = index.parent.name
        if not (ROOT / "results" / name / "table2.md").exists():
            continue
        profile = name.rsplit("_", 1)[-1]
        notes = [ROOT / "experiments" / f"{name}_notes.md",
                 ROOT / "experiments" / f"ablations_{profile}_notes.md"]
        notes = [n for n in notes if n.exists() and (name.startswith("ablation_") == n.name.startswith("ablations_"))]
        out.append((name, notes[0] if notes else None))
    return out


COMMITTED = _committed_renderings()


def test_the_committed_renderings_are_found():
    names = {n for n, _ in COMMITTED}
    assert {"table2_smoke", "table2_cpu", "ablation_tau_cpu", "ablation_gamma_cpu", "ablation_width_cpu"} <= names


@pytest.mark.parametrize("name,notes", COMMITTED, ids=[n for n, _ in COMMITTED])
def test_committed_tables_rerender_identically(name, notes, tmp_path, monkeypatch):
    """Every committed table is what the renderer makes of the committed records (wherever the
    sweep's index points: results/claims/... for the offline pair), byte for byte but for the
    output folder in the command line; new records need a re-render in the same commit."""
    monkeypatch.chdir(ROOT)
    render.render(Path("results/sweeps") / name, tmp_path, notes_file=notes)
    committed = ROOT / "results" / name
    figures = {p.name for p in tmp_path.glob("*.png")}
    assert {p.name for p in committed.glob("*.png")} == figures, (
        f"results/{name} holds other figures than a fresh rendering makes ({sorted(figures)})")
    for fname in ("table2.md", "table2.tex", "table2.csv", "points.csv"):
        new = (tmp_path / fname).read_text().splitlines()
        old = (committed / fname).read_text().splitlines()
        if fname == "table2.md":
            assert old[2] == f"Rendered by `python -m mtad.analysis.render results/sweeps/{name} --out results/{name}`."
            new, old = new[:2] + new[3:], old[:2] + old[3:]
        assert new == old, f"results/{name}/{fname} differs from a fresh rendering of its records"

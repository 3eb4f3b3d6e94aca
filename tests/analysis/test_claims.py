"""mtad.analysis.claims: verdict rules at their boundaries, per-example values, and the whole report on a
synthetic records folder written in the results format."""

import csv
import json
import math
from pathlib import Path

import pytest

from mtad.analysis import claims, claims_report
from mtad.analysis.claims import (
    CONSISTENT,
    CONTRADICTED,
    HOLDS,
    INCONCLUSIVE,
    LARGER,
    OPEN,
    REPRODUCED,
    SMALLER,
    direction,
    equivalence,
    non_inferiority,
    size_verdict,
)
from mtad.core import stats
from mtad.run.results import SAMPLES_FILE, append_jsonl, write_json_atomic


# ------------------------------------------------------------------------------ rules
def test_direction_boundaries():
    assert direction(0.7, 0.99, 1.0, "below") == HOLDS
    assert direction(0.7, 1.0, 1.0, "below") == OPEN  # touching 1: not entirely below
    assert direction(1.0, 1.2, 1.0, "below") == CONTRADICTED  # excludes "below 1"
    assert direction(0.9, 1.1, 1.0, "below") == OPEN
    assert direction(0.01, 0.5, 0.0, "above") == HOLDS
    assert direction(0.0, 0.5, 0.0, "above") == OPEN
    assert direction(-0.5, 0.0, 0.0, "above") == CONTRADICTED
    assert direction(math.nan, 1.0, 1.0, "below") == OPEN


def test_non_inferiority_boundaries():
    m = claims.NON_INFERIORITY["binary"]
    assert m == -0.05 and claims.NON_INFERIORITY["rouge"] == -0.01
    assert non_inferiority(-0.049, 0.1, m) == HOLDS
    assert non_inferiority(-0.05, 0.1, m) == OPEN  # on the margin: not above it
    assert non_inferiority(-0.2, -0.05, m) == OPEN
    assert non_inferiority(-0.2, -0.051, m) == CONTRADICTED
    assert non_inferiority(-0.2, 0.3, m) == OPEN


def test_equivalence_boundaries():
    lo, hi = claims.PPL_EQUIVALENCE
    assert (lo, hi) == (0.97, 1.03)
    assert equivalence(0.97, 1.03, lo, hi) == HOLDS  # inside, bounds included
    assert equivalence(0.969, 1.0, lo, hi) == OPEN
    assert equivalence(1.0, 1.031, lo, hi) == OPEN
    assert equivalence(1.031, 1.2, lo, hi) == CONTRADICTED
    assert equivalence(0.5, 0.969, lo, hi) == CONTRADICTED
    assert equivalence(0.5, 1.5, lo, hi) == OPEN


def test_size_verdict_places_the_papers_figure():
    # a claimed reduction (ratio below 1): an interval above the paper's 0.788 is a smaller effect
    assert size_verdict(0.75, 0.85, 0.788, "below") == REPRODUCED
    assert size_verdict(0.80, 0.90, 0.788, "below") == SMALLER
    assert size_verdict(0.60, 0.70, 0.788, "below") == LARGER
    # a claimed gain (+43%): an interval below 0.43 is a smaller effect
    assert size_verdict(0.1, 0.3, 0.43, "above") == SMALLER
    assert size_verdict(0.5, 0.9, 0.43, "above") == LARGER
    assert size_verdict(0.43, 0.9, 0.43, "above") == REPRODUCED  # bounds included
    assert size_verdict(math.nan, 0.9, 0.43, "above") == OPEN


def test_size_verdict_says_inconclusive_when_the_interval_cannot_tell_the_figure_from_no_effect():
    # the paper's 0.788 inside [0.784, 0.975]: width 0.191 < 0.212 (its distance from 1), 1 outside
    assert size_verdict(0.784, 0.975, 0.788, "below", null=1.0) == CONSISTENT
    # the interval also holds no effect (ratio 1)
    assert size_verdict(0.70, 1.02, 0.788, "below", null=1.0) == INCONCLUSIVE
    # wider than the figure's distance from no effect, though it excludes it
    assert size_verdict(0.55, 0.99, 0.788, "below", null=1.0) == INCONCLUSIVE
    # a claimed gain of +43% (no effect: 0)
    assert size_verdict(0.30, 0.60, 0.43, "above", null=0.0) == CONSISTENT
    assert size_verdict(0.05, 0.60, 0.43, "above", null=0.0) == INCONCLUSIVE
    assert size_verdict(-0.1, 0.60, 0.43, "above", null=0.0) == INCONCLUSIVE
    # outside the interval it stays smaller / larger, however wide
    assert size_verdict(0.80, 1.30, 0.788, "below", null=1.0) == SMALLER


def test_holm_adjusts_the_holds_over_the_family():
    """Three raw `holds` at one-sided p 0.001, 0.02, 0.024: Holm (x3, x2, x1, step-down at
    0.025) keeps the first only; rows without a p-value are not in the family."""
    rows = [claims.Row(1, "t", f"c{i}", "m", "", verdict=HOLDS, p_value=p)
            for i, p in enumerate((0.001, 0.02, 0.024))]
    rows.append(claims.Row(1, "t", "none", "m", ""))
    claims.adjust(rows)
    assert [r.holm_verdict for r in rows] == [HOLDS, OPEN, OPEN, OPEN]
    assert [r.holm_p for r in rows[:3]] == pytest.approx([0.003, 0.04, 0.04])
    assert math.isnan(rows[3].holm_p)


# ------------------------------------------------------------------------------ per example
def test_log_perplexity_is_token_weighted_over_turns():
    turns = [{"nll_sum": 10.0, "new_tokens": 10}, {"nll_sum": 90.0, "new_tokens": 30}]
    assert claims.log_perplexity(turns) == pytest.approx(100 / 40)  # not the mean of 1 and 3
    # perplexity without nll_sum: nll = log(ppl) * tokens
    assert claims.log_perplexity([{"perplexity": math.e**2, "new_tokens": 5}]) == pytest.approx(2)
    assert claims.log_perplexity([{"new_tokens": 5}]) is None


def test_pairing_uses_the_common_turns_only():
    a = {
        ("x", 0): {"nll_sum": 1.0, "new_tokens": 1},
        ("x", 1): {"nll_sum": 9.0, "new_tokens": 1},
        ("y", 0): {"nll_sum": 2.0, "new_tokens": 1},
    }
    b = {("x", 0): {"nll_sum": 3.0, "new_tokens": 1}, ("z", 0): {"nll_sum": 5.0, "new_tokens": 1}}
    assert claims.paired(a, b, claims.log_perplexity) == ([1.0], [3.0])
    # emitted tokens / steps: the last step of the second turn accepted 2 but kept 2 tokens
    # (cut short by max_new_tokens), not 2 + 1; (accepted + steps) / steps said 9 / 3
    be = claims.block_efficiency(
        [
            {"steps": 2, "accepted_per_step": [3, 1], "emitted_per_step": [4, 2], "new_tokens": 6},
            {"steps": 1, "accepted_per_step": [2], "emitted_per_step": [2], "new_tokens": 2},
        ]
    )
    assert be == pytest.approx(8 / 3)
    # the one definition, mtad.core.metrics, over the example's turns; None without steps
    from mtad.core.metrics import records_block_efficiency

    turns = [{"steps": 2, "emitted_per_step": [4, 2], "new_tokens": 6}, {"steps": 1, "new_tokens": 2}]
    assert claims.block_efficiency(turns) == records_block_efficiency(turns) == pytest.approx(8 / 3)
    assert claims.block_efficiency([{"steps": 0, "new_tokens": 0}]) is None


# ------------------------------------------------------------------------------ end to end
N = 12
RATIOS = {"multinomial": 1.0, "spd": 1.03, "mtad": 0.8, "tree_mtad": 1.25}
# per-example noise, +-JITTER alternating, summing to 0 over the N examples: paired differences
# vary (a bootstrap has spread) while means stay exact
JITTER = {"multinomial": 0.0, "spd": 0.01, "mtad": 0.02, "tree_mtad": 0.03}


def _records(decoder, task):
    turns = 2 if task == "mt_bench" else 1
    out = []
    for i in range(N):
        for turn in range(turns):
            jitter = JITTER[decoder] * (1 if i % 2 else -1)
            log_ppl = 1.0 + 0.1 * i + 0.2 * turn + math.log(RATIOS[decoder]) + jitter
            if decoder == "tree_mtad" and task == "chatgpt_prompts":
                log_ppl = 1.0 + 0.1 * i + (0.5 if i % 2 else -0.5)  # no clear direction
            tokens = 10 + 5 * turn
            # tree_mtad takes 4 or 5 steps (odd / even examples), spd 5: BE 2.5 or 2 vs 2 (turn 0)
            steps, acc = {"tree_mtad": (4 + i % 2, 3), "spd": (5, 2)}.get(decoder, (tokens, 0))
            r = {
                "example_id": f"ex{i}",
                "turn": turn,
                "index": i,
                "new_tokens": tokens,
                "nll_sum": log_ppl * tokens,
                "perplexity": math.exp(log_ppl),
                "steps": steps,
                "accepted_per_step": [acc] * steps,
                "tokens_per_s": 1.0,
                # the rest of a samples.jsonl record (mtad.run.results.RECORD_FIELDS), unused here
                "text": "", "prompt_tokens": 8, "output_ids": [0] * tokens, "drafted_per_step": [acc] * steps,
                "emitted_per_step": [tokens] + [0] * (steps - 1), "tree_size_per_step": [acc] * steps,
                "target_passes": steps, "target_forward_time": 0.0, "draft_forward_time": 0.0,
                "wall_time": float(tokens), "prefill_time": 0.0, "block_efficiency": acc + 1.0,
                "stop_reason": "length", "energy_j": None,
            }
            if turn == turns - 1:
                r["score"] = _score(decoder, task, i)
            out.append(r)
    return out


def _score(decoder, task, i):
    if task == "spider":  # mtad ties spd; tree_mtad fails everywhere spd succeeds
        return 0 if decoder == "tree_mtad" else 1
    if task == "humaneval":  # 3 pairs each way: difference 0, wide interval
        base = i % 2
        if decoder == "mtad" and i < 6:
            return 1 - base
        return base
    if task == "cnn_dailymail":
        base = 0.25 + 0.01 * i + 0.1 * JITTER[decoder] * (1 if i % 2 else -1)
        return base + {"multinomial": -0.01, "spd": 0.0, "mtad": -0.01, "tree_mtad": -0.02}[decoder]
    return None


def _write_point(folder, decoder, task, with_choices=True, identity=None, records=None):
    folder.mkdir(parents=True)
    choices = {"decoder": decoder, "task": task} if with_choices else {}
    write_json_atomic(
        folder / "point.json",
        {"format": 2, "identity_hash": folder.name, "identity": identity or {}, "choices": choices},
    )
    cfg = {"decoder": {"_target_": f"mtad.decoders.{decoder}.Decoder"}, "task": {"name": task}}
    summary = {"format": 2, "config": cfg, "data_source": f"local:{task}",
               "data_substitute": task == "chatgpt_prompts",
               "energy_unavailable_reason": "no readable RAPL package domain"}
    write_json_atomic(folder / "summary.json", summary)
    for r in records if records is not None else _records(decoder, task):
        append_jsonl(folder / SAMPLES_FILE, r)


@pytest.fixture
def report(tmp_path):
    root = tmp_path / "records"
    for task in claims.TASKS:
        for decoder in ("multinomial", "spd", "mtad", "tree_mtad"):
            if decoder == "multinomial" and task == "mt_bench":
                continue  # a missing decoder on a task
            # one point read through its config only (no config-group choices)
            _write_point(
                root / "claims" / f"{decoder}-{task}",
                decoder,
                task,
                with_choices=(decoder, task) != ("mtad", "spider"),
            )
    speed = tmp_path / "speed.json"
    speed.write_text(json.dumps(_speed_file(n_prompts=12)))
    out = tmp_path / "out"
    notes = tmp_path / "notes.md"
    notes.write_text("Pilot: 30 examples per task.")
    assert (
        claims.main([str(root), "--out", str(out), "--speed", str(speed), "--notes", str(notes)])
        == 0
    )
    with open(out / "claims.csv") as f:
        rows = list(csv.DictReader(f))
    return rows, out


def _speed_file(n_prompts, fixed=True):
    """tree-MTAD 1.25x SpD's tokens/s on humaneval (0.8 of its wall), 1.1x on spider (geometric
    means over an even number of prompts); two repeats per prompt; greedy rows (which claim 4
    does not read) the other way round."""
    rows = []
    for task, tree_share in (("humaneval", 0.8), ("spider", 1 / 1.1)):
        for prompt in range(n_prompts):
            for repeat in range(2):
                for mode, share in (("sample", tree_share), ("greedy", 2.0)):
                    wall = 10.0 + prompt + 0.1 * repeat
                    jitter = math.exp(0.02 if prompt % 2 else -0.02)  # cancels in the geometric mean
                    for decoder, w in (("spd", wall), ("tree_mtad", share * jitter * wall)):
                        rows.append({"task": task, "mode": mode, "decoder": decoder, "prompt": prompt,
                                     "repeat": repeat, "tokens": 64, "wall": w})
    return {"rows": rows, "args": {"fixed_length": fixed, "max_new_tokens": 64}}


def _row(rows, claim, task, comparison, metric_prefix=""):
    found = [
        r
        for r in rows
        if r["claim"] == str(claim)
        and r["task"] == task
        and r["comparison"] == comparison
        and r["metric"].startswith(metric_prefix)
    ]
    assert len(found) == 1, (claim, task, comparison, found)
    return found[0]


def test_report_columns_and_rows(report):
    rows, out = report
    assert list(rows[0]) == list(claims.FIELDS)
    per_claim = {c: sum(r["claim"] == str(c) for r in rows) for c in range(1, 8)}
    # per task + pooled (task "all"); claim 4: two tasks + pooled vs SpD, one "no records" row vs MCSS
    assert per_claim == {1: 24, 2: 18, 3: 12, 4: 4, 5: 9, 6: 12, 7: 2}
    assert {r["verdict"] for r in rows} <= {HOLDS, CONTRADICTED, OPEN}
    for name in ("claims.md", "claims.csv", "perplexity_ratio.png"):
        assert (out / name).stat().st_size > 0


def test_report_perplexity_claims(report):
    rows, _ = report
    r = _row(rows, 1, "spider", "mtad vs multinomial")  # read through its config (no choices)
    assert float(r["estimate"]) == pytest.approx(0.8, rel=1e-3) and r["verdict"] == HOLDS
    assert r["n"] == str(N)
    assert _row(rows, 1, "humaneval", "tree_mtad vs spd")["verdict"] == CONTRADICTED
    assert _row(rows, 1, "chatgpt_prompts", "tree_mtad vs multinomial")["verdict"] == OPEN
    missing = _row(rows, 1, "mt_bench", "mtad vs multinomial")
    assert (missing["n"], missing["verdict"]) == ("0", OPEN) and "no records" in missing["detail"]
    # mt_bench pools two turns per example: still N paired examples
    assert _row(rows, 1, "mt_bench", "mtad vs spd")["n"] == str(N)
    eq = _row(rows, 5, "spider", "spd vs multinomial", "perplexity")  # ratio 1.03: the interval
    assert float(eq["estimate"]) == pytest.approx(1.03, rel=1e-3) and eq["verdict"] == OPEN  # straddles it
    # against multinomial the paper's ratio 0.788 is compared with the interval: the size verdict
    assert r["size"] == SMALLER and float(r["ci_low"]) > 0.788
    assert _row(rows, 1, "spider", "mtad vs spd")["size"] == ""  # the paper states no size


def test_report_pooled_rows(report):
    """Task "all": every task weighs the same; a task without records leaves no verdict."""
    rows, _ = report
    pooled = _row(rows, 1, "all", "mtad vs spd")
    assert float(pooled["estimate"]) == pytest.approx(0.8 / 1.03, rel=1e-3)
    assert pooled["verdict"] == HOLDS and pooled["n"] == str(5 * N)
    assert "equal weight per task" in pooled["detail"] and "mt_bench 12" in pooled["detail"]
    partial = _row(rows, 1, "all", "mtad vs multinomial")  # no multinomial on mt_bench
    assert partial["verdict"] == OPEN and partial["n"] == str(4 * N)
    assert "fewer than 10 pairs (no verdict): mt_bench 0" in partial["detail"]
    assert float(partial["estimate"]) == pytest.approx(0.8, rel=1e-3)
    # (10 / 4 or 10 / 5) - 10 / 5 on 4 tasks: 0.25; mt_bench (25 / 8 or 25 / 10) - 25 / 10: 0.3125
    be = _row(rows, 2, "all", "tree_mtad vs spd")
    assert float(be["estimate"]) == pytest.approx((4 * 0.25 + 0.3125) / 5) and be["verdict"] == HOLDS
    assert _row(rows, 2, "all", "tree_mtad vs specinfer")["n"] == "0"
    assert _row(rows, 5, "all", "spd vs multinomial", "perplexity")["verdict"] == OPEN


def test_report_block_efficiency_and_scores(report):
    rows, _ = report
    be = _row(rows, 2, "spider", "tree_mtad vs spd")  # 10 tokens in 4 or 5 steps vs 10 in 5
    assert float(be["estimate"]) == pytest.approx(0.25) and be["verdict"] == HOLDS
    no_si = _row(rows, 2, "spider", "tree_mtad vs specinfer")
    assert (no_si["n"], no_si["verdict"]) == ("0", OPEN) and "no records: specinfer" in no_si[
        "detail"
    ]
    # both succeed on all 12: no discordant pairs, so no bootstrap spread; Newcombe's interval
    # (+-0.24 at n = 12) does not fit above -0.05 (a zero-width [0, 0] would have "held")
    tie = _row(rows, 3, "spider", "mtad vs spd")
    assert tie["verdict"] == OPEN and "Newcombe" in tie["detail"] and float(tie["ci_low"]) < -0.2
    tree = _row(rows, 3, "spider", "tree_mtad vs spd")
    assert tree["verdict"] == CONTRADICTED and "McNemar exact p = 0.000488" in tree["detail"]
    he = _row(rows, 3, "humaneval", "mtad vs spd")
    assert he["verdict"] == OPEN and "McNemar exact p = 1" in he["detail"]
    # Rouge-L: -0.01 exactly is on the margin (not resolved); -0.02 is below it
    assert _row(rows, 3, "cnn_dailymail", "mtad vs spd")["verdict"] == OPEN
    assert _row(rows, 3, "cnn_dailymail", "tree_mtad vs spd")["verdict"] == CONTRADICTED
    eq = _row(rows, 5, "cnn_dailymail", "spd vs multinomial", "Rouge-L")  # +0.01 +- 0.001: astride
    assert eq["verdict"] == OPEN and float(eq["ci_low"]) < 0.01 < float(eq["ci_high"])  # the bound


def test_report_speed_claim_reads_the_sample_rows(report):
    rows, _ = report
    r = _row(rows, 4, "humaneval", "tree_mtad vs spd")
    assert float(r["estimate"]) == pytest.approx(1.25) and r["verdict"] == HOLDS
    assert r["n"] == "12" and "mode=sample" in r["detail"] and "fixed length 64 tokens" in r["detail"]
    assert r["size"] == SMALLER  # 1.25, every prompt alike, below the paper's 1.42
    pooled = _row(rows, 4, "all", "tree_mtad vs spd")  # equal task weights, stratified
    assert float(pooled["estimate"]) == pytest.approx(math.sqrt(1.25 * 1.1), rel=1e-3)
    assert pooled["verdict"] == HOLDS and pooled["n"] == "24" and "bootstrap within tasks" in pooled["detail"]
    mcss = _row(rows, 4, "all", "tree_mtad vs mcss")
    assert mcss["verdict"] == OPEN and "no records" in mcss["detail"]


def test_speed_rows_follow_the_minimum_pairs_rule(tmp_path):
    """8 prompts per task: per-task rows and the pooled row show intervals, none a verdict; a
    file that was not measured at a fixed length says so."""
    path = tmp_path / "speed.json"
    path.write_text(json.dumps(_speed_file(n_prompts=8, fixed=False)))
    rows = claims.speed_rows(path, seed=0)
    spd = [r for r in rows if r.comparison == "tree_mtad vs spd"]
    assert [r.task for r in spd] == ["humaneval", "spider", "all"]
    assert all(r.verdict == OPEN and not math.isnan(r.ci_low) for r in spd)
    assert spd[-1].n == 16 and "fewer than 10 pairs" in spd[-1].detail
    assert "not fixed-length" in spd[-1].detail


def test_fewer_than_min_pairs_get_no_verdict():
    """A partly generated point (here 4 pairs, all far apart) shows its interval, no verdict."""
    iv = stats.ratio_of_geometric_means([2.0, 2.1, 2.2, 2.3], [1.0, 1.0, 1.1, 1.0])
    row = claims._fill(claims.Row(1, "mt_bench", "a vs b", "perplexity ratio", ""), iv,
                       claims.Direction(1.0, "below"))
    assert row.n == 4 and row.ci_low > 1.5 and row.verdict == OPEN
    assert f"n < {claims.MIN_PAIRS} pairs" in row.detail


def test_report_markdown(report):
    _, out = report
    md = (out / "claims.md").read_text()
    for text in (
        "## Headline: the paper's figures",
        "| claim | task | comparison | metric | paper | estimate | 95% CI | n | direction | size | Holm |",
        "| 6 | all | mtad vs multinomial | score relative change | +43.0% (average over tasks)",
        "not measurable on this machine (no power counters): no readable RAPL package domain",
        "| chatgpt_prompts | local:chatgpt_prompts | yes |",
        "| spider | local:spider | no |",
        "## Multiplicity",
        "-0.05 for EX and pass@1",
        "-0.01 for Rouge-L",
        "[0.97, 1.03]",
        "## Sample size for claim 1",
        "## Sample size for claim 5",
        "no records",
        "Pilot: 30 examples per task.",
    ):
        assert text in md, text


def test_report_downstream_gain(report):
    """Claim 6: relative change of the mean score, vs multinomial and vs the lossless group."""
    rows, _ = report
    # cnn_dailymail: tree_mtad base - 0.02; the group's mean per example (multinomial base - 0.01,
    # spd base; no mcss) base - 0.005; mean base 0.305: 0.285 / 0.300 - 1
    group = _row(rows, 6, "cnn_dailymail", "tree_mtad vs lossless (multinomial + spd + specinfer + mcss)")
    assert float(group["estimate"]) == pytest.approx(0.285 / 0.3 - 1)
    assert group["verdict"] == CONTRADICTED and "group: multinomial, spd" in group["detail"]
    assert "no records: specinfer, mcss on cnn_dailymail" in group["detail"]
    spider = _row(rows, 6, "spider", "mtad vs multinomial")  # both all 1: no spread
    assert spider["paper"].startswith("+139%") and spider["verdict"] == OPEN
    pooled = _row(rows, 6, "all", "mtad vs multinomial")
    assert pooled["paper"].startswith("+43.0%") and pooled["size"] in (OPEN, SMALLER, LARGER, CONSISTENT, INCONCLUSIVE)


def test_points_at_other_settings_are_not_compared(tmp_path):
    """MTAD at temperature 1 and multinomial at 0.7: the row refuses to compare them ("settings
    differ"); a second multinomial point at temperature 1 is the one compared."""
    def ident(temperature):
        return {"decoder": {"_target_": "x"}, "decoder_version": "1", "model": {"name": "pair"},
                "task": {"name": "spider"}, "sampling": {"temperature": temperature, "top_k": 10,
                                                         "top_p": 0.9}, "seed": 42, "max_new_tokens": 128}

    root = tmp_path / "records"
    _write_point(root / "s" / "mtad", "mtad", "spider", identity=ident(1.0))
    _write_point(root / "s" / "mn07", "multinomial", "spider", identity=ident(0.7))
    records, notes = claims.read_records(root)
    spec = next(s for s in claims.specs() if s.claim == 1 and s.task == "spider"
                and s.comparison == "mtad vs multinomial")
    row = claims.compare(records, spec)
    assert row.n == 0 and row.verdict == OPEN
    assert "settings differ" in row.detail and "sampling.temperature: 1 vs 0.7" in row.detail
    _write_point(root / "t" / "mn10", "multinomial", "spider", identity=ident(1))
    records, notes = claims.read_records(root)
    assert len(records[("multinomial", "spider")]) == 2
    assert any("other settings" in n for n in notes)
    row = claims.compare(records, spec)
    assert row.n == N and row.verdict == HOLDS and "settings differ" not in row.detail


def test_missing_everything_gives_unresolved_rows(tmp_path):
    rows = claims.evaluate_claims({}, tmp_path / "none.json")
    assert rows and all(r.verdict == OPEN and r.n == 0 for r in rows)
    assert all("no records" in r.detail for r in rows if r.claim != 7)
    assert all(r.detail == claims.ENERGY_UNAVAILABLE for r in rows if r.claim == 7)
    records, notes = claims.read_records(tmp_path / "absent")
    assert records == {} and "no such folder" in notes[0]


def test_needed_n_scales_with_the_squared_width():
    row = claims.Row(1, "spider", "mtad vs spd", "perplexity ratio", "", 0.95, 0.8, 1.1, 30)
    assert claims_report.needed_n(row) == 61  # 30 * (0.3 / 0.212)^2 = 60.07
    row.ci_low, row.ci_high = 0.85, 0.95  # already narrower: the current n
    assert claims_report.needed_n(row) == 30


def test_claim5_sample_size_uses_the_equivalence_band():
    width = claims_report.equivalence_band_width
    assert width("perplexity ratio (geometric means)") == pytest.approx(0.06)
    assert width("EX difference") == pytest.approx(0.1)
    assert width("Rouge-L difference") == pytest.approx(0.02)
    row = claims.Row(5, "spider", "spd vs multinomial", "perplexity ratio", "", 1.0, 0.955, 1.045, 30)
    assert claims_report.needed_n(row, width(row.metric)) == 68  # 30 * 1.5^2 = 67.5


def test_reproduce_claims_plans_the_committed_points():
    """`make reproduce-claims`: the sweep files compose every point (4 decoders x 5 tasks,
    SpecInfer/BiLD x 5 tasks, the four on Spider's first 100, SpecInfer on 30 of each task, MCSS
    on 30 of each task), and every committed record folder is one of those points, so the
    command resumes the committed records instead of generating them again; claims_spider's
    points are claims.yaml's and claims_specinfer's are claims_tree.yaml's (same identity), so
    they start from their records. claims_mcss's points are new, at claims.yaml's settings."""
    import yaml

    from mtad.run import sweep as sw
    from mtad.run.results import PointFolder, identity
    from mtad.run.results.identity import without_stop

    root = Path(__file__).resolve().parents[2]
    hashes = {}
    stages = (("claims", 20), ("claims_tree", 10), ("claims_spider", 4), ("claims_specinfer", 5),
              ("claims_mcss", 5))
    # the order make reproduce-claims runs them in: declared once, in the stages file
    declared = yaml.safe_load((root / "experiments" / "claims_stages.yaml").read_text())["stages"]
    assert declared == [name for name, _ in stages]
    not_yet_run = {"claims_mcss"}
    for name, n in stages:
        s = sw.load(root / "experiments" / f"{name}.yaml", root=root / "results" / "claims")
        assert len(s.known()) == len(s.points) == n
        hashes[name] = {p.hash for p in s.known()}
        folder = root / "results" / "claims" / name
        committed = [d for d in folder.iterdir() if d.is_dir() and not d.name.startswith(".")] \
            if folder.is_dir() else []
        assert committed or name in not_yet_run, f"results/claims/{name}: no committed records"
        # each folder holds one of the points (an adopted folder keeps its old name), or a
        # HumanEval point under the stop set it had before its stop sequences (computed again apart)
        planned = [without_stop(identity(p.cfg)) for p in s.known()]
        for d in committed:
            stored, _ = PointFolder(d).stored()
            assert PointFolder(d).identity_hash() in hashes[name] or (
                stored["task"]["name"] == "humaneval" and without_stop(stored) in planned), d.name
    assert hashes["claims_spider"] <= hashes["claims"]
    assert hashes["claims_specinfer"] <= hashes["claims_tree"]
    mcss = sw.load(root / "experiments" / "claims_mcss.yaml", root=root / "results" / "claims")
    base = sw.load(root / "experiments" / "claims.yaml", root=root / "results" / "claims")
    for p in mcss.points:  # the claims' settings: only the decoder differs from claims.yaml's
        twin = next(q for q in base.points if q.choices["task"] == p.choices["task"])
        for key in ("seed", "max_new_tokens", "temperature", "top_k", "top_p", "limit", "model", "task"):
            assert p.cfg[key] == twin.cfg[key], key
    makefile = (root / "Makefile").read_text()
    assert "CLAIMS_STAGES := experiments/claims_stages.yaml" in makefile
    assert "$(CLAIMS_STAGES)" in makefile.split("reproduce-claims:", 1)[1].split("\n\n", 1)[0]
    assert "claims_tree claims_spider" not in makefile  # the stages are listed in one place only


def test_points_no_longer_in_the_sweep_index_are_still_read(tmp_path):
    """A point whose identity changed (a new stop set) is listed in sweep.json under its new,
    not yet generated folder; its old folder keeps its records at its old settings: read, noted."""
    root = tmp_path / "records"
    _write_point(root / "claims" / "old_mtad", "mtad", "humaneval")
    _write_point(root / "claims" / "old_multinomial", "multinomial", "humaneval")
    write_json_atomic(root / "claims" / "sweep.json",
                      {"points": [{"hash": "new1", "dir": "new1"}, {"hash": "new2", "dir": "new2"}]})
    records, notes = claims.read_records(root)
    assert {("mtad", "humaneval"), ("multinomial", "humaneval")} <= set(records)
    assert sum("not a point of its sweep's current definition" in n for n in notes) == 2
    spec = next(s for s in claims.specs() if s.claim == 1 and s.task == "humaneval"
                and s.comparison == "mtad vs multinomial")
    assert claims.compare(records, spec).n == N


def test_the_speed_file_is_given_not_assumed():
    """Claim 4's benchmark file comes from the command line (make: CLAIM4_SPEED), not from a
    path inside the library."""
    import inspect

    assert not hasattr(claims, "SPEED_FILE")
    param = inspect.signature(claims.evaluate_claims).parameters["speed_file"]
    assert param.default is inspect.Parameter.empty
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    recipe = makefile.split("reproduce-claims:", 1)[1].split("\n\n", 1)[0]
    assert "--speed $(CLAIM4_SPEED)" in recipe


def test_the_claims_names_are_the_stages_axes():
    """The tasks and decoders the claims compare (declared once in mtad.analysis.claims) are
    config-group names and the axes of the claims' stage sweep files."""
    import yaml
    from omegaconf import OmegaConf

    from mtad.run.cli import CONF_DIR

    root = Path(__file__).resolve().parents[2]
    stages = yaml.safe_load((root / "experiments" / "claims_stages.yaml").read_text())["stages"]
    tasks, decoders = set(), set()
    for stage in stages:
        params = OmegaConf.load(root / "experiments" / f"{stage}.yaml").hydra.sweeper.params
        tasks |= set(str(params.task).split(","))
        decoders |= set(str(params.decoder).split(","))
    assert set(claims.TASKS) == tasks
    assert tuple(OmegaConf.load(root / "experiments" / "claims.yaml").hydra.sweeper.params.task.split(",")) \
        == claims.TASKS  # claims.yaml, the first stage, runs every task
    assert set(claims.DECODERS) <= decoders and set(claims.OURS) | set(claims.LOSSLESS) == set(claims.DECODERS)
    assert set(claims.SCORED) <= set(claims.TASKS) and set(claims.PAPER_SPEEDUP) <= set(claims.DECODERS)
    for name in claims.DECODERS:
        assert (CONF_DIR / "decoder" / f"{name}.yaml").exists(), name
    for name in claims.TASKS:
        assert (CONF_DIR / "task" / f"{name}.yaml").exists(), name
    names = {s.a for s in claims.specs()} | {b for s in claims.specs() for b in s.b}
    assert names <= set(claims.DECODERS)
    assert {s.task for s in claims.specs()} <= {*claims.TASKS, claims.ALL}


def test_rows_carry_the_provenance_marks_of_the_points_they_compare():
    from mtad.analysis.claims import Row, mark_rows
    from mtad.analysis.claims_report import _n
    from mtad.analysis.provenance_marks import MARKS, point_marks

    root = Path(__file__).resolve().parents[2]
    a, b = (str(root / "results/claims/claims" / h) for h in ("91fe0ab31dcc", "2dd6fda05e12"))
    rows = [Row(1, "spider", "x vs y", "m", "p", n=30, points=(a,)), Row(1, "all", "x vs y", "m", "p", n=60, points=(a, b)),
            Row(4, "all", "speed", "m", "p", n=5)]
    mark_rows(rows)
    assert "r" in rows[0].marks  # every record of that point was made before b32eec4
    union = set(point_marks(a)) | set(point_marks(b))
    assert set(rows[1].marks) >= union - {"a"} and rows[1].marks == "".join(m for m in MARKS if m in rows[1].marks)
    assert rows[2].marks == "" and _n(rows[2]) == "5" and _n(rows[0]) == f"30 [{rows[0].marks}]"

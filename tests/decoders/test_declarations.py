"""Knobs and fits declared once, on the pieces (``mtad.core.knobs``, ``mtad.decoders.compose``).

Each piece class declares its knobs (``knobs``) and what its drafts give (``provides``) or what
it needs (``needs``); the decoders' checks, the run config's schemas and command-line
messages and the fits are derived from them. Here: no knob is declared twice (a scan of the
package's ``Knob(...)`` calls, and every rule of a field name compared across every decoder
and piece); the fits follow the declarations (changing a verifier's ``needs`` changes them);
every fitting pair runs (at the sampling settings its pieces support) and every other pair is
refused in one line; a setting the pieces do not support is refused in one line too; the
chain + greedy match composition of ``conf/decoder/greedy_match.yaml`` runs at temperature 0 and
refuses another temperature and a ``width`` in one line each with exit 2; typical acceptance takes
``decoder.eps`` and refuses a bad one.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from mtad.core.engine import Engine
from mtad.core.knobs import DRAFT_PROPERTIES, GAMMA, TAU, WIDTH, KnobError
from mtad.core.warping import Warping
from mtad.decoders.compose import PROPOSERS, VERIFIERS, Speculative, fit
from mtad.run.cli import check_overrides, compose_config, group_options
from mtad.run.config import MtadConfig, decoder_fields, decoder_knobs, rule_for
from mtad.testing import tiny_pair, unsupported_by

ROOT = Path(__file__).resolve().parents[2]


def _knob_calls() -> list[tuple[str, str]]:
    """(knob name, file) of every ``Knob("<name>", ...)`` written in the package."""
    out = []
    for path in sorted((ROOT / "mtad").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Knob" and node.args
                    and isinstance(node.args[0], ast.Constant)):
                out.append((node.args[0].value, str(path.relative_to(ROOT))))
    return out


def test_no_knob_is_declared_twice():
    """Scan: each knob name appears in one ``Knob(...)`` declaration of the whole package, and
    nothing else checks a range by hand (the per-decoder checks that existed before)."""
    seen = defaultdict(list)
    for name, where in _knob_calls():
        seen[name].append(where)
    assert {"gamma", "width", "tau", "eps", "delta", "k_config", "alpha_rb", "max_run"} <= set(seen)
    assert {n: w for n, w in seen.items() if len(w) > 1} == {}
    text = "\n".join(p.read_text() for p in (ROOT / "mtad").rglob("*.py"))
    for gone in ("def check_positive_int", "def check_tau", "def check_bool", "def check_threshold",
                 "def check_probability", "def check_branching", "FITS =", "SpeculativeSchema"):
        assert gone not in text, gone


def test_every_field_has_one_rule_wherever_it_is_used():
    """Derive and compare: every decoder of conf/decoder/ and every registered piece declares
    a field of a given name with the same rule (``auto`` aside: it applies per pair), and the
    top-level knobs are the very rules the pieces declare."""
    rules = defaultdict(set)
    for name in group_options("decoder"):
        for k in decoder_fields(compose_config([f"decoder={name}"], drop=("task", "model", "logger")).decoder).values():
            rules[k.name].add(k.without_auto().rule)
    for registry in (PROPOSERS, VERIFIERS):
        for piece in registry.values():
            for k in piece.knobs:
                rules[k.name].add(k.without_auto().rule)
    assert {n: r for n, r in rules.items() if len(r) > 1} == {}
    top = {f: MtadConfig.__dataclass_fields__[f].metadata["rule"] for f in ("gamma", "tau", "width")}
    assert top == {"gamma": GAMMA.rule, "tau": TAU.rule, "width": WIDTH.rule}


#: Identity knobs a committed YAML leaves to the default: its committed points' identities
#: were made without the field, and writing it now would change them.
IMPLICIT = {("beam_specinfer", "replacement")}


def test_every_identity_knob_is_written_in_its_yaml():
    """A field that changes the tokens is in the point's identity only if the YAML writes it."""
    from omegaconf import OmegaConf

    left = set()
    for name in group_options("decoder"):
        node = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/decoder" / f"{name}.yaml"), resolve=False)
        left |= {(name, n) for n, k in decoder_fields(node).items() if k.identity and n not in node}
    assert left == IMPLICIT


def test_auto_applies_where_the_pieces_have_a_cost_profile():
    """gamma=auto: the same answer for the same pieces (spd and typical: chain drafts, a chain
    pass), none where the cost model has no profile (spectr: i.i.d. chains, a tree pass)."""
    def special(target, **node):
        return rule_for("decoder.gamma", {"_target_": target, **node}).special

    assert special("mtad.decoders.spd.SpD") == special("mtad.decoders.typical.Typical") == ("auto",)
    assert special("mtad.decoders.compose.Speculative", proposer="chain", verifier="typical") == ("auto",)
    assert special("mtad.decoders.spectr.SpecTr") == special("mtad.decoders.mjgd.MJGD") == ()


def test_fits_follow_the_pieces_declarations(monkeypatch):
    from mtad.verify.typical import TypicalAcceptance

    fit("chain", "typical")
    with pytest.raises(KnobError):
        fit("beam", "typical")
    monkeypatch.setattr(TypicalAcceptance, "needs", ("beam_history",))  # a changed declaration
    fit("beam", "typical")
    with pytest.raises(KnobError, match="needs beam history"):
        fit("chain", "typical")


def _fits(p: str, v: str) -> bool:
    return set(VERIFIERS[v].needs()) <= set(PROPOSERS[p].provides())


PAIRS = [(p, v) for p in PROPOSERS for v in VERIFIERS]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.mark.parametrize("proposer, verifier", [pv for pv in PAIRS if _fits(*pv)])
def test_every_pair_that_fits_runs(pair, proposer, verifier):
    target, draft = pair
    dec = Speculative(proposer, verifier)
    w = next(w for w in (Warping(1.0, top_k=10), Warping(0.0)) if not unsupported_by(dec, w))
    res = Engine(target, draft, dec, w).generate([3, 4, 5], 12, seed=1)
    assert len(res.output_ids) == 12 and all(s.accepted <= s.drafted for s in res.steps)


@pytest.mark.parametrize("proposer, verifier", [pv for pv in PAIRS if not _fits(*pv)])
def test_every_pair_that_does_not_fit_is_refused_in_one_line(proposer, verifier):
    with pytest.raises(KnobError) as e:
        Speculative(proposer, verifier)
    text = str(e.value)
    assert "\n" not in text and f"verifier {verifier!r} needs " in text and "proposers that give it:" in text
    needed = VERIFIERS[verifier].needs()
    assert any(DRAFT_PROPERTIES[m] in text for m in needed if m not in PROPOSERS[proposer].provides())


def test_a_refused_pair_is_refused_before_loading(capsys):
    with pytest.raises(SystemExit) as e:
        check_overrides(["+experiment=debug", "decoder=greedy_match", "temperature=0", "decoder.proposer=beam"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert err == ("error: decoder=greedy_match: verifier 'greedy_match' needs a single chain of draft tokens, "
                   "which proposer 'beam' does not give; proposers that give it: chain, confidence_run")


# ----------------------------------------------------------------------------- chain + greedy match


def test_a_chain_composition_has_no_width():
    cfg = compose_config(["decoder=greedy_match"], drop=("task", "model", "logger"))
    assert decoder_knobs(cfg.decoder) == ["gamma"] and "width" not in decoder_fields(cfg.decoder)
    assert "width" in decoder_fields({**cfg.decoder, "proposer": "beam", "verifier": "specinfer"})
    from mtad.run.results import identity

    full = compose_config(["+experiment=debug", "decoder=greedy_match", "width=7"])
    assert "width" not in identity(full)["decoder"] and identity(full)["decoder"]["gamma"] == 4


@pytest.mark.parametrize("decoder, override, message", [
    ("typical", "decoder.eps=-1", "error: decoder.eps must be in (0, 1], got -1; e.g. decoder.eps=0.09"),
    ("typical", "decoder.width=4", "error: unknown key 'decoder.width': a chain composition has no width"),
    ("greedy_match", "decoder.width=4", "error: unknown key 'decoder.width': a chain composition has no width"),
    ("greedy_match", "+decoder.width=4", "error: unknown key 'decoder.width': a chain composition has no width"),
    ("greedy_match", "temperature=0.7", "error: decoder=greedy_match: verifier 'greedy_match' supports "
                                        "temperature 0 only (it accepts a draft token iff it is the target's "
                                        "argmax), got temperature=0.7; set temperature=0"),
])
def test_chain_compositions_refuse_in_one_line(decoder, override, message, capsys):
    temperature = [] if override.startswith("temperature") else ["temperature=0"]
    with pytest.raises(SystemExit) as e:
        check_overrides(["+experiment=debug", f"decoder={decoder}", *temperature, override])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith(message), err


def test_typical_takes_eps_and_greedy_match_temperature_zero():
    check_overrides(["+experiment=debug", "decoder=typical", "decoder.eps=0.2"])
    assert rule_for("decoder.eps").ok(0.2)
    check_overrides(["+experiment=debug", "decoder=greedy_match", "temperature=0"])
    check_overrides(["+experiment=debug", "decoder=greedy_match", "temperature=0", "top_k=0", "top_p=1.0"])


def test_sampling_follows_the_pieces_declarations(monkeypatch):
    """Derived, not listed: what a composition supports, ``stochastic`` and the refusal follow
    its pieces' ``sampling`` (a changed declaration changes them)."""
    from mtad.core.knobs import Sampling
    from mtad.verify.typical import TypicalAcceptance

    assert Speculative("chain", "greedy_match").stochastic is False
    assert Speculative("chain", "greedy_match").sampling_problem(0.0) is None
    assert Speculative("chain", "typical").stochastic is True
    monkeypatch.setattr(TypicalAcceptance, "sampling", Sampling(greedy=False, why="a test's declaration"), raising=False)
    dec = Speculative("chain", "typical")
    assert dec.stochastic is True and dec.sampling_problem(1.0) is None
    assert dec.sampling_problem(0.0) == ("verifier 'typical' needs temperature > 0 (a test's declaration), "
                                         "got temperature=0; e.g. temperature=1.0")
    with pytest.raises(ValueError, match="^decoder 'speculative': verifier 'typical' needs temperature > 0"):
        Engine(*tiny_pair(), dec, Warping(0.0))
    monkeypatch.setattr(TypicalAcceptance, "sampling", Sampling(top_p=False), raising=False)
    assert "does not support top-p" in Speculative("chain", "typical").sampling_problem(1.0, 10, 0.9)


def _run_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_run_py_runs_typical_and_refuses_a_width(tmp_path):
    """The command line itself: a run with decoder.eps=0.2 (one example) and exit 2 on a width."""
    res = _run_py("+experiment=debug", "decoder=typical", "decoder.eps=0.2", "limit=1",
                  f"hydra.run.dir={tmp_path / 'run'}")
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "run" / "samples.jsonl").read_text().count("\n") == 1
    res = _run_py("+experiment=debug", "decoder=typical", "decoder.width=4",
                  f"hydra.run.dir={tmp_path / 'refused'}")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "a chain composition has no width" in res.stderr and not (tmp_path / "refused").exists()


def test_run_py_refuses_greedy_match_above_temperature_zero_before_writing(tmp_path):
    """A setting the pieces do not support: exit 2, one line, no run folder."""
    res = _run_py("+experiment=debug", "decoder=greedy_match", "temperature=1",
                  f"hydra.run.dir={tmp_path / 'refused'}")
    assert res.returncode == 2 and res.stderr.strip() == (
        "error: decoder=greedy_match: verifier 'greedy_match' supports temperature 0 only (it accepts a draft "
        "token iff it is the target's argmax), got temperature=1; set temperature=0"), res.stderr
    assert not (tmp_path / "refused").exists()

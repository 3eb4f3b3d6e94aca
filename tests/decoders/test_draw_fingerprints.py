"""Every decoder's seeded random stream, fingerprinted: a change that alters what a decoder
draws (the tokens it emits, the drafts it accepts) for a given seed fails here unless that
decoder's ``version`` is bumped in the same change, since a point's identity holds the version
and records of one identity must come from one stream.

Each decoder under ``conf/decoder/`` generates on the tiny float64 pair (deterministic on any
CPU) for a few prompts, seeds and warpings; the hash of its output ids and per-step accepted /
emitted counts is compared with ``draw_fingerprints.json`` (decoder -> version and hash).

Two draw schemes (``mtad.core.warping.Warping.scheme``): ``hash`` and ``large`` are the
exponential race's streams (every case drawn with ``draws="race"``, the scheme they were recorded
with, also at plain temperature and top-p alone); ``inverse_cdf`` is the stream of the settings
whose default is the inverse CDF (plain temperature and top-p alone, small and large
vocabularies), whose points carry ``draw_version`` in their identity
(``mtad.run.results.identity.draw_version``: ``DRAW_VERSION``, with the name of a proposer's own
inverse-CDF draws where it has some; bump the version, or the decoder's, when that stream
changes).
After bumping a decoder's version, rewrite its entry with

    python tests/decoders/test_draw_fingerprints.py --update

which refuses to rewrite an entry whose stream changed while its version did not.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # the tool: this checkout's package, not another one on the path
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402

import mtad  # noqa: E402
from mtad.core.engine import Engine  # noqa: E402
from mtad.core.warping import INVERSE_CDF, Warping  # noqa: E402
from mtad.models.tiny import tiny_causal_lm  # noqa: E402
from mtad.run.cli import group_options, load_decoder  # noqa: E402
from mtad.run.results.identity import draw_version  # noqa: E402
from mtad.testing import tiny_pair, unsupported_by  # noqa: E402

FILE = Path(__file__).with_name("draw_fingerprints.json")
#: (prompt, seed, warping): sampled at T=1 with the paper's top-k / top-p, and a sharper and a
#: flatter warping, so that acceptance both succeeds and fails along the way.
CASES = (([3, 4, 5], 1, (1.0, 10, 0.9)), ([7, 1], 5, (0.7, 0, 1.0)), ([2, 9, 9, 4], 11, (1.3, 20, 0.95)))
LENGTH = 24
#: ``CASES`` at temperature 0: the tiny pair's cases of a decoder that supports none of ``CASES``
#: (temperature 0 only)
GREEDY_CASES = tuple((prompt, seed, (0.0, top_k, top_p)) for prompt, seed, (_, top_k, top_p) in CASES)
#: the same on a vocabulary above ``mtad.core.sampling.DENSE_MAX``, where draws are made on supports
#: (the sparse paths a real vocabulary takes), with a random draft and with a copy of the target
#: (long acceptances), greedy, top-k + top-p, top-p alone and plain temperature.
LARGE_VOCAB = 5000
LARGE_CASES = tuple((draft, [11, 4000, 7], seed, w) for draft, seed in (("random", 2), ("equal", 3))
                    for w in ((0.0, 0, 1.0), (1.0, 10, 0.9), (1.0, 0, 0.9), (0.8, 0, 1.0)))
LARGE_LENGTH = 16
#: settings drawn by inverse CDF by default (temperature > 0, no top-k): (prompt, seed, warping)
CDF_CASES = (([7, 1], 5, (0.7, 0, 1.0)), ([3, 4, 5], 1, (1.0, 0, 0.9)))
CDF_LARGE_CASES = tuple(c for c in LARGE_CASES if c[3][0] > 0 and c[3][1] == 0)


def _pair():
    return tiny_pair()


def _large():
    t = tiny_causal_lm("qwen2", vocab_size=LARGE_VOCAB, hidden_size=16, num_heads=2, num_layers=1,
                       dtype=torch.float64, seed=0, logit_scale=6.0)
    d = tiny_causal_lm("qwen2", vocab_size=LARGE_VOCAB, hidden_size=16, num_heads=2, num_layers=1,
                       dtype=torch.float64, seed=1, logit_scale=6.0)
    return {"random": (t, d), "equal": (t, t)}


def _hash(dec, runs, draws: str | None = "race") -> str | None:
    """The hash of ``dec``'s runs at the settings it supports (None where it supports none);
    ``draws``: the scheme (None: the settings' default)."""
    h, ran = hashlib.sha256(), False
    for target, draft, prompt, seed, (temp, top_k, top_p), length in runs:
        warping = Warping(temp, top_k=top_k, top_p=top_p, draws=draws)
        if unsupported_by(dec, warping):
            continue
        res = Engine(target, draft, dec, warping).generate(prompt, length, seed=seed)
        h.update(json.dumps([res.output_ids, [s.accepted for s in res.steps],
                             [s.emitted for s in res.steps]]).encode())
        ran = True
    return h.hexdigest()[:16] if ran else None


def fingerprint(name: str, pair) -> tuple[str, str | None]:
    """(version, hash) of decoder ``name``'s seeded generations on the tiny pair (``CASES``, or
    ``GREEDY_CASES`` for a decoder that supports none of them)."""
    target, draft = pair
    dec = load_decoder(name)
    cases = CASES if any(not unsupported_by(dec, Warping(*w)) for _, _, w in CASES) else GREEDY_CASES
    return str(getattr(dec, "version", None)), _hash(dec, [(target, draft, p, s, w, LENGTH) for p, s, w in cases])


def fingerprint_large(name: str, pairs) -> str | None:
    """The hash of decoder ``name``'s seeded generations on the large-vocabulary pairs."""
    return _hash(load_decoder(name), [(*pairs[d], p, s, w, LARGE_LENGTH) for d, p, s, w in LARGE_CASES])


def fingerprint_cdf(name: str, pair, pairs) -> str:
    """The hash of decoder ``name``'s seeded generations at the inverse-CDF settings (their default
    scheme), on the tiny pair and the large-vocabulary pairs."""
    target, draft = pair
    runs = [(target, draft, p, s, w, LENGTH) for p, s, w in CDF_CASES]
    runs += [(*pairs[d], p, s, w, LARGE_LENGTH) for d, p, s, w in CDF_LARGE_CASES]
    for *_, w, _n in runs:
        assert Warping(*w).scheme == INVERSE_CDF
    return _hash(load_decoder(name), runs, draws=None)


@functools.cache
def _draw_version(name: str) -> str:
    """The ``draw_version`` a point of decoder ``name`` drawn by inverse CDF carries
    (``mtad.run.results.identity.draw_version`` of its resolved config)."""
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from mtad.run.cli import CONF_DIR, _compose

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = _compose(["~task", "~model", "~logger", f"decoder={name}"])
    return draw_version(OmegaConf.to_container(cfg.decoder, resolve=True))


def _no_case(name: str, cases) -> str:
    """Why decoder ``name`` has no hash for ``cases``: the first case's refusal."""
    temp, top_k, top_p = cases[0][-1]
    return f"no case at a supported setting ({unsupported_by(load_decoder(name), Warping(temp, top_k, top_p))})"


@pytest.fixture(scope="module")
def pair():
    return _pair()


@pytest.fixture(scope="module")
def large():
    return _large()


def _committed() -> dict:
    return json.loads(FILE.read_text())


@pytest.mark.parametrize("name", group_options("decoder"))
def test_draws_unchanged_unless_the_version_is_bumped(pair, name):
    committed = _committed().get(name)
    assert committed is not None, (
        f"decoder {name} has no draw fingerprint: run python tests/decoders/test_draw_fingerprints.py --update")
    version, digest = fingerprint(name, pair)
    if digest is None and committed["hash"] is None:
        pytest.skip(_no_case(name, CASES))
    if version == committed["version"]:
        assert digest == committed["hash"], (
            f"decoder {name}'s seeded draws changed (fingerprint {committed['hash']} -> {digest}) "
            f"but its version is still {version}: bump the decoder's `version` (records of one "
            "identity must come from one stream), then run "
            "python tests/decoders/test_draw_fingerprints.py --update")
    else:
        pytest.fail(f"decoder {name}'s version changed ({committed['version']} -> {version}): record "
                    "its new stream with python tests/decoders/test_draw_fingerprints.py --update")


@pytest.mark.parametrize("name", group_options("decoder"))
def test_large_vocabulary_draws_unchanged_unless_the_version_is_bumped(large, name):
    """The same rule where draws are made on supports (a vocabulary above DENSE_MAX)."""
    committed = _committed().get(name)
    assert committed is not None and "large" in committed, (
        f"decoder {name} has no large-vocabulary fingerprint: run "
        "python tests/decoders/test_draw_fingerprints.py --update")
    version = str(getattr(load_decoder(name), "version", None))
    if version != committed["version"]:
        pytest.fail(f"decoder {name}'s version changed ({committed['version']} -> {version}): record "
                    "its new stream with python tests/decoders/test_draw_fingerprints.py --update")
    digest = fingerprint_large(name, large)
    if digest is None and committed["large"] is None:
        pytest.skip(_no_case(name, LARGE_CASES))
    assert digest == committed["large"], (
        f"decoder {name}'s seeded draws on a large vocabulary changed (fingerprint {committed['large']} "
        f"-> {digest}) but its version is still {version}: bump the decoder's `version`, then run "
        "python tests/decoders/test_draw_fingerprints.py --update")


@pytest.mark.parametrize("name", group_options("decoder"))
def test_inverse_cdf_draws_unchanged_unless_a_version_is_bumped(pair, large, name):
    """The same rule for the inverse-CDF stream (plain temperature, top-p alone)."""
    committed = _committed().get(name)
    assert committed is not None and INVERSE_CDF in committed, (
        f"decoder {name} has no inverse-CDF fingerprint: run "
        "python tests/decoders/test_draw_fingerprints.py --update")
    version = str(getattr(load_decoder(name), "version", None))
    if version != committed["version"] or _draw_version(name) != committed["draw_version"]:
        pytest.fail(f"decoder {name}'s version or the draw version changed: record its new stream with "
                    "python tests/decoders/test_draw_fingerprints.py --update")
    digest = fingerprint_cdf(name, pair, large)
    if digest is None and committed[INVERSE_CDF] is None:
        pytest.skip(_no_case(name, CDF_CASES))
    assert digest == committed[INVERSE_CDF], (
        f"decoder {name}'s inverse-CDF draws changed (fingerprint {committed[INVERSE_CDF]} -> {digest}) "
        f"but neither its version ({version}) nor its draw version ({_draw_version(name)}) was bumped")


def test_every_fingerprinted_decoder_still_exists():
    assert set(_committed()) <= set(group_options("decoder"))


def test_the_tool_imports_the_checkout_it_stands_in(tmp_path):
    """Run by path with another ``mtad`` first on the path (an editable install of another
    checkout, PYTHONPATH): it imports this checkout's package, not that one."""
    other = tmp_path / "other" / "mtad"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("raise SystemExit('imported another checkout')\n")
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--help"], cwd=tmp_path, text=True,
                         capture_output=True, timeout=300, env={**os.environ, "PYTHONPATH": str(other.parent)})
    assert "imported another checkout" not in res.stderr, res.stderr
    assert res.returncode == 2 and "draw_fingerprints.json" in res.stdout, res.stderr[-2000:]


def update(names: list[str] | None = None) -> int:
    """Rewrite the entries of decoders whose version changed (or that are new); refuse one
    whose stream changed under the same version. ``names``: only those decoders (default: all;
    the others' entries are kept as they are, those of decoders no longer in conf/decoder/ dropped)."""
    pair, large = _pair(), _large()
    old = _committed() if FILE.exists() else {}
    new, refused = {}, []
    unknown = sorted(set(names or ()) - set(group_options("decoder")))
    if unknown:
        print(f"error: no conf/decoder/{unknown[0]}.yaml", file=sys.stderr)
        return 2
    for name in group_options("decoder"):
        if names and name not in names:
            if name in old:
                new[name] = old[name]
            continue
        version, digest = fingerprint(name, pair)
        digest_large = fingerprint_large(name, large)
        digest_cdf = fingerprint_cdf(name, pair, large)
        before = old.get(name)
        same_cdf = before and before.get("draw_version", _draw_version(name)) == _draw_version(name)
        if before and before["version"] == version and (
                before["hash"] != digest or before.get("large", digest_large) != digest_large
                or (same_cdf and before.get(INVERSE_CDF, digest_cdf) != digest_cdf)):
            refused.append(name)
            new[name] = before
        else:
            new[name] = {"version": version, "hash": digest, "large": digest_large,
                         INVERSE_CDF: digest_cdf, "draw_version": _draw_version(name)}
    FILE.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
    for name in refused:
        print(f"{name}: draws changed under the same version {old[name]['version']} (draw version "
              f"{_draw_version(name)}): bump one first",
              file=sys.stderr)
    return 1 if refused else 0


if __name__ == "__main__":
    if not Path(mtad.__file__).resolve().is_relative_to(ROOT):
        print(f"error: this tool records {ROOT}'s decoders but imported mtad from {mtad.__file__}; "
              f"run it from that checkout: cd {ROOT} && python tests/decoders/test_draw_fingerprints.py --update",
              file=sys.stderr)
        sys.exit(2)
    if sys.argv[1:2] != ["--update"]:
        print(__doc__)
        sys.exit(2)
    sys.exit(update(sys.argv[2:]))

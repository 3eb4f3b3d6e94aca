"""The default pair's CPU choice (mtad.models.cpu_choice) and what a run records of the machine."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import mtad.run.config  # noqa: F401  (registers the schema and the ${mtad_cpu_pair:...} resolver)
from mtad.core.machine import cpu_info
from mtad.models import cpu_choice as cc
from mtad.run.results import identity, identity_hash

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"

#: /proc/cpuinfo stand-ins (two processors each) for the machine kinds this project runs on.
_FLAGS_AVX2 = "fpu sse4_2 fma f16c avx avx2 bmi2"
_FLAGS_AVX512_BF16 = _FLAGS_AVX2 + " avx512f avx512bw avx512vl avx512_vnni avx512_bf16"
_FLAGS_AMX = _FLAGS_AVX512_BF16 + " amx_tile amx_bf16 amx_int8 avx_vnni"
_FLAGS_AVX512 = _FLAGS_AVX2 + " avx512f avx512bw avx512vl avx512_vnni"
MACHINES = {
    "avx2_only": ("AuthenticAMD", "AMD EPYC 7B12", _FLAGS_AVX2),
    "avx512_bf16": ("AuthenticAMD", "AMD EPYC 9B14", _FLAGS_AVX512_BF16),
    "amx": ("GenuineIntel", "Intel(R) Xeon(R) Platinum 8481C", _FLAGS_AMX),
    "avx512_no_bf16": ("GenuineIntel", "Intel(R) Xeon(R) Gold 6148", _FLAGS_AVX512),
}
#: bfloat16 time / float32 time a probe would measure on each kind (emulated vs native bf16).
PROBE_RATIO = {"avx2_only": 4.0, "avx512_bf16": 0.4, "amx": 0.3, "avx512_no_bf16": 0.7}
#: torch's oneDNN bfloat16 answer on each kind (AVX-512 cores convert bfloat16 without BF16).
ONEDNN = {"avx2_only": False, "avx512_bf16": True, "amx": True, "avx512_no_bf16": True}
EXPECTED = {"avx2_only": (cc.FP32_PAIR, "float32"), "avx512_bf16": (cc.BF16_PAIR, "bfloat16"),
            "amx": (cc.BF16_PAIR, "bfloat16"), "avx512_no_bf16": (cc.BF16_PAIR, "bfloat16")}
HARDWARE = {"avx2_only": "emulated", "avx512_bf16": "native", "amx": "native", "avx512_no_bf16": None}


def _cpuinfo(tmp_path: Path, kind: str) -> str:
    vendor, model, flags = MACHINES[kind]
    blocks = [f"processor\t: {i}\nvendor_id\t: {vendor}\nmodel name\t: {model}\nphysical id\t: 0\n"
              f"core id\t\t: {i}\ncpu cores\t: 2\nflags\t\t: {flags}\n" for i in range(2)]
    path = tmp_path / f"cpuinfo_{kind}"
    path.write_text("\n".join(blocks))
    return str(path)


def _fake_probe(ratio: float, calls: list | None = None):
    def probe():
        if calls is not None:
            calls.append(1)
        return {"ratio": ratio, "ms": {"bfloat16/1": ratio, "float32/1": 1.0}}
    return probe


@pytest.mark.parametrize("kind", sorted(MACHINES))
def test_choice_per_machine_kind(kind, tmp_path):
    cpu = cpu_info(_cpuinfo(tmp_path, kind))
    choice = cc.choose(cpu=cpu, probe=_fake_probe(PROBE_RATIO[kind]), path=tmp_path / "choice.json",
                       onednn=ONEDNN[kind])
    assert (choice.pair, choice.dtype) == EXPECTED[kind]
    assert choice.cpu["model"] == MACHINES[kind][1] and not choice.cached
    assert cc.pair_config(choice.pair)["target"]["dtype"] == choice.dtype
    assert f"{PROBE_RATIO[kind]:.2f}x" in choice.reason
    assert choice.probe["hardware"] == HARDWARE[kind]
    assert choice.basis == ("probe" if HARDWARE[kind] is None else "hardware")
    assert ("native bf16: yes" in choice.line()) == (kind in ("avx512_bf16", "amx"))


#: Ratios a probe read on one machine kind, quiet and loaded: the AMD EPYC with avx512_bf16 read
#: 0.31 quiet and 0.88 while installs and tests shared its two cores (wall-clock probe); an AVX2
#: machine reads above 1 quiet and nearer 1 when waiting inflates both dtypes alike.
LOADED_AND_QUIET = {"avx512_bf16": (0.31, 0.88), "amx": (0.3, 0.95), "avx2_only": (1.8, 0.9)}


@pytest.mark.parametrize("kind", sorted(LOADED_AND_QUIET))
def test_load_does_not_flip_the_choice(kind, tmp_path):
    """One machine kind gets one pair whether the probe ran quiet or loaded: where the hardware
    says native or emulated, only a reading far from the threshold can overrule it."""
    cpu = cpu_info(_cpuinfo(tmp_path, kind))
    pairs = {cc.choose(cpu=cpu, probe=_fake_probe(r), path=tmp_path / f"c{i}.json", onednn=ONEDNN[kind]).pair
             for i, r in enumerate(LOADED_AND_QUIET[kind])}
    assert pairs == {EXPECTED[kind][0]}


def test_probe_overrules_the_hardware_only_far_from_the_threshold(tmp_path):
    native = cpu_info(_cpuinfo(tmp_path, "avx512_bf16"))
    slow = cc.decide({"ratio": cc.NATIVE_OVERRULE + 0.2}, native, onednn=True)
    assert slow.dtype == "float32" and slow.basis == "probe over hardware" and "does not use it" in slow.reason
    assert cc.decide({"ratio": cc.NATIVE_OVERRULE}, native, onednn=True).dtype == "bfloat16"
    # flags without torch's oneDNN bfloat16 path: undecided, the probe's threshold decides
    assert cc.bf16_hardware(native, onednn=False) is None
    assert cc.decide({"ratio": 0.9}, native, onednn=False).dtype == "float32"
    avx2 = cpu_info(_cpuinfo(tmp_path, "avx2_only"))
    assert cc.decide({"ratio": cc.EMULATED_OVERRULE - 0.1}, avx2, onednn=False).dtype == "bfloat16"
    assert cc.decide({"ratio": cc.EMULATED_OVERRULE}, avx2, onednn=False).dtype == "float32"


def test_probe_times_work_not_waiting(monkeypatch):
    """A wall clock that jumps a second per reading (a process preempted by others) leaves the
    probe's times unchanged: it reads this thread's CPU time."""
    import time as real_time

    jumps = iter(range(10**6))

    def stalled():
        return real_time.perf_counter() + next(jumps)

    clock = types.SimpleNamespace(perf_counter=stalled, time=stalled, monotonic=stalled,
                                  thread_time=real_time.thread_time, process_time=real_time.process_time,
                                  strftime=real_time.strftime, gmtime=real_time.gmtime)
    monkeypatch.setattr(cc, "time", clock)
    out = cc.probe_bf16(repeats=3, shape=(64, 128), rows=(1, 2))
    assert all(ms < 500 for ms in out["ms"].values()), out["ms"]
    assert len(out["round_ratios"]) == 3


def test_probe_leaves_torch_threads_as_they_were():
    import torch

    before = torch.get_num_threads()
    cc.probe_bf16(repeats=1, shape=(32, 64), rows=(1,))
    assert torch.get_num_threads() == before


def test_entry_of_the_first_rule_is_decided_again(tmp_path, monkeypatch):
    """A cache written by the wall-clock rule (version 1) is not read by this one, and stays
    readable: its entries keep their layout (a Choice without ``basis``)."""
    path = tmp_path / "choice.json"
    cpu = cpu_info(_cpuinfo(tmp_path, "avx512_bf16"))
    monkeypatch.setattr(cc, "PROBE_VERSION", "1")
    old_key = cc.machine_key(cpu)
    path.write_text(json.dumps({old_key: {"pair": cc.FP32_PAIR, "dtype": "float32", "reason": "0.88x",
                                          "probe": {"ratio": 0.88}, "cpu": cpu, "decided_utc": None}}))
    assert cc.choose(cpu=cpu, path=path, probe=_fake_probe(0.1), onednn=True).cached  # v1 reads its entry
    monkeypatch.undo()
    calls: list = []
    new = cc.choose(cpu=cpu, path=path, probe=_fake_probe(0.88, calls), onednn=True)
    assert calls and not new.cached and new.dtype == "bfloat16"
    assert set(json.loads(path.read_text())) == {old_key, cc.machine_key(cpu)}


def test_choice_is_kept_per_machine(tmp_path):
    """Decided once per machine: the second call reads the cache; another CPU or --reprobe measures."""
    path = tmp_path / "choice.json"
    calls: list = []
    avx2 = cpu_info(_cpuinfo(tmp_path, "avx2_only"))
    amx = cpu_info(_cpuinfo(tmp_path, "amx"))
    first = cc.choose(cpu=avx2, probe=_fake_probe(4.0, calls), path=path, onednn=False)
    again = cc.choose(cpu=avx2, probe=_fake_probe(0.1, calls), path=path, onednn=False)  # a noisy probe would flip it
    assert len(calls) == 1 and again.cached and again.pair == first.pair == cc.FP32_PAIR
    other = cc.choose(cpu=amx, probe=_fake_probe(0.3, calls), path=path, onednn=False)
    assert len(calls) == 2 and other.pair == cc.BF16_PAIR
    assert len(json.loads(path.read_text())) == 2
    redone = cc.choose(reprobe=True, cpu=avx2, probe=_fake_probe(0.1, calls), path=path, onednn=False)
    assert len(calls) == 3 and redone.pair == cc.BF16_PAIR and not redone.cached


def test_decide_threshold():
    assert cc.decide({"ratio": cc.BF16_MAX_RATIO}, {}).dtype == "bfloat16"
    assert cc.decide({"ratio": cc.BF16_MAX_RATIO + 0.01}, {}).dtype == "float32"


def test_probe_measures_both_dtypes():
    out = cc.probe_bf16(repeats=3, shape=(32, 64), rows=(1, 2))
    assert set(out["ms"]) == {"bfloat16/1", "bfloat16/2", "float32/1", "float32/2"}
    assert all(v >= 0 for v in out["ms"].values()) and out["ratio"] > 0
    assert out["clock"] == "thread_time" and out["threads"] == 1 and len(out["round_ratios"]) == 3


# ---- the auto pair resolves to one named pair; only resolved values enter an identity ----


def _compose(overrides=()):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=False)
    return OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "output_dir"])


@pytest.fixture
def chosen(monkeypatch):
    """Make this process's choice the pair given (as on an AVX2-only or a bfloat16 machine)."""
    def choose(pair: str):
        dtype = cc.pair_config(pair)["target"]["dtype"]
        monkeypatch.setattr(cc, "current", lambda: cc.Choice(pair=pair, dtype=dtype, reason="test"))
    return choose


def test_default_model_is_the_auto_pair():
    text = (CONF / "config.yaml").read_text()
    assert f"- model: {cc.AUTO_PAIR}" in text


@pytest.mark.parametrize("pair", [cc.BF16_PAIR, cc.FP32_PAIR])
def test_auto_pair_resolves_to_the_chosen_pair(pair, chosen):
    chosen(pair)
    auto = _compose()
    named = _compose([f"model={pair}"])
    resolved = OmegaConf.to_container(auto.model, resolve=True)
    assert resolved == OmegaConf.to_container(named.model, resolve=True)
    ident = identity(auto)
    assert ident["model"]["target"]["dtype"] == cc.pair_config(pair)["target"]["dtype"]
    assert "auto" not in json.dumps(ident["model"]) and "${" not in json.dumps(ident)
    assert identity_hash(ident) == identity_hash(identity(named))


def test_bf16_and_fp32_points_never_share_an_identity(chosen):
    hashes = {}
    for pair in (cc.BF16_PAIR, cc.FP32_PAIR):
        chosen(pair)
        hashes[pair] = identity_hash(identity(_compose()))
    assert hashes[cc.BF16_PAIR] != hashes[cc.FP32_PAIR]


def test_auto_value_in_a_dtype_is_refused():
    from mtad.models.pair import parse_dtype

    with pytest.raises(ValueError, match="model.target.dtype='auto'"):
        parse_dtype("auto", "model.target.dtype")


COMMITTED = [("claims", "results/claims"), ("claims_tree", "results/claims"),
             ("claims_spider", "results/claims"), ("claims_specinfer", "results/claims"),
             ("scoring_spd", "results/scoring")]


def test_committed_sweeps_do_not_depend_on_this_cpu(monkeypatch):
    """The sweeps behind committed records name their pair: composing them never asks for the CPU
    choice, and every one of their points is still done (what ``mtad.run.sweep --dry-run`` lists),
    but the HumanEval points that the stop sequences send back for regeneration."""
    from mtad.run import sweep as sw
    from mtad.run.results.folder import DONE

    def refuse():
        raise AssertionError("a committed sweep resolved the auto pair")
    monkeypatch.setattr(cc, "current", refuse)
    for name, root in COMMITTED:
        s = sw.load(ROOT / "experiments" / f"{name}.yaml", root=ROOT / root)
        store = s.store()
        status = {p.label: s.folder(p, store).status(p.hash, p.limit)[0] for p in s.points}
        assert status, name
        # HumanEval points stop at the task's stop sequences now and are regenerated (a changed
        # identity, docs/scoring.md); every other point must still be found done
        not_done = {label for label, st in status.items() if st != DONE}
        assert all("task=humaneval" in label for label in not_done), (name, not_done)
        assert len(not_done) < len(status), (name, status)


def test_weights_needed_follow_the_choice(chosen):
    from mtad.models.offline import DRAFT, TARGET, prepare_plan

    args = types.SimpleNamespace(pair=None, auto=True, models=None, dtype=None)
    chosen(cc.FP32_PAIR)
    assert prepare_plan(args) == {TARGET: ["float32"], DRAFT: ["float32"]}
    chosen(cc.BF16_PAIR)
    assert prepare_plan(args) == {TARGET: ["bfloat16"], DRAFT: ["float32"]}
    both = types.SimpleNamespace(pair=[cc.BF16_PAIR, cc.FP32_PAIR], auto=False, models=None, dtype=None)
    assert prepare_plan(both) == {TARGET: ["bfloat16", "float32"], DRAFT: ["float32"]}
    with pytest.raises(ValueError, match="drop --models and --dtype"):
        prepare_plan(types.SimpleNamespace(pair=None, auto=True, models=None, dtype=["float32"]))
    with pytest.raises(ValueError, match="not an offline pair"):
        cc.weights_needed("tiny_random")

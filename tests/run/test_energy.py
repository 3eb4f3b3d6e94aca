"""Energy meter: RAPL on a fake powercap tree, NVML through a mocked ``pynvml``; unavailable is None, never 0."""

from __future__ import annotations

import sys
import time
import types

import pytest
import torch

from mtad.run.energy import EnergyMeter, model_devices


def _domain(root, name, energy_uj, max_range_uj=1_000_000):
    d = root / name
    d.mkdir()
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_range_uj}\n")
    return d


def _set(domain, energy_uj):
    (domain / "energy_uj").write_text(f"{energy_uj}\n")


def test_rapl_sums_package_domains_only(tmp_path):
    p0 = _domain(tmp_path, "intel-rapl:0", 1_000)
    p1 = _domain(tmp_path, "intel-rapl:1", 5_000)
    core = _domain(tmp_path, "intel-rapl:0:0", 0)  # a sub-domain: already inside package 0
    meter = EnergyMeter("cpu", rapl_root=str(tmp_path))
    assert meter.available and meter.source == "rapl" and meter.reason is None
    meter.start()
    _set(p0, 3_000_000)
    _set(p1, 6_000)
    _set(core, 999_999)
    assert meter.stop() == pytest.approx((2_999_000 + 1_000) / 1e6)


def test_rapl_counter_wrap_around(tmp_path):
    p0 = _domain(tmp_path, "intel-rapl:0", 990_000, max_range_uj=1_000_000)
    meter = EnergyMeter("cpu", rapl_root=str(tmp_path))
    meter.start()
    _set(p0, 10_000)  # wrapped past max_energy_range_uj
    assert meter.stop() == pytest.approx(0.02)


def test_rapl_unavailable_is_none_with_reason(tmp_path):
    meter = EnergyMeter("cpu", rapl_root=str(tmp_path / "no-powercap"))
    assert not meter.available and meter.source is None
    assert "RAPL" in meter.reason
    meter.start()
    assert meter.stop() is None  # never 0


def test_rapl_unreadable_domain_is_skipped(tmp_path):
    (tmp_path / "intel-rapl:0").mkdir()
    (tmp_path / "intel-rapl:0" / "energy_uj").mkdir()  # reading it fails like a permission error
    meter = EnergyMeter("cpu", rapl_root=str(tmp_path))
    assert meter.stop() is None and "RAPL" in meter.reason


class FakeNvml(types.ModuleType):
    """pynvml with per-device energy counters (mJ) and power (mW); devices in ``no_counter`` lack the counter."""

    class NVMLError(Exception):
        pass

    def __init__(self, energy_mj, power_mw, no_counter=()):
        super().__init__("pynvml")
        self.energy = dict(energy_mj)
        self.power = dict(power_mw)
        self.no_counter = set(no_counter)
        self.handles_asked: list[int] = []
        self.energy_reads: list[int] = []
        self.power_reads: list[int] = []
        self.initialized = False

    def nvmlInit(self):
        self.initialized = True

    def nvmlDeviceGetHandleByIndex(self, i):
        self.handles_asked.append(i)
        return ("handle", i)

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if h[1] in self.no_counter:
            raise self.NVMLError("Not Supported")
        self.energy_reads.append(h[1])
        return self.energy[h[1]]

    def nvmlDeviceGetPowerUsage(self, h):
        self.power_reads.append(h[1])
        return self.power[h[1]]


@pytest.fixture
def fake_nvml(monkeypatch):
    def install(**kw):
        nv = FakeNvml(**kw)
        monkeypatch.setitem(sys.modules, "pynvml", nv)
        return nv

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return install


def test_nvml_counter_on_the_used_device_only(fake_nvml):
    nv = fake_nvml(energy_mj={0: 0, 1: 10_000, 2: 0}, power_mw={0: 1, 1: 1, 2: 1})
    meter = EnergyMeter("cuda:1")
    assert meter.source == "nvml:counter" and nv.initialized
    meter.start()
    nv.energy[1] += 2_500  # 2.5 J on the device the run uses
    nv.energy[0] += 99_000  # another user's GPU: must not count
    assert meter.stop() == pytest.approx(2.5)
    assert set(nv.handles_asked) == {1} and set(nv.energy_reads) == {1}


def test_nvml_several_devices_and_visible_device_mapping(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    nv = fake_nvml(energy_mj={4: 0, 5: 0, 6: 0}, power_mw={4: 1, 5: 1, 6: 1})
    meter = EnergyMeter("cuda", cuda_indices=[0, 1])  # logical 0, 1 = physical 4, 6
    meter.start()
    nv.energy[4] += 1_000
    nv.energy[5] += 50_000
    nv.energy[6] += 3_000
    assert meter.stop() == pytest.approx(4.0)
    assert sorted(nv.handles_asked) == [4, 6]


def test_nvml_power_sampling_fallback(fake_nvml):
    nv = fake_nvml(energy_mj={0: 0}, power_mw={0: 200_000}, no_counter={0})  # 200 W, no counter
    meter = EnergyMeter("cuda:0")
    assert meter.source == "nvml:power-sampling"
    t0 = time.perf_counter()
    meter.start()
    time.sleep(0.3)
    joules = meter.stop()
    elapsed = time.perf_counter() - t0
    assert nv.power_reads and not nv.energy_reads
    # integrated from power samples: positive (never 0), bounded by 200 W over the window;
    # no lower bound tied to wall-clock scheduling of the sampler thread
    assert 0 < joules <= 200 * elapsed + 1e-6


def test_nvml_mixed_counter_and_sampling(fake_nvml):
    nv = fake_nvml(energy_mj={0: 0, 1: 0}, power_mw={0: 50_000, 1: 100_000}, no_counter={1})
    meter = EnergyMeter("cuda", cuda_indices=[0, 1])
    assert meter.source == "nvml:power-sampling"
    meter.start()
    nv.energy[0] += 7_000
    time.sleep(0.15)
    joules = meter.stop()
    assert set(nv.power_reads) == {1}  # the device with a counter is not sampled
    assert 7.0 < joules <= 7.0 + 100 * 0.5


def test_nvml_missing_is_none_with_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    meter = EnergyMeter("cuda:0")
    assert not meter.available and meter.reason.startswith("NVML unavailable")
    meter.start()
    assert meter.stop() is None


class FakeTensor:
    def __init__(self, device):
        self.device = torch.device(device)


class FakeModel:
    """What the meter reads of a model: ``hf_device_map``, parameters and buffers (devices only)."""

    def __init__(self, param_devices, device_map=None, buffer_devices=()):
        self._params = [FakeTensor(d) for d in param_devices]
        self._buffers = [FakeTensor(d) for d in buffer_devices]
        if device_map is not None:
            self.hf_device_map = device_map

    def parameters(self):
        return iter(self._params)

    def buffers(self):
        return iter(self._buffers)


def test_model_devices_reads_device_map_parameters_and_buffers():
    # a target split over GPUs 0 and 1 (device_map values: ints and strings), a draft on GPU 2;
    # the meta tensors of an offloaded module do not count as a device
    target = FakeModel(
        ["cuda:0", "cuda:1", "meta"],
        device_map={"model.embed_tokens": 0, "model.layers.0": 1, "lm_head": "cuda:1"},
    )
    draft = FakeModel(["cuda:2"], buffer_devices=["cuda:2"])
    assert model_devices([target, draft, None]) == ["cuda:0", "cuda:1", "cuda:2"]
    offloaded = FakeModel(
        ["cuda:0", "meta"],
        device_map={"model.layers.0": 0, "model.layers.1": "cpu", "lm_head": "disk"},
    )
    assert model_devices([offloaded]) == ["cpu", "cuda:0", "disk"]


def test_meter_for_models_sums_every_gpu_of_the_pair(fake_nvml):
    nv = fake_nvml(energy_mj={i: 0 for i in range(4)}, power_mw={i: 1 for i in range(4)})
    target = FakeModel(["cuda:0", "cuda:1"], device_map={"model.layers.0": 0, "model.layers.1": 1})
    draft = FakeModel(["cuda:2"])
    meter = EnergyMeter.for_models(target, draft)
    assert meter.devices == ["cuda:0", "cuda:1", "cuda:2"] and meter.source == "nvml:counter"
    meter.start()
    nv.energy[0] += 1_000
    nv.energy[1] += 2_000
    nv.energy[2] += 500
    nv.energy[3] += 80_000  # not the pair's GPU
    assert meter.stop() == pytest.approx(3.5)
    assert sorted(set(nv.handles_asked)) == [0, 1, 2] and 3 not in nv.energy_reads


def test_meter_for_models_maps_logical_indices_to_visible_devices(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    nv = fake_nvml(energy_mj={3: 0, 5: 0}, power_mw={3: 1, 5: 1})
    meter = EnergyMeter.for_models(FakeModel(["cuda:1"]), FakeModel(["cuda:0"]))
    assert meter.devices == ["cuda:0", "cuda:1"]
    meter.start()
    nv.energy[5] += 4_000
    assert meter.stop() == pytest.approx(4.0)
    assert sorted(set(nv.handles_asked)) == [3, 5]


def test_meter_for_models_on_cpu_uses_rapl(tmp_path):
    from mtad.models.pair import tiny_pair

    pair = tiny_pair()
    p0 = _domain(tmp_path, "intel-rapl:0", 0)
    meter = EnergyMeter.for_models(pair.target, pair.draft, rapl_root=str(tmp_path))
    assert meter.source == "rapl" and meter.devices == ["cpu"]
    meter.start()
    _set(p0, 1_500_000)
    assert meter.stop() == pytest.approx(1.5)


def test_run_records_the_metered_devices(tmp_path, monkeypatch):
    """A run meters its pair's devices (the tiny pair: the CPU, through a fake RAPL tree) and records them."""
    import mtad.run.energy
    from mtad.run.cli import compose_config
    from mtad.run.evaluate import run

    rapl_root = tmp_path / "powercap"
    rapl_root.mkdir()
    _domain(rapl_root, "intel-rapl:0", 0)
    real_rapl = mtad.run.energy._Rapl
    monkeypatch.setattr(mtad.run.energy, "_Rapl", lambda root: real_rapl(str(rapl_root)))
    cfg = compose_config(
        ["+experiment=debug", "limit=1", "max_new_tokens=4", f"output_dir={tmp_path / 'run'}"]
    )
    summary = run(cfg)
    assert summary["energy_source"] == "rapl" and summary["energy_devices"] == ["cpu"]
    assert summary["energy_unavailable_reason"] is None

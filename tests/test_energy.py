"""Energy meter: RAPL on a fake powercap tree, NVML through a mocked ``pynvml``; unavailable is None, never 0."""

from __future__ import annotations

import sys
import time
import types

import pytest

from mtad.energy import EnergyMeter


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

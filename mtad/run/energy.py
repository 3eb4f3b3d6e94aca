"""Energy over a timed window: NVML on the GPUs a run uses, RAPL on the CPU, else unavailable.

- GPU: NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ) read
  before and after the window, on the devices the run actually uses, after a device
  synchronize; on GPUs without the counter, ``nvmlDeviceGetPowerUsage`` (mW) is sampled
  in a background thread and integrated (trapezoid rule).
- CPU: Intel RAPL package domains under ``/sys/class/powercap`` when readable, with
  counter wrap-around handled via ``max_energy_range_uj``.
- Otherwise ``stop()`` returns None and ``reason`` says why: energy is never recorded as 0.

Which devices: ``EnergyMeter.for_models(target, draft)`` meters every GPU that holds a
weight of either model (the values of ``hf_device_map`` for a model split with
``device_map``, and the devices of its parameters and buffers) and sums them; the meter's
``devices`` lists what it reads, and runs record that list next to the energy.
It never sums coarse ``nvidia-smi`` samples of every GPU in the box, and callers keep
perplexity scoring outside the window.
"""

from __future__ import annotations

import glob
import itertools
import os
import threading
import time
from collections.abc import Iterable


class _Rapl:
    def __init__(self, root: str = "/sys/class/powercap"):
        self.domains = []
        for d in sorted(glob.glob(os.path.join(root, "intel-rapl:*"))):
            if d.count(":") != 1:  # package domains only (sub-domains are inside them)
                continue
            try:
                with open(os.path.join(d, "energy_uj")) as f:
                    int(f.read())
                with open(os.path.join(d, "max_energy_range_uj")) as f:
                    rng = int(f.read())
                self.domains.append((os.path.join(d, "energy_uj"), rng))
            except (OSError, ValueError):
                continue
        self._start: list[int] = []

    def read(self) -> list[int]:
        out = []
        for path, _ in self.domains:
            with open(path) as f:
                out.append(int(f.read()))
        return out

    def start(self) -> None:
        self._start = self.read()

    def stop(self) -> float:
        end = self.read()
        total = 0
        for (_, rng), a, b in zip(self.domains, self._start, end):
            total += b - a if b >= a else b + rng - a  # wrap-around
        return total / 1e6


class _Nvml:
    def __init__(self, cuda_indices: list[int], sample_hz: float = 20.0):
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        mapping = (
            [int(x) for x in visible.split(",")]
            if visible and visible.replace(",", "").isdigit()
            else None
        )
        self.handles = [
            pynvml.nvmlDeviceGetHandleByIndex(mapping[i] if mapping else i) for i in cuda_indices
        ]
        self.has_counter = []
        for h in self.handles:
            try:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
                self.has_counter.append(True)
            except pynvml.NVMLError:
                self.has_counter.append(False)
        self.period = 1.0 / sample_hz
        self._thread = None

    def _sampler(self):
        last_t = time.perf_counter()
        last_p = [
            self.nv.nvmlDeviceGetPowerUsage(h) / 1000 if not c else 0.0
            for h, c in zip(self.handles, self.has_counter)
        ]
        while not self._stop.is_set():
            time.sleep(self.period)
            t = time.perf_counter()
            for i, (h, c) in enumerate(zip(self.handles, self.has_counter)):
                if c:
                    continue
                p = self.nv.nvmlDeviceGetPowerUsage(h) / 1000
                self._integrated[i] += 0.5 * (p + last_p[i]) * (t - last_t)
                last_p[i] = p
            last_t = t

    def start(self) -> None:
        self._start = [
            self.nv.nvmlDeviceGetTotalEnergyConsumption(h) if c else 0
            for h, c in zip(self.handles, self.has_counter)
        ]
        self._integrated = [0.0] * len(self.handles)
        if not all(self.has_counter):
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sampler, daemon=True)
            self._thread.start()

    def stop(self) -> float:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        total = 0.0
        for i, (h, c) in enumerate(zip(self.handles, self.has_counter)):
            total += (
                (self.nv.nvmlDeviceGetTotalEnergyConsumption(h) - self._start[i]) / 1000
                if c
                else self._integrated[i]
            )
        return total


def _device_name(d) -> str | None:
    """``0`` / ``"cuda:0"`` / ``torch.device`` -> ``"cuda:0"``; ``"cpu"``; ``"disk"``; None for ``meta``."""
    import torch

    if isinstance(d, int) and not isinstance(d, bool):
        return f"cuda:{d}"
    if str(d) == "disk":
        return "disk"
    dev = torch.device(d)
    if dev.type == "meta":
        return None  # offloaded weights: their real place is in hf_device_map
    if dev.type == "cuda":
        return f"cuda:{dev.index if dev.index is not None else 0}"
    return dev.type if dev.index is None else f"{dev.type}:{dev.index}"


def model_devices(models: Iterable) -> list[str]:
    """Every device holding a weight of ``models`` (None entries skipped), sorted, GPUs by index.

    Reads ``hf_device_map`` (a model split by ``device_map``) and the devices of parameters
    and buffers, so a model moved with ``.to()`` after loading is seen where it is now.
    """
    found: set[str] = set()
    for m in models:
        if m is None:
            continue
        for d in (getattr(m, "hf_device_map", None) or {}).values():
            if (name := _device_name(d)) is not None:
                found.add(name)
        for t in itertools.chain(m.parameters(), m.buffers()):
            if (name := _device_name(t.device)) is not None:
                found.add(name)

    def key(name: str):
        kind, _, idx = name.partition(":")
        return (kind, int(idx) if idx.isdigit() else -1)

    return sorted(found, key=key)


class EnergyMeter:
    """``start()`` / ``stop() -> joules | None``; ``source``, ``reason`` and ``devices`` describe the meter.

    ``devices`` is what the meter reads: the CUDA devices (``cuda:i``, logical indices) whose
    energies are summed, ``["cpu"]`` for RAPL, empty when unavailable.
    """

    def __init__(
        self,
        device: str = "cpu",
        cuda_indices: list[int] | None = None,
        rapl_root: str = "/sys/class/powercap",
    ):
        self.source = None
        self.reason = None
        self.devices: list[str] = []
        self._impl = None
        if str(device).startswith("cuda"):
            try:
                import torch

                idx = (
                    cuda_indices if cuda_indices is not None else [torch.device(device).index or 0]
                )
                self._impl = _Nvml(idx)
                self.devices = [f"cuda:{i}" for i in idx]
                self.source = "nvml:" + (
                    "counter" if all(self._impl.has_counter) else "power-sampling"
                )
            except Exception as e:  # NVML missing, no driver, ...
                self.reason = f"NVML unavailable: {e}"
        else:
            rapl = _Rapl(rapl_root)
            if rapl.domains:
                self._impl = rapl
                self.source = "rapl"
                self.devices = ["cpu"]
            else:
                self.reason = f"no readable RAPL package domain under {rapl_root} (needs Intel RAPL and read permission)"

    @classmethod
    def for_models(
        cls, *models, default: str = "cpu", rapl_root: str = "/sys/class/powercap"
    ) -> EnergyMeter:
        """A meter over every GPU holding a weight of ``models`` (NVML, summed), else RAPL on the CPU.

        A pair on GPUs is metered on its GPUs only (weights left on the CPU by a split are not
        in the GPU total; ``mtad.models.pair`` refuses such splits). ``default`` is used when
        no model has a weight anywhere (no model given).
        """
        devices = model_devices(models) or [default]
        cuda = sorted({int(d.partition(":")[2] or 0) for d in devices if d.startswith("cuda")})
        if cuda:
            return cls("cuda", cuda_indices=cuda, rapl_root=rapl_root)
        return cls("cpu", rapl_root=rapl_root)

    @property
    def available(self) -> bool:
        return self._impl is not None

    def start(self) -> None:
        if self._impl is not None:
            self._impl.start()

    def stop(self) -> float | None:
        return self._impl.stop() if self._impl is not None else None

"""Energy over a timed window: NVML on the GPUs a run uses, RAPL on the CPU, else unavailable.

- GPU: NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ) read
  before and after the window, on the devices the run actually uses, after a device
  synchronize; on GPUs without the counter, ``nvmlDeviceGetPowerUsage`` (mW) is sampled
  in a background thread and integrated (trapezoid rule).
- CPU: Intel RAPL package domains under ``/sys/class/powercap`` when readable, with
  counter wrap-around handled via ``max_energy_range_uj``.
- Otherwise ``stop()`` returns None and ``reason`` says why: energy is never recorded as 0.
It never sums coarse ``nvidia-smi`` samples of every GPU in the box, and callers keep
perplexity scoring outside the window.
"""

from __future__ import annotations

import glob
import os
import threading
import time


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
        mapping = [int(x) for x in visible.split(",")] if visible and visible.replace(",", "").isdigit() else None
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(mapping[i] if mapping else i) for i in cuda_indices]
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
        last_p = [self.nv.nvmlDeviceGetPowerUsage(h) / 1000 if not c else 0.0
                  for h, c in zip(self.handles, self.has_counter)]
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
        self._start = [self.nv.nvmlDeviceGetTotalEnergyConsumption(h) if c else 0
                       for h, c in zip(self.handles, self.has_counter)]
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
            total += (self.nv.nvmlDeviceGetTotalEnergyConsumption(h) - self._start[i]) / 1000 if c else self._integrated[i]
        return total


class EnergyMeter:
    """``start()`` / ``stop() -> joules | None``; ``source`` and ``reason`` describe the meter."""

    def __init__(self, device: str = "cpu", cuda_indices: list[int] | None = None,
                 rapl_root: str = "/sys/class/powercap"):
        self.source = None
        self.reason = None
        self._impl = None
        if str(device).startswith("cuda"):
            try:
                import torch

                idx = cuda_indices if cuda_indices is not None else [torch.device(device).index or 0]
                self._impl = _Nvml(idx)
                self.source = "nvml:" + ("counter" if all(self._impl.has_counter) else "power-sampling")
            except Exception as e:  # NVML missing, no driver, ...
                self.reason = f"NVML unavailable: {e}"
        else:
            rapl = _Rapl(rapl_root)
            if rapl.domains:
                self._impl = rapl
                self.source = "rapl"
            else:
                self.reason = f"no readable RAPL package domain under {rapl_root} (needs Intel RAPL and read permission)"

    @property
    def available(self) -> bool:
        return self._impl is not None

    def start(self) -> None:
        if self._impl is not None:
            self._impl.start()

    def stop(self) -> float | None:
        return self._impl.stop() if self._impl is not None else None

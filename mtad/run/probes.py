"""Measuring models from outside: forward time by hooks, host synchronisations on CUDA.

``HookTimer`` times a model's top-level forward calls with forward hooks, so a loop that is not
ours (transformers' ``generate``) is timed exactly as our engine is (``mtad.core.devices.ForwardTimer``:
CUDA events on one GPU, wall time on the CPU). ``SyncCounter`` counts the host
synchronisations of a window: explicit ``torch.cuda.synchronize`` calls, and on CUDA the
implicit ones outside the models' forward passes (``torch.cuda.set_sync_debug_mode("warn")``:
a device-to-host read, a copy from pageable host memory, ``nonzero``...), by the source line
that made them. The device checker (``mtad.testing.devicecheck``) counts transfers on the CPU by
construction; this module counts what a real device does. It knows nothing about decoding.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from pathlib import Path

import torch

from mtad.core.devices import ForwardTimer, model_devices

__all__ = ["HookTimer", "SyncCounter"]

ROOT = Path(__file__).resolve().parents[2]


class HookTimer:
    """Seconds and calls of a model's top-level forward, by hooks (``mtad.core.devices.ForwardTimer``:
    CUDA events on one GPU, wall time on the CPU); read after a synchronisation."""

    def __init__(self, model):
        self.timer, self.calls = ForwardTimer(model_devices(model)), 0
        self._hooks = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]

    def _pre(self, *_):
        self.timer.__enter__()

    def _post(self, *_):
        self.timer.__exit__(None, None, None)
        self.calls += 1

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


class SyncCounter:
    """Host synchronisations in a window: explicit ``torch.cuda.synchronize`` calls (counted,
    timed) and, on CUDA, implicit ones outside the models' forward passes (sync debug mode
    "warn"), counted by the source line that made them. Slows what it counts: not for timing."""

    def __init__(self, models):
        self.models, self.explicit, self.explicit_s, self.sites = models, 0, 0.0, Counter()
        self.cuda = torch.cuda.is_available()

    def __enter__(self):
        self._real = real = torch.cuda.synchronize

        def counted(device=None):
            t0 = time.perf_counter()
            real(device)
            self.explicit += 1
            self.explicit_s += time.perf_counter() - t0

        torch.cuda.synchronize = counted
        self._hooks = []
        if self.cuda:
            for m in self.models:
                self._hooks += [m.register_forward_pre_hook(lambda *a: torch.cuda.set_sync_debug_mode(0)),
                                m.register_forward_hook(lambda *a: torch.cuda.set_sync_debug_mode("warn"))]
            self._catch = warnings.catch_warnings(record=True)
            self._log = self._catch.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize = self._real
        for h in self._hooks:
            h.remove()
        if self.cuda:
            torch.cuda.set_sync_debug_mode(0)
            self._catch.__exit__(*exc)
            for w in self._log:
                if "synchronizing" in str(w.message):
                    self.sites[f"{_short(w.filename)}:{w.lineno}"] += 1

    @property
    def implicit(self) -> int | None:
        return sum(self.sites.values()) if self.cuda else None


def _short(path: str) -> str:
    p = Path(path)
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else "/".join(p.parts[-3:])

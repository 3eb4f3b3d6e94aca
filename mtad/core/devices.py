"""Where a model lives, and timing that does not stall the device.

The placement rule (``docs/devices.md``; draws and supports in ``mtad.core.sampling``):

* A model may span several devices (``device_map="auto"``): its inputs go to the device
  of its first parameters (the embeddings), its logits come out on the device of its
  output head. ``model_devices`` lists every device it spans, in order.
* Tensors are created on the device of what they meet (``torch.zeros(..., device=x.device)``),
  never on a default device. Where the target's p and the draft's q meet (verification),
  the draft's tensors move to the target's logits' device, never the other way.
* Host round-trips are few and deliberate: a verification rule gathers what it needs with
  tensor operations and crosses once; a draw crosses once with the support.
* Timing: ``ForwardTimer`` times forward passes without a synchronisation around each
  (CUDA events on a single-GPU model, read after the engine's one synchronisation per
  step); ``synchronize`` waits on every device given.

This module knows devices and clocks; nothing about models' contents or decoding.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch

__all__ = ["ForwardTimer", "model_devices", "synchronize"]


def model_devices(model: torch.nn.Module) -> list[torch.device]:
    """Every device the model's parameters and buffers live on, first-seen order."""
    seen: dict[torch.device, None] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        seen.setdefault(t.device, None)
    return list(seen) or [torch.device("cpu")]


def synchronize(devices: Iterable[torch.device]) -> None:
    """Wait for every CUDA device among ``devices`` (each once); other devices run synchronously."""
    done = set()
    for d in devices:
        d = torch.device(d)
        if d.type == "cuda" and d not in done:
            done.add(d)
            torch.cuda.synchronize(d)


class ForwardTimer:
    """Accumulated seconds in forward passes of one model: ``with timer: model(...)``.

    * CPU (and other synchronous devices): wall time around the call.
    * One CUDA device: a pair of CUDA events per call, no synchronisation; ``seconds``
      reads them (waiting on the last one, which the engine's per-step synchronisation
      has already completed).
    * Several devices (a spread model): a synchronisation of every device before and after
      each call, so the time covers the whole pass (events on two devices cannot be
      compared).
    """

    def __init__(self, devices: Iterable[torch.device]):
        self.devices = [torch.device(d) for d in devices]
        cuda = [d for d in self.devices if d.type == "cuda"]
        self.mode = "events" if len(cuda) == 1 and len(self.devices) == 1 else (
            "sync" if cuda else "wall")
        self._total = 0.0
        self._pending: list[tuple[object, object]] = []
        self._t0 = 0.0

    def __enter__(self) -> ForwardTimer:
        if self.mode == "events":
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self._pending.append((start, None))
        else:
            if self.mode == "sync":
                synchronize(self.devices)
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.mode == "events":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending[-1] = (self._pending[-1][0], end)
        else:
            if self.mode == "sync":
                synchronize(self.devices)
            self._total += time.perf_counter() - self._t0

    @property
    def seconds(self) -> float:
        """Total seconds so far (reads pending CUDA events)."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self._total += sum(s.elapsed_time(e) for s, e in self._pending) / 1000.0
            self._pending.clear()
        return self._total

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
* Host-to-device copies are few and never wait: ``to_device`` moves a group of host tensors
  in one copy, from pinned memory with ``non_blocking=True`` on CUDA (a copy from pageable
  memory would wait for the device's stream, as a read does).
* Timing: ``ForwardTimer`` times forward passes without a synchronisation around each
  (CUDA events on a single-GPU model, recorded on that model's device's current stream,
  read after the engine's one synchronisation per step); ``synchronize`` waits on every
  device given.

This module knows devices and clocks; nothing about models' contents or decoding.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import torch

__all__ = ["ForwardTimer", "model_devices", "synchronize", "to_device"]


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


def to_device(parts: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Host tensors on ``device``, in one host-to-device copy (each part keeps its shape, dtype).

    On CUDA the parts are packed into one pinned buffer (their bytes, each at an 8-byte
    boundary) and copied with ``non_blocking=True``: queued on the current stream, no wait.
    PyTorch's pinned allocator keeps the buffer until the copy has run. On the CPU the parts
    are returned as they are.
    """
    device = torch.device(device)
    parts = [p.contiguous() for p in parts]
    if device.type == "cpu":
        return parts
    pieces, spans, at = [], [], 0
    for p in parts:
        b = p.reshape(-1).view(torch.uint8)
        pad = -b.numel() % 8
        pieces.append(b if not pad else torch.cat([b, b.new_zeros(pad)]))
        spans.append((at, b.numel()))
        at += b.numel() + pad
    host = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
    if device.type == "cuda":
        dev = host.pin_memory().to(device, non_blocking=True)
    else:
        dev = host.to(device)
    return [dev[a:a + n].view(p.dtype).view(p.shape) for p, (a, n) in zip(parts, spans)]


class ForwardTimer:
    """Accumulated seconds in forward passes of one model: ``with timer: model(...)``.

    * CPU (and other synchronous devices): wall time around the call.
    * One CUDA device: a pair of CUDA events per call, recorded on that device's current
      stream (not the current device's: a draft on ``cuda:1`` is timed on ``cuda:1``), no
      synchronisation; ``seconds`` reads them (waiting on the last one, which the engine's
      per-step synchronisation has already completed).
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
            start.record(torch.cuda.current_stream(self.devices[0]))
            self._pending.append((start, None))
        else:
            if self.mode == "sync":
                synchronize(self.devices)
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.mode == "events":
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(self.devices[0]))
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

"""Run on the CPU as if tensors lived on CUDA devices: a device checker for the test suite.

A CPU run cannot see device bugs: every tensor is on the CPU, so a CPU generator drawing
from a GPU tensor, a host tensor added to a device tensor, or a draft tensor meeting a
target tensor on another GPU all "work". ``VirtualDevices`` is a ``TorchFunctionMode``
that gives tensors a *virtual* device (a ``_vdev`` tag; untagged tensors are on the CPU),
propagates it through every torch call, and raises where CUDA would:

* an op whose non-scalar tensor arguments sit on two devices (0-dim CPU tensors may meet
  a device tensor, as CUDA allows; indexing a device tensor with CPU index tensors and
  ``copy_`` across devices are allowed too, as in CUDA);
* a ``generator=`` of another device type than the op's tensors (``torch.multinomial`` on
  a CUDA tensor with a CPU generator);
* a model called with inputs that are not on its input device.

``tensor.device`` answers the virtual device, factories given ``device="cuda:N"`` make a
CPU tensor tagged ``cuda:N``, ``.to()``/``.cuda()``/``.cpu()`` move tags, so the code under
test runs unchanged. Models are placed with ``place(model, devices)``: parameters are
tagged (spread over several devices when a list is given, like ``device_map="auto"``),
the forward pass itself runs untraced, and its logits come out on the model's last
device, its cache on its first.

It counts copies in both directions, by phase: ``draft`` from the start of a decoder step
until the target model first runs (or, with the draft on other devices, until the first
copy to the target's input device: its inputs), ``verify`` after it, ``engine`` outside
decoder steps.

* Device to host (host round-trips), under the phase's own name (``counts["draft"]``...):
  ``item``, ``tolist``, ``float()``/``int()``/``bool()``/``index()`` of a device tensor,
  ``.cpu()``/``.to("cpu")``, ``numpy``, ``nonzero``, ``masked_select``, ``unique`` and
  boolean-mask indexing.
* Host to device from pageable memory, which waits for the device's stream as a read does,
  under ``h2d_<phase>``: ``.to(device)``/``.cuda()``/``copy_`` of a host tensor,
  ``torch.tensor(data, device=...)``, and a device tensor indexed with a host index tensor
  or a list (CUDA copies the index over).
* Host to device from pinned memory with ``non_blocking=True`` (queued on the stream, no
  wait), under ``pinned_<phase>``. ``pin_memory()`` and ``pin_memory=True`` are stood in
  for (a CPU build has no pinned allocator): the tensor is marked pinned.

``largest_read`` is the longest row (last dimension) of any
device-to-host copy (``.cpu()``, ``tolist``): a whole vocabulary row shows as its length. ``torch.cuda.synchronize`` calls are counted as
``syncs``. ``torch.cuda.Event``,
``torch.cuda.current_stream``, ``torch.cuda.Stream``, ``torch.cuda.stream`` and
``torch.cuda.current_device`` are replaced by stand-ins: an event remembers the device and
stream it was recorded on (``VirtualDevices.events``); its waits are counted as
``event_waits`` (reading a timer after the step's synchronisation).

What it does not see: kernels' numerics (the logits are the CPU's), real asynchrony,
memory. It is a test tool: it slows every torch call down.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["DeviceError", "VirtualDevices", "device_of", "place"]

_TAG = "_vdev"
_PINNED = "_vpinned"


class DeviceError(RuntimeError):
    """What CUDA would have raised."""


def device_of(t: torch.Tensor) -> str:
    """The virtual device of a tensor ("cpu" when untagged)."""
    return getattr(t, _TAG, "cpu")


def _tag(t, dev: str):
    if isinstance(t, torch.Tensor):
        if dev == "cpu":
            if hasattr(t, _TAG):
                try:
                    delattr(t, _TAG)
                except AttributeError:
                    pass
        else:
            setattr(t, _TAG, dev)
    return t


def _norm(device) -> str | None:
    if device is None:
        return None
    if isinstance(device, int):
        return f"cuda:{device}"
    d = torch.device(device)
    if d.type == "cpu":
        return "cpu"
    return f"{d.type}:{d.index or 0}"


def place(model: torch.nn.Module, devices: str | list[str]) -> torch.nn.Module:
    """Tag a model's parameters and buffers with virtual devices (a list spreads the layers).

    With several devices the parameters are split in order of appearance: embeddings on
    the first device, the last layers and the output head on the last (as ``device_map``
    places a model). ``VirtualDevices`` reads the placement from the tags.
    """
    devs = [devices] if isinstance(devices, str) else list(devices)
    params = list(model.parameters()) + list(model.buffers())
    for i, p in enumerate(params):
        _tag(p, devs[min(i * len(devs) // max(len(params), 1), len(devs) - 1)])
    if len(devs) > 1:  # the output head may be tied to the embeddings: tag the head explicitly
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if head is not None and getattr(head, "weight", None) is not None and head.weight is not params[0]:
            _tag(head.weight, devs[-1])
    model._vdevs = devs
    return model


_GETTERS = {torch.Tensor.device.__get__: "device", torch.Tensor.is_cuda.__get__: "is_cuda",
            torch.Tensor.is_cpu.__get__: "is_cpu"}
_TO_HOST = {"item", "tolist", "__float__", "__int__", "__bool__", "__index__", "__complex__",
            "numpy", "nonzero", "masked_select", "unique", "unique_consecutive", "argwhere",
            "__repr__", "__format__", "__str__"}
_INDEXING = {"__getitem__", "__setitem__", "index_put_", "index_put"}
_FROM_HOST_DATA = {"tensor", "as_tensor", "asarray", "from_numpy"}
#: what ``VirtualDevices.steps`` holds per decoder step: device-to-host transfers ("draft",
#: "verify"), pageable host-to-device copies ("h2d_*"), pinned non-blocking ones ("pinned_*"), bytes
#: copied host-to-device ("h2d_bytes")
STEP_KEYS = ("draft", "verify", "syncs", "h2d_draft", "h2d_verify", "pinned_draft", "pinned_verify", "h2d_bytes")


def _pin(t: torch.Tensor) -> torch.Tensor:
    setattr(t, _PINNED, True)
    return t
_CROSS_OK = {"copy_", "__setitem__"}


class _FakeStream:
    """Stand-in for ``torch.cuda.Stream``: a device and a number (0: the default stream)."""

    _next = 1

    def __init__(self, device=None, priority=0, stream_id=None, **kwargs):
        vd = VirtualDevices.active
        self.device = torch.device(_norm(device) if device is not None else vd.current_device)
        if stream_id is None:
            stream_id, _FakeStream._next = _FakeStream._next, _FakeStream._next + 1
        self.stream_id = stream_id

    def __repr__(self) -> str:
        return f"<stream {self.stream_id} on {self.device}>"

    def __eq__(self, other) -> bool:
        return (isinstance(other, _FakeStream) and (self.device, self.stream_id)
                == (other.device, other.stream_id))

    def __hash__(self) -> int:
        return hash((self.device, self.stream_id))


class _FakeEvent:
    """Stand-in for ``torch.cuda.Event`` under the checker (no CUDA in a CPU build).

    ``record`` remembers the stream (the current device's current stream when none is
    given) in ``VirtualDevices.active.events`` as ``(event, stream)``.
    """

    def __init__(self, *args, **kwargs):
        self.stream: _FakeStream | None = None

    def record(self, stream=None):
        vd = VirtualDevices.active
        self.stream = stream if stream is not None else vd.current_stream()
        vd.events.append((self, self.stream))

    def synchronize(self):
        VirtualDevices.active.counts["event_waits"] += 1

    def query(self):
        return True

    def elapsed_time(self, other) -> float:
        return 0.0


class VirtualDevices(TorchFunctionMode):
    """The checker: ``with VirtualDevices() as vd: ...``; ``vd.counts``, ``vd.steps``."""

    active: VirtualDevices | None = None

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()  # "draft" / "verify" / "engine" transfers, "syncs"
        self.steps: list[dict] = []  # per decoder step: transfers by phase, syncs
        self.events: list[tuple[_FakeEvent, _FakeStream]] = []  # recorded events and their streams
        self.largest_read = 0  # the longest row (last dimension) copied from a device to the host
        self.current_device = "cuda:0"
        self._streams: dict[str, _FakeStream] = {}  # the current stream of each device
        self.phase = "engine"
        self._target_input: str | None = None  # the target's input device
        self._draft_devices: set[str] = set()
        self._inside = 0  # > 0 while a placed model's forward runs (untraced)
        self._hooks: list = []
        self._patches: list = []

    # -------------------------------------------------------------- models and decoders
    def watch(self, model: torch.nn.Module, role: str = "model") -> None:
        """Check a placed model's inputs, run its forward untraced, tag its outputs."""
        devs = getattr(model, "_vdevs", None)
        if devs is None:
            raise ValueError(f"{role}: place(model, devices) first")
        if role == "target":
            self._target_input = devs[0]
        else:
            self._draft_devices |= set(devs)

        def pre(mod, args, kwargs):
            flat, _ = tree_flatten((args, {k: v for k, v in kwargs.items() if k != "cache"}))
            for t in flat:
                if isinstance(t, torch.Tensor) and device_of(t) != devs[0]:
                    raise DeviceError(
                        f"{role} model on {devs[0]} called with an input on {device_of(t)}"
                    )
            if role == "target" and self.phase == "draft":
                self.phase = "verify"
            self._inside += 1

        def post(mod, args, kwargs, out):
            self._inside -= 1
            logits = getattr(out, "logits", None)
            if isinstance(logits, torch.Tensor):
                _tag(logits, devs[-1])
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            for layer in getattr(cache, "layers", ()):
                for name in ("keys", "values"):
                    t = getattr(layer, name, None)
                    if isinstance(t, torch.Tensor):
                        _tag(t, devs[0])
            return out

        self._hooks.append(model.register_forward_pre_hook(pre, with_kwargs=True))
        self._hooks.append(model.register_forward_hook(post, with_kwargs=True))

    def watch_decoder(self, decoder) -> None:
        """Count a decoder's transfers per step, split into drafting and verification."""
        step = decoder.step

        def counted(ctx):
            before = Counter(self.counts)
            self.phase = "draft"
            try:
                return step(ctx)
            finally:
                self.phase = "engine"
                diff = self.counts - before
                self.steps.append({k: diff.get(k, 0) for k in STEP_KEYS})

        decoder.step = counted

    # ------------------------------------------------------------------ streams
    def current_stream(self, device=None) -> _FakeStream:
        dev = _norm(device) if device is not None else self.current_device
        if dev not in self._streams:
            self._streams[dev] = _FakeStream(dev, stream_id=0)
        return self._streams[dev]

    @contextlib.contextmanager
    def _stream_context(self, stream):
        if stream is None:
            yield
            return
        dev = str(stream.device)
        old_dev, old = self.current_device, self._streams.get(dev)
        self.current_device, self._streams[dev] = dev, stream
        try:
            yield
        finally:
            self.current_device = old_dev
            if old is None:
                del self._streams[dev]
            else:
                self._streams[dev] = old

    @contextlib.contextmanager
    def _device_context(self, device):
        old = self.current_device
        if device is not None:
            self.current_device = _norm(device)
        try:
            yield
        finally:
            self.current_device = old

    # ------------------------------------------------------------------ the mode itself
    def __enter__(self):
        VirtualDevices.active = self

        def counting_sync(device=None):
            self.counts["syncs"] += 1

        patched = {
            "synchronize": counting_sync,
            "Event": _FakeEvent,
            "Stream": _FakeStream,
            "current_stream": self.current_stream,
            "stream": self._stream_context,
            "device": self._device_context,
            "current_device": lambda: int(self.current_device.split(":")[1]),
        }
        self._patches = [(torch.cuda, name, getattr(torch.cuda, name)) for name in patched]
        for name, value in patched.items():
            setattr(torch.cuda, name, value)
        return super().__enter__()

    def __exit__(self, *exc):
        for obj, name, value in self._patches:
            setattr(obj, name, value)
        for h in self._hooks:
            h.remove()
        VirtualDevices.active = None
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if self._inside:
            return func(*args, **kwargs)
        getter = _GETTERS.get(func)
        if getter is not None:
            dev = device_of(args[0])
            if getter == "device":
                return torch.device(dev)
            return dev.startswith("cuda") if getter == "is_cuda" else dev == "cpu"
        name = getattr(func, "__name__", str(func))
        if name == "pin_memory":  # no pinned allocator in a CPU build: a marked copy
            return _pin(args[0].clone())
        if name == "is_pinned":
            return bool(getattr(args[0], _PINNED, False))
        pinned = bool(kwargs.pop("pin_memory", False))
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]

        if name in ("to", "cuda", "cpu", "type") and tensors and args and args[0] is tensors[0]:
            return self._move(func, name, args, kwargs)

        target = _norm(kwargs["device"]) if "device" in kwargs else None
        if target is not None and target != "cpu":
            kwargs["device"] = "cpu"
            if name in _FROM_HOST_DATA:  # host data copied to the device (pageable)
                self._count_h2d(None, False, target)
        devs = self._devices(name, tensors)
        if len(devs) > 1:
            raise DeviceError(f"{name}: expected all tensors on the same device, got {sorted(devs)}")
        dev = target or (devs.pop() if devs else "cpu")
        gen = kwargs.get("generator")
        if isinstance(gen, torch.Generator) and gen.device.type != dev.split(":")[0]:
            raise DeviceError(
                f"{name}: expected a '{dev.split(':')[0]}' device type for generator but found "
                f"'{gen.device.type}'"
            )
        if dev != "cpu" and name == "numpy":
            raise DeviceError("numpy: can't convert a device tensor to numpy; copy it to the host first")
        if dev != "cpu" and self._to_host(name, args):
            self.counts[self.phase] += 1
            if name in ("tolist", "numpy") and tensors:
                self.largest_read = max(self.largest_read, tensors[0].shape[-1] if tensors[0].dim() else 1)
        if dev != "cpu":
            self._count_host_operands(name, args, kwargs, dev)
        out = func(*args, **kwargs)
        if pinned and isinstance(out, torch.Tensor) and dev == "cpu":
            _pin(out)
        if name in _TO_HOST or dev == "cpu":
            return out
        return tree_map(lambda t: _tag(t, dev), out)

    def _devices(self, name: str, tensors: Iterable[torch.Tensor]) -> set[str]:
        tensors = list(tensors)
        if name in _INDEXING and tensors:
            # CUDA copies CPU index tensors (and values) to the indexed tensor's device
            devs = {device_of(tensors[0])}
            devs |= {device_of(t) for t in tensors[1:] if device_of(t) != "cpu"}
            return devs
        if name in _CROSS_OK:
            return {device_of(tensors[0])} if tensors else set()
        return {device_of(t) for t in tensors if not (device_of(t) == "cpu" and t.dim() == 0)}

    def _count_host_operands(self, name: str, args, kwargs, dev: str) -> None:
        """Host-to-device copies CUDA makes implicitly for an op on ``dev``."""
        if name in _INDEXING and len(args) > 1:
            idx = args[1] if isinstance(args[1], tuple) else (args[1],)
            extra = [args[2]] if name == "__setitem__" and len(args) > 2 else []
            for i in list(idx) + extra:
                if (isinstance(i, torch.Tensor) and device_of(i) == "cpu" and i.dim() > 0) or isinstance(i, list):
                    self._count_h2d(None, False, dev)
        elif name == "copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor):
            src = args[1]
            if device_of(src) == "cpu" and device_of(args[0]) != "cpu":
                self._count_h2d(src, bool(kwargs.get("non_blocking", args[2] if len(args) > 2 else False)),
                                dev)

    def _count_h2d(self, src: torch.Tensor | None, non_blocking: bool, dst: str) -> None:
        if self.phase == "draft" and dst == self._target_input and dst not in self._draft_devices:
            self.phase = "verify"  # the target's inputs for its first pass: verification begins
        if src is not None:  # bytes copied host-to-device (either kind), every phase
            self.counts["h2d_bytes"] += src.numel() * src.element_size()
        if non_blocking and getattr(src, _PINNED, False):
            self.counts[f"pinned_{self.phase}"] += 1
        else:
            self.counts[f"h2d_{self.phase}"] += 1

    def _to_host(self, name: str, args) -> bool:
        if name in _TO_HOST:
            return True
        if name == "__getitem__" and len(args) > 1:  # boolean-mask indexing needs the count
            idx = args[1] if isinstance(args[1], tuple) else (args[1],)
            return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in idx)
        return False

    def _move(self, func, name, args, kwargs):
        src = args[0]
        if name == "cpu":
            dst = "cpu"
            call_args, call_kwargs = args, kwargs
        elif name == "cuda":
            dev = args[1] if len(args) > 1 else kwargs.get("device")
            dst = _norm(dev if dev is not None else 0)
            if device_of(src) == "cpu":
                self._count_h2d(src, bool(kwargs.get("non_blocking", False)), dst)
            return _tag(src.view_as(src), dst)
        else:  # to / type
            dst = None
            call_args = []
            for a in args[1:]:
                if isinstance(a, torch.Tensor):
                    dst = device_of(a)
                    call_args.append(a.dtype if name == "to" else a)
                elif isinstance(a, (str, torch.device, int)) and not isinstance(a, bool):
                    if isinstance(a, str) and name == "type":
                        call_args.append(a)
                        continue
                    dst = _norm(a)
                    call_args.append(torch.device("cpu"))
                else:
                    call_args.append(a)
            call_kwargs = dict(kwargs)
            if "device" in call_kwargs:
                dst = _norm(call_kwargs["device"])
                call_kwargs["device"] = "cpu"
            call_args = [src, *call_args]
            if dst is None:
                dst = device_of(src)
        if device_of(src) != "cpu" and dst == "cpu":
            self.counts[self.phase] += 1
            self.largest_read = max(self.largest_read, src.shape[-1] if src.dim() else 1)
        if device_of(src) == "cpu" and dst != "cpu":
            non_blocking = call_kwargs.get("non_blocking", False) or any(
                a is True for a in call_args[1:])
            self._count_h2d(src, bool(non_blocking), dst)
        out = func(*call_args, **call_kwargs)
        if isinstance(out, torch.Tensor) and out is src and dst != device_of(src):
            out = out.view_as(out)  # a new tensor object, so the source keeps its own tag
        return _tag(out, dst) if isinstance(out, torch.Tensor) else out


@contextlib.contextmanager
def virtual_pair(target, draft, target_devices="cuda:0", draft_devices="cuda:1"):
    """Place a (target, draft) pair on virtual devices and check everything run inside."""
    place(target, target_devices)
    if draft is not None:
        place(draft, draft_devices)
    vd = VirtualDevices()
    vd.watch(target, "target")
    if draft is not None:
        vd.watch(draft, "draft")
    try:
        with vd:
            yield vd
    finally:
        for m in (target, draft):
            if m is not None:
                for p in list(m.parameters()) + list(m.buffers()):
                    _tag(p, "cpu")
                if hasattr(m, "_vdevs"):
                    del m._vdevs

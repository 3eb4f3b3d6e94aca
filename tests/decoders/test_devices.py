"""Device discipline, checked on the CPU (``mtad.testing.devicecheck``; the rule: ``docs/devices.md``).

Every decoder (globbed from ``conf/decoder/*.yaml``) runs through ``Engine.generate`` with
the target's tensors on a virtual ``cuda:0`` and the draft's on ``cuda:1``, at greedy and
at T=1, on a toy vocabulary (dense draws) and a long one (supports cross to the host as
top-k entries). Under the checker each run must:

* raise nothing CUDA would raise (mixed devices, a CPU generator on a device tensor, a
  model fed inputs from another device);
* produce the very tokens the plain CPU run produces (same seed, same random stream);
* cross from device to host at most twice per step for verification and at most once per
  draft depth for drafting, and synchronise once per step;
* copy from host to device only from pinned memory without waiting (no pageable copy in a
  step), at most once per draft depth and once per target pass.

The checker itself is tested on planted bugs, including the draw the code used before
draws moved to the host.
"""

from __future__ import annotations

import pytest
import torch

import mtad.core.sampling
from mtad.core.decoder import Decoder, StepOutput
from mtad.core.engine import Engine
from mtad.core.warping import Warping
from mtad.models.tiny import tiny_causal_lm
from mtad.run.cli import group_options, load_decoder
from mtad.testing import unsupported_by
from mtad.testing.devicecheck import DeviceError, VirtualDevices, device_of, place, virtual_pair

pytestmark = pytest.mark.stack  # the device checker follows torch's dispatch (make test-stack)

DECODERS = group_options("decoder")
PROMPT = [3, 4, 5]
TOKENS = 14


def _pair(vocab: int):
    t = tiny_causal_lm("qwen2", vocab_size=vocab, dtype=torch.float64, seed=0, logit_scale=4.0)
    d = tiny_causal_lm("qwen2", vocab_size=vocab, hidden_size=16, num_heads=2, num_layers=1,
                       dtype=torch.float64, seed=1, logit_scale=4.0)
    return t, d


@pytest.fixture(scope="module")
def toy():
    return _pair(40)


@pytest.fixture(scope="module")
def long_vocab():
    return _pair(mtad.core.sampling.DENSE_MAX + 904)  # past DENSE_MAX: draws on supports


def _depth_limit(dec) -> int:
    """Draft depths per step: gamma, the tree's depth, BiLD's run, a joint block's length."""
    for knob in ("max_run", "gamma"):
        v = getattr(dec, knob, None)
        if isinstance(v, int):
            return v
    return len(getattr(dec, "k_config", ())) or 1


def _run_checked(pair, name, warping, target_devices="cuda:0", seed=1, **over):
    target, draft = pair
    if why := unsupported_by(load_decoder(name, **over), warping):
        pytest.skip(why)
    ref = Engine(target, draft, load_decoder(name, **over), warping).generate(PROMPT, TOKENS, seed=seed)
    dec = load_decoder(name, **over)
    with virtual_pair(target, draft, target_devices=target_devices) as vd:
        engine = Engine(target, draft, dec, warping)
        vd.watch_decoder(dec)
        out = engine.generate(PROMPT, TOKENS, seed=seed)
    return ref, out, vd, dec


@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("vocab", ["toy", "long_vocab"])
def test_every_decoder_runs_on_virtual_devices_as_on_the_cpu(request, vocab, name, temperature):
    pair = request.getfixturevalue(vocab)
    ref, out, vd, dec = _run_checked(pair, name, Warping(temperature, top_k=10, top_p=0.9))
    assert out.output_ids == ref.output_ids, "the virtual-device run drew other tokens"
    assert len(vd.steps) == out.num_steps
    depth = _depth_limit(dec)
    joint = name in ("mjgd", "mtjd")  # target-only blocks: one crossing per block position
    for s, rec in zip(vd.steps, out.steps):
        assert s["draft"] <= depth, f"{name}: {s['draft']} draft transfers in a step (depth {depth})"
        assert s["verify"] <= (depth if joint else 2), f"{name}: {s['verify']} verification transfers"
        assert s["h2d_draft"] == s["h2d_verify"] == 0, f"{name}: a pageable host-to-device copy in a step"
        assert s["pinned_draft"] <= depth, f"{name}: {s['pinned_draft']} copies to the device while drafting"
        assert s["pinned_verify"] <= rec.target_passes, (
            f"{name}: {s['pinned_verify']} copies to the device for {rec.target_passes} target passes")
    devices = 1 if name in ("multinomial", "greedy", "mjgd", "mtjd") else 2  # cuda:0, cuda:1
    assert vd.counts["syncs"] == out.num_steps * devices, "one synchronisation per step"
    # outside steps: prefill (one pass per model) and the cache compaction (one index per device)
    assert vd.counts["h2d_engine"] == 0, f"{name}: a pageable host-to-device copy outside steps"
    assert vd.counts["pinned_engine"] <= devices * (1 + out.num_steps)


@pytest.mark.parametrize("name", ["spd", "tree_mtad", "specinfer", "multinomial"])
@pytest.mark.parametrize("top_k", [10, 0])
def test_draws_move_no_whole_vocabulary_rows(long_vocab, name, top_k):
    """With top-k and with top-p alone, every draw equals the CPU run's (float64 pair, same
    seed) and no device-to-host copy is a whole vocabulary row: only supports cross (the
    random pair is nearly flat: top-p 0.1 keeps a few hundred tokens of 5,000)."""
    ref, out, vd, _ = _run_checked(long_vocab, name, Warping(1.0, top_k=top_k, top_p=0.1))
    assert out.output_ids == ref.output_ids
    vocab = long_vocab[0].config.vocab_size
    assert 0 < vd.largest_read < vocab, (vd.largest_read, vocab)


_ROLLBACKS = {"decoder.alpha_fb": 0.0, "decoder.alpha_rb": 2.0}  # BiLD: long runs, rolled back


@pytest.mark.parametrize("name", DECODERS + ["bild_sampling rolled back"])
def test_plain_temperature_moves_no_whole_rows(long_vocab, name):
    """T=1 without top-k or top-p: every token has mass, so a support is a whole row. Draws,
    beam scores, tree children and the multi-draft walks stay on the device
    (``mtad.core.sampling.device_draws`` / ``device_multinomial``,
    ``mtad.propose.tree.device_level_draws``, ``mtad.verify.devicewalk``): the same tokens as the
    CPU run (float64 pair, same seed), no row read back (only scalars: a tree's candidate
    masses and its draws' sizes at most), the per-step read bounds, and no pageable copy. Each draw's exponentials
    (or uniforms) cross in one pinned copy of their own: at most one more per draft depth and
    one more per target pass."""
    over = _ROLLBACKS if name.endswith("rolled back") else {}
    name = name.split()[0]
    ref, out, vd, dec = _run_checked(long_vocab, name, Warping(1.0), **over)
    assert out.output_ids == ref.output_ids, "the virtual-device run drew other tokens"
    # scalars only: a tree's candidate masses and the sizes of the draws it may end with
    assert vd.largest_read <= 128, f"{name}: a read of {vd.largest_read} entries"
    depth = _depth_limit(dec)
    joint = name in ("mjgd", "mtjd")
    for s, rec in zip(vd.steps, out.steps):
        assert s["draft"] <= depth and s["verify"] <= (depth if joint else 2), (name, s)
        assert s["h2d_draft"] == s["h2d_verify"] == 0, f"{name}: a pageable host-to-device copy in a step"
        # one pass and at most one draw per target pass (BiLD rolled back: two of each)
        assert s["pinned_draft"] <= 2 * depth and s["pinned_verify"] <= 2 * rec.target_passes, (name, s)
    if over:
        assert any(r.target_passes == 2 for r in out.steps), "no step rolled back"


@pytest.mark.parametrize("name", DECODERS + ["bild_sampling rolled back"])
def test_a_wide_nucleus_moves_no_whole_rows(long_vocab, name):
    """Top-p alone with a nucleus far past the warping's hint (``TOP_P_HINT``, 255): the random
    pair is nearly flat, so top-p 0.9 keeps about 4,000 of 5,000 tokens in every row. The first
    read of a depth or a verification brings the top 256 entries and each support's size; a
    longer support is then drawn on the device with exactly that many exponentials
    (``mtad.core.sampling.read_supports``) instead of crossing (before: the whole row). A
    verification reads the sizes of the rows its final draw may come from with its scalars
    (``sample``'s ``size``; a multi-draft walk whose draft rows already stayed on the device
    runs there without reading the target's hints), so it stays within two reads per target
    pass. Same tokens as the CPU run, no read longer than that first one (a beam's: its W rows'
    hints), the per-step read bounds, no pageable copy, and at most one more pinned copy per
    draft depth and per target pass (the exponentials)."""
    from mtad.core.warping import TOP_P_HINT

    over = _ROLLBACKS if name.endswith("rolled back") else {}
    name = name.split()[0]
    warping = Warping(1.0, top_p=0.9)
    target = long_vocab[0]
    with torch.no_grad():
        root = warping(target(input_ids=torch.tensor([PROMPT])).logits[0, -1])
    assert int((root > 0).sum()) > 10 * TOP_P_HINT  # the premise: a nucleus far past the hint
    ref, out, vd, dec = _run_checked(long_vocab, name, warping, **over)
    assert out.output_ids == ref.output_ids, "the virtual-device run drew other tokens"
    width = getattr(dec, "width", 1) if isinstance(getattr(dec, "width", 1), int) else 1
    first = 3 * (TOP_P_HINT * max(width, 1) + 1) + 1  # top entries, ids, a companion value; the size
    assert vd.largest_read <= first, f"{name}: a read of {vd.largest_read} entries (first read {first})"
    depth = _depth_limit(dec)
    joint = name in ("mjgd", "mtjd")
    for s, rec in zip(vd.steps, out.steps):
        # a depth: its first read, then the draw; a verification: its scalars (with the sizes of
        # the rows its final draw may come from), then that draw (a joint block: one read per
        # position, and the last position's draw)
        assert s["draft"] <= 2 * depth, (name, s)
        assert s["verify"] <= (depth + 1 if joint else 2 * rec.target_passes), (name, s)
        assert s["h2d_draft"] == s["h2d_verify"] == 0, f"{name}: a pageable host-to-device copy in a step"
        assert s["pinned_draft"] <= 2 * depth and s["pinned_verify"] <= 2 * rec.target_passes, (name, s)
    if over:
        assert any(r.target_passes == 2 for r in out.steps), "no step rolled back"


@pytest.mark.parametrize("name", ["spd", "tree_mtad", "specinfer", "spectr", "bild_sampling", "mcss"])
def test_a_target_spread_over_two_devices(toy, name):
    """device_map="auto": inputs on the first device, logits on the last; the draft on a third."""
    ref, out, vd, _ = _run_checked(toy, name, Warping(1.0, top_k=10, top_p=0.9),
                                   target_devices=["cuda:0", "cuda:2"])
    assert out.output_ids == ref.output_ids


@pytest.mark.parametrize("gamma", [2, 8])
@pytest.mark.parametrize("name", ["spd", "mtad", "tree_mtad"])
def test_verification_transfers_do_not_grow_with_gamma_or_width(long_vocab, name, gamma):
    over = {"gamma": gamma} | ({"width": 4} if "mtad" in name else {})
    _, out, vd, _ = _run_checked(long_vocab, name, Warping(1.0, top_k=10, top_p=0.9), **over)
    assert max(s["verify"] for s in vd.steps) <= 2
    assert max(s["draft"] for s in vd.steps) <= gamma


# ------------------------------------------------------------------ the checker catches bugs


class _Planted(Decoder):
    """One-token decoder with a device bug chosen by ``bug``."""

    name = "planted"

    def __init__(self, bug: str):
        super().__init__()
        self.bug = bug

    def step(self, ctx):
        p = ctx.warping(ctx.target.root_logits)
        if self.bug == "host_tensor":
            p = p + torch.zeros(p.shape[-1], dtype=p.dtype)  # made on the host
        elif self.bug == "draft_meets_target":
            p = p - ctx.warping(ctx.draft.root_logits)  # cuda:1 tensor into a cuda:0 one
        elif self.bug == "device_generator":
            return StepOutput(tokens=[int(torch.multinomial(p, 1, generator=ctx.generator))])
        return StepOutput(tokens=[int(p.argmax())])


@pytest.mark.parametrize("bug, message", [
    ("host_tensor", "same device"),
    ("draft_meets_target", "same device"),
    ("device_generator", "generator"),
])
def test_the_checker_catches_planted_bugs(toy, bug, message):
    target, draft = toy
    dec = _Planted(bug)
    Engine(target, draft, dec, Warping(1.0)).generate(PROMPT, 3)  # fine on the CPU
    with pytest.raises(DeviceError, match=message), virtual_pair(target, draft):
        Engine(target, draft, dec, Warping(1.0)).generate(PROMPT, 3)


def test_the_checker_catches_the_draw_on_the_device(toy, monkeypatch):
    """Drawing on the device's own supports with the CPU generator (the draw before draws
    moved to the host) fails as CUDA fails. The race reads supports (the inverse CDF reads none)."""
    def on_the_device(rows, other, bound=None, defer=False):  # supports left on the rows' device
        return [(mtad.core.sampling.Support(*mtad.core.sampling.support(r), rows.shape[-1]), None) for r in rows]

    monkeypatch.setattr(mtad.core.sampling, "host_supports_with", on_the_device)
    target, draft = toy
    with pytest.raises(DeviceError, match="generator"), virtual_pair(target, draft):
        Engine(target, draft, load_decoder("spd"), Warping(1.0, draws="race")).generate(PROMPT, 3)


def test_the_checker_catches_model_inputs_on_another_device(toy):
    """A model fed host inputs (a runner that forgot ``.to(device)``) fails as CUDA fails."""
    target, draft = toy
    with virtual_pair(target, draft):
        target(input_ids=torch.tensor([[1, 2]], device="cuda:0"))  # on its device: fine
        with pytest.raises(DeviceError, match="target model on cuda:0 called with an input on cpu"):
            target(input_ids=torch.tensor([[1, 2]]))


def test_the_checker_counts_host_round_trips():
    x = place(torch.nn.Linear(2, 2), "cuda:0").weight
    with VirtualDevices() as vd:
        assert x.device == torch.device("cuda:0") and x.is_cuda
        y = x * 2
        assert device_of(y) == "cuda:0"
        float(y[0, 0]), y.tolist(), y.sum().item(), bool(y[0, 0] > 0)  # 4 transfers
        y.cpu(), y.to("cpu"), torch.nonzero(y), y[y > 0]  # 4 more
        z = torch.zeros(3, device=x.device)  # a factory on the virtual device
        assert device_of(z) == "cuda:0" and device_of(z.cpu()) == "cpu" and device_of(z) == "cuda:0"
        h = torch.ones(2)  # host tensors stay free
        float(h[0]), h.tolist()
        with pytest.raises(DeviceError):
            y + torch.ones(2, 2)  # a non-scalar host tensor meets a device tensor
        y + torch.tensor(1.0)  # a 0-dim host tensor may (as in CUDA)
        y[torch.tensor([0])]  # host index tensors may index a device tensor (as in CUDA)
        with pytest.raises(DeviceError):
            y.numpy()
    assert vd.counts["engine"] == 9  # the 8 above and z.cpu()


def test_the_checker_counts_host_to_device_copies():
    x = place(torch.nn.Linear(2, 2), "cuda:0").weight
    with VirtualDevices() as vd:
        h = torch.arange(2)
        y = torch.zeros(2, device="cuda:0")  # a factory: no copy
        x[:, 0], x * 2, x + 1.0, x + torch.tensor(1.0)  # scalars and views: no copy
        assert vd.counts["h2d_engine"] == vd.counts["pinned_engine"] == 0
        h.to("cuda:0"), h.cuda(), torch.tensor([1, 2], device="cuda:0")  # 3 pageable copies
        x[:, h], x[:, [0, 1]], y.copy_(h), h.to("cuda:0", non_blocking=True)  # 4 more (not pinned)
        p = h.pin_memory()
        assert p.is_pinned() and not h.is_pinned()
        p.to("cuda:0"), y.copy_(p)  # pinned but blocking: 2 more waits
        q = p.to("cuda:0", non_blocking=True)  # queued: free
        y.copy_(p, non_blocking=True)  # queued: free
        assert device_of(q) == "cuda:0" and torch.empty(2, pin_memory=True).is_pinned()
    assert vd.counts["h2d_engine"] == 9
    assert vd.counts["pinned_engine"] == 2


def test_forward_timers_record_on_their_own_devices_streams(toy):
    """A draft on cuda:1 is timed with events on cuda:1's stream, the target's on cuda:0's."""
    target, draft = toy
    with virtual_pair(target, draft) as vd:
        engine = Engine(target, draft, load_decoder("spd"), Warping(1.0, top_k=10))
        engine.generate(PROMPT, 6, seed=0)
        side = torch.cuda.Stream("cuda:1")
        with torch.cuda.stream(side):  # a pass launched on another stream is timed there
            engine.draft.begin(PROMPT)
            engine.draft.forward([1], [0])
            engine.draft.end(PROMPT + [1])
    by_device = {}
    for _, stream in vd.events:
        by_device.setdefault(str(stream.device), []).append(stream.stream_id)
    assert len(by_device["cuda:0"]) == 2 * engine.target.forward_calls
    assert len(by_device["cuda:1"]) == 2 * engine.draft.forward_calls
    assert set(by_device["cuda:0"]) == {0}
    assert by_device["cuda:1"][-2:] == [side.stream_id] * 2 and set(by_device["cuda:1"][:-2]) == {0}

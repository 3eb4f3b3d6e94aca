"""BiLD (greedy and sampling, as in the published code) and Medusa-style typical acceptance."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch

from mtad.core.decoder import StepContext, StepOutput
from mtad.core.engine import Engine
from mtad.core.runner import ROOT
from mtad.core.warping import Warping
from mtad.decoders.autoregressive import Greedy
from mtad.decoders.bild import BiLD
from mtad.decoders.typical import Typical
from mtad.models.tiny import tiny_causal_lm
from mtad.testing import chi_square_gof, sample_sequences
from mtad.verify.rollback import rollback_position

PROMPT = [2, 3, 4]
INF = math.inf


def _greedy(model, n=24, warping=None):
    return Engine(model, None, Greedy(), warping or Warping(1.0)).generate(PROMPT, n).output_ids


# ---------------------------------------------------------------------------- BiLD
# A plain reference of the published rule (kssteven418/BigLittleDecoder, T5BiLDModel) with
# exact probabilities: full-sequence scoring, no caches, no token trees, no random numbers.
class ReferenceBiLD:
    def __init__(self, target, draft, bild: BiLD, warping: Warping):
        self.target, self.draft, self.bild, self.warping = target, draft, bild, warping
        self._cache: dict = {}
        self.events: dict[str, float] = defaultdict(float)  # probability that a step has each event

    @torch.no_grad()
    def probs(self, model, seq) -> torch.Tensor:  # [V] confidence / acceptance distribution
        key = (id(model), tuple(seq))
        if key not in self._cache:
            logits = model(input_ids=torch.tensor([list(seq)])).logits[0, -1].double()
            greedy = self.bild.mode == "greedy"
            self._cache[key] = logits.softmax(-1) if greedy else self.warping(logits)
        return self._cache[key]

    def pick(self, probs) -> dict[int, float]:  # the token-choice distribution
        if self.bild.mode == "greedy":
            return {int(probs.argmax()): 1.0}
        return {v: float(probs[v]) for v in torch.nonzero(probs).flatten().tolist()}

    def runs(self, ctx, limit, prefix=(), mass=1.0):
        """Little-model runs: (tokens, probability, ended by a fallback)."""
        if len(prefix) == limit:
            yield list(prefix), mass, False
            return
        q = self.probs(self.draft, ctx + list(prefix))
        if float(q.max()) < self.bild.alpha_fb:
            yield list(prefix), mass, True
            return
        for x, px in self.pick(q).items():
            yield from self.runs(ctx, limit, prefix + (x,), mass * px)

    def step(self, ctx: list[int], remaining: int, reach: float = 1.0) -> dict[tuple, float]:
        """Exact distribution of one step's emitted tokens (``reach``: weight in ``events``)."""
        out: dict[tuple, float] = defaultdict(float)

        def emit_target_token(toks, mass):
            for z, pz in self.pick(self.probs(self.target, ctx + toks)).items():
                out[tuple(toks + [z])] += mass * pz

        for d, pd, fallback in self.runs(ctx, min(self.bild.max_run, remaining)):
            n = len(d)
            self.events["fallback" if fallback else "full run"] += reach * pd
            if n == remaining and not fallback:  # ends the generation unverified
                self.events["cut by the length"] += reach * pd
                out[tuple(d)] += pd
                continue
            rb = next(
                (
                    i
                    for i, x in enumerate(d)
                    if float(self.probs(self.target, ctx + d[:i])[x])
                    < math.exp(-self.bild.alpha_rb)
                ),
                None,
            )
            keep = pd
            if rb is not None:
                for y, py in self.pick(self.probs(self.target, ctx + d[:rb])).items():
                    if y == d[rb]:
                        self.events["target agrees"] += reach * pd * py
                        continue  # no rollback (mass kept below)
                    self.events["rollback"] += reach * pd * py
                    if rb + 1 < remaining:
                        emit_target_token(d[:rb] + [y], pd * py)  # one more target iteration
                    else:
                        out[tuple(d[:rb] + [y])] += pd * py
                keep = pd * self.pick(self.probs(self.target, ctx + d[:rb])).get(d[rb], 0.0)
            if keep > 0:
                emit_target_token(d, keep)
        return out

    def joint(self, prompt: list[int], length: int) -> dict[tuple, float]:
        """Exact distribution of the first ``length`` generated tokens."""
        out: dict[tuple, float] = defaultdict(float)
        frontier = {(): 1.0}
        while frontier:
            nxt: dict[tuple, float] = defaultdict(float)
            for done, mass in frontier.items():
                for toks, pt in self.step(prompt + list(done), length - len(done), mass).items():
                    seq = done + toks[: length - len(done)]
                    (out if len(seq) == length else nxt)[seq] += mass * pt
            frontier = nxt
        return dict(out)


class FakeRunner:
    """Hand-built logits for a runner: ``logits_of(context)`` scores the next token."""

    def __init__(self, logits_of, committed):
        self.logits_of, self.committed = logits_of, list(committed)
        self.paths: list[list[int]] = []
        self.forward_calls = 0

    @property
    def root_logits(self):
        return self.logits_of(self.committed)

    def forward(self, tokens, parents):
        self.forward_calls += 1
        out = []
        for t, p in zip(tokens, parents):
            self.paths.append(([] if p == ROOT else self.paths[p - 1]) + [t])
            out.append(self.logits_of(self.committed + self.paths[-1]))
        return torch.stack(out) if out else torch.empty(0, 4, dtype=torch.float64)


def _one_hot_logits(token, vocab=4, high=10.0):
    x = torch.zeros(vocab, dtype=torch.float64)
    x[token] = high
    return x


def _step(draft_logits, target_logits, remaining=100, **kwargs):
    committed = [0, 0]
    t, d = FakeRunner(target_logits, committed), FakeRunner(draft_logits, committed)
    ctx = StepContext(
        committed=committed,
        target=t,
        draft=d,
        warping=Warping(1.0),
        generator=torch.Generator().manual_seed(0),
        remaining=remaining,
    )
    return BiLD(mode="greedy", **kwargs).step(ctx), t


def test_bild_full_run_emits_the_targets_token():
    """max_run confident draft tokens, all kept: the target's own next token ends the step."""
    out, t = _step(
        lambda c: _one_hot_logits(1), lambda c: _one_hot_logits(2 if len(c) == 5 else 1), max_run=3
    )
    assert out.tokens == [1, 1, 1, 2] and out.accepted == 3 and out.drafted == 3
    assert t.forward_calls == 1 and out.info["target_tokens"] == 1


def test_bild_fallback_emits_the_targets_token():
    flat = torch.zeros(4, dtype=torch.float64)  # max q = 0.25 < alpha_fb
    out, t = _step(
        lambda c: _one_hot_logits(1) if len(c) < 4 else flat,
        lambda c: _one_hot_logits(3 if len(c) == 4 else 1),
        max_run=5,
    )
    assert out.tokens == [1, 1, 3] and out.accepted == 2 and out.info["fallback"]
    out, _ = _step(lambda c: flat, lambda c: _one_hot_logits(2))
    assert out.tokens == [2] and out.drafted == 0


def test_bild_rollback_runs_the_target_once_more():
    """Rollback at x_2: keep x_1, the target's token at 2, then the target's next token."""

    def target(c):
        return {3: _one_hot_logits(3), 4: _one_hot_logits(2)}.get(len(c), _one_hot_logits(1))

    out, t = _step(lambda c: _one_hot_logits(1), target, max_run=4)
    # contexts: [0,0] -> 1 ok; [0,0,1] -> the target wants 3, not 1: roll back at i = 1;
    # the extra iteration scores [0,0,1,3] (length 4) -> 2
    assert out.tokens == [1, 3, 2] and out.accepted == 1 and out.info["rollback"] == 1
    assert t.forward_calls == 2 and t.paths[-1] == [1, 3] and out.info["target_tokens"] == 2


def test_bild_no_rollback_when_the_target_agrees():
    """First token over the rollback threshold equals the target's own choice: the published
    code keeps the whole run (a later position over the threshold included)."""
    nearly_flat = torch.tensor([0.0, 0.1, 0.0, 0.0], dtype=torch.float64)  # argmax 1, p < e^-1

    def target(c):
        return {2: nearly_flat, 3: _one_hot_logits(0), 4: _one_hot_logits(2)}[len(c)]

    out, t = _step(lambda c: _one_hot_logits(1), target, max_run=2, alpha_rb=1.0)
    assert -math.log(nearly_flat.softmax(-1)[1]) > 1.0  # over the threshold at x_1
    assert out.tokens == [1, 1, 2] and out.accepted == 2 and out.info["rollback"] is None


def test_bild_run_reaching_the_length_limit_is_not_verified():
    out, t = _step(lambda c: _one_hot_logits(1), lambda c: _one_hot_logits(2), remaining=2)
    assert out.tokens == [1, 1] and t.forward_calls == 0


@pytest.mark.parametrize(
    "alpha_fb,alpha_rb,max_run",
    [(0.0, INF, 3), (0.0, 0.5, 4), (0.3, 1.0, 10), (0.5, 2.0, 2), (0.6, 5.0, 10), (1.1, 5.0, 4)],
)
def test_bild_greedy_equals_the_reference(toy_pair, alpha_fb, alpha_rb, max_run):
    target, draft = toy_pair
    bild = BiLD(mode="greedy", alpha_fb=alpha_fb, alpha_rb=alpha_rb, max_run=max_run)
    res = Engine(target, draft, bild, Warping(0.7, top_k=3)).generate(PROMPT, 24)
    ref = ReferenceBiLD(target, draft, bild, Warping(0.7, top_k=3)).joint(PROMPT, 24)
    assert list(ref.values()) == [1.0] and res.output_ids == list(next(iter(ref)))
    if alpha_fb > 1:  # the draft never proposes: every token is the target's greedy token
        assert res.output_ids == _greedy(target) and all(s.emitted == 1 for s in res.steps)
    if alpha_rb == INF and alpha_fb == 0:  # runs of max_run draft tokens, each + a target token
        assert [s.emitted for s in res.steps] == [max_run + 1] * (24 // (max_run + 1)) + [
            24 % (max_run + 1)
        ] * bool(24 % (max_run + 1))


def test_bild_default_thresholds_mix_draft_and_target(toy_pair):
    target, draft = toy_pair
    res = Engine(
        target, draft, BiLD(mode="greedy", alpha_fb=0.3, alpha_rb=2.0), Warping(1.0)
    ).generate(PROMPT, 30)
    assert len(res.output_ids) == 30
    assert any(s.drafted > 0 for s in res.steps)


class OldBiLD(BiLD):
    """Wrong on purpose (this module's earlier reading): a full run emits the draft tokens only,
    and a rollback emits the target's token at i without the extra target iteration."""

    def step(self, ctx: StepContext) -> StepOutput:
        draft, fallback = self._draft_run(ctx)
        n = len(draft)
        logits = ctx.target.forward(draft, list(range(n)))
        p = self._probs(ctx, torch.cat([ctx.target.root_logits[None], logits]))
        rb = rollback_position(draft, p, self.alpha_rb)
        if rb is not None:
            return StepOutput(tokens=draft[:rb] + [self._pick(ctx, p[rb])], drafted=n, accepted=rb)
        tail = [self._pick(ctx, p[n])] if fallback or n == 0 else []
        return StepOutput(tokens=draft + tail, drafted=n, accepted=n)


SAMPLING = dict(mode="sampling", alpha_fb=0.4, alpha_rb=1.0, max_run=2)
BILD_LENGTH = 4


@pytest.fixture(scope="module")
def peaked_pair():
    """Peaked float64 toy pair (vocab 6): confident and unconfident contexts both occur."""

    def toy(seed):
        return tiny_causal_lm(
            "qwen2",
            vocab_size=6,
            hidden_size=16,
            num_layers=1,
            num_heads=2,
            seed=seed,
            dtype=torch.float64,
            logit_scale=10.0,
        )

    return toy(3), toy(11)


@pytest.fixture(scope="module")
def bild_sampling_joint(peaked_pair):
    target, draft = peaked_pair
    ref = ReferenceBiLD(target, draft, BiLD(**SAMPLING), Warping(1.0))
    joint = ref.joint(PROMPT, BILD_LENGTH)
    # every branch of the rule has real mass (expected occurrences per generation)
    assert (
        min(ref.events[k] for k in ("fallback", "full run", "rollback", "cut by the length")) > 0.1
    ), ref.events
    assert sum(joint.values()) == pytest.approx(1.0, abs=1e-9)
    return joint


def _bild_counts(pair, decoder, n):
    target, draft = pair
    return sample_sequences(
        Engine(target, draft, decoder, Warping(1.0)), PROMPT, BILD_LENGTH, n, seed0=77
    )


def test_bild_sampling_matches_the_exact_reference(peaked_pair, bild_sampling_joint):
    counts = _bild_counts(peaked_pair, BiLD(**SAMPLING), 2000)
    stat, pval, dof = chi_square_gof(counts, bild_sampling_joint)
    assert dof >= 10 and pval > 1e-4, (stat, pval, dof)


def test_bild_sampling_reference_rejects_the_old_reading(peaked_pair, bild_sampling_joint):
    counts = _bild_counts(peaked_pair, OldBiLD(**SAMPLING), 1200)
    stat, pval, dof = chi_square_gof(counts, bild_sampling_joint)
    assert pval < 1e-4, (stat, pval, dof)


def test_bild_sampling_runs_and_is_seeded(toy_pair):
    target, draft = toy_pair
    bild = BiLD(mode="sampling", alpha_fb=0.3, alpha_rb=2.0)
    eng = Engine(target, draft, bild, Warping(1.0, top_k=3))
    a, b = eng.generate(PROMPT, 20, seed=4), eng.generate(PROMPT, 20, seed=4)
    assert a.output_ids == b.output_ids and len(a.output_ids) == 20
    # sampling mode at temperature 0 is greedy on both models (thresholds on one-hot warps)
    bild0 = BiLD(mode="sampling", alpha_fb=0.0, alpha_rb=INF, max_run=3)
    never = Engine(target, draft, bild0, Warping(0)).generate(PROMPT, 20)
    ref = ReferenceBiLD(target, draft, bild0, Warping(0)).joint(PROMPT, 20)
    assert never.output_ids == list(next(iter(ref))) and list(ref.values()) == [1.0]


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"mode": "beam"}, "mode"),
        ({"alpha_fb": -0.1}, "alpha_fb"),
        ({"alpha_fb": INF}, "alpha_fb"),
        ({"alpha_rb": -1}, "alpha_rb"),
        ({"max_run": 0}, "max_run"),
        ({"alpha_rb": "x"}, "alpha_rb"),
    ],
)
def test_bild_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BiLD(**kwargs)


# ------------------------------------------------------------------------- typical

def test_typical_temperature_zero_equals_greedy(toy_pair):
    target, draft = toy_pair
    res = Engine(target, draft, Typical(gamma=3), Warping(0)).generate(PROMPT, 20)
    assert res.output_ids == _greedy(target, 20, Warping(0))


def test_typical_tiny_threshold_accepts_every_draft_token(toy_pair):
    target, draft = toy_pair
    res = Engine(target, draft, Typical(gamma=3, eps=1e-12), Warping(1.0)).generate(
        PROMPT, 20, seed=1
    )
    assert all(s.accepted == s.drafted for s in res.steps)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"gamma": 0}, "gamma"),
        ({"eps": 0.0}, "eps"),
        ({"eps": 1.5}, "eps"),
        ({"delta": 0}, "delta"),
        ({"delta": INF}, "delta"),
    ],
)
def test_typical_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Typical(**kwargs)

"""Where generation ends (mtad/core/stopping.py, the engine's cut): EOS ids and stop sequences,
inside multi-token accepted blocks, spanning tokens, ending mid-token; the seeded stream is
unchanged up to the stop. Stop sequences are checked against transformers'
``StopStringCriteria`` on a byte-level BPE tokenizer built in-process."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mtad.core.engine import Engine
from mtad.core.stopping import EOS, STOP_SEQUENCE, Stopping, StopSequences, token_pieces
from mtad.core.warping import Warping
from mtad.models.pair import tiny_pair
from mtad.run.cli import group_options, load_decoder
from mtad.testing import unsupported_by

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [3, 4, 5]
W = Warping(1.0, top_k=10, top_p=0.9)


# ----------------------------------------------------------------------------- the matcher

CODE = [
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
    "    if x:\n        print(x)\n# done\nif __name__ == '__main__':\n    main()\n",
    "class Foo:\n    pass\n\nprint('héllo wörld')\n#comment\n",
    "    result = []\n    for i in range(n):\n        result.append(i * 2)\n    return result\n",
]


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE tokenizer trained in-process on a few code lines (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CODE * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _reference_first(criteria, ids: list[int]) -> int | None:
    """transformers' criterion asked after each token, on the generated ids alone."""
    for k in range(len(ids)):
        if bool(criteria(torch.tensor([ids[: k + 1]]), None)[0]):
            return k
    return None


@pytest.mark.parametrize("stops", [["\ndef", "\nclass", "\n#", "\nif", "\nprint"], ["return"], ["ö"],
                                   ["n a"], ["\n\n\n"]])
def test_stop_sequences_agree_with_transformers_stop_string_criteria(bpe, stops):
    from transformers.generation.stopping_criteria import StopStringCriteria

    criteria = StopStringCriteria(bpe, stops)
    seqs = StopSequences(stops, token_pieces(bpe))
    rng = random.Random(0)
    texts = CODE + ["".join(rng.choice(CODE)[rng.randrange(20):][:rng.randrange(5, 60)] for _ in range(4))
                    for _ in range(30)]
    found = 0
    for text in texts:
        ids = bpe(text, add_special_tokens=False)["input_ids"]
        want = _reference_first(criteria, ids)
        assert seqs.first(ids) == want, (text, stops)
        # asked block by block, as the engine does: the same first position
        start, got = 0, None
        while start < len(ids) and got is None:
            end = min(len(ids), start + rng.randrange(1, 6))
            got = seqs.first(ids[:end], start)
            start = end
        assert got == want
        found += want is not None
    assert found  # the texts do contain stops


def test_stopping_unit_cases():
    pieces = {i: f" t{i}".encode() for i in range(40)}
    s = Stopping([7], StopSequences(["t3 t4", "t1 t2"], pieces))
    assert (s.first([5, 3, 4, 9]).index, s.first([5, 3, 4, 9]).reason) == (2, STOP_SEQUENCE)
    assert s.first([5, 3, 4, 9], start=3) is None  # a stop before ``start`` is the caller's business
    assert s.first([1, 23, 7]).index == 1  # " t1 t23" holds "t1 t2": the token it ends in is kept whole
    assert (s.first([5, 7, 3, 4]).index, s.first([5, 7, 3, 4]).reason) == (1, EOS)
    assert Stopping([4], StopSequences(["t3 t4"], pieces)).first([3, 4]).reason == EOS  # both: EOS
    assert Stopping([], None).first([1, 2, 3]) is None
    assert StopSequences.from_tokenizer([], object()) is None  # no sequences: the vocabulary is not read
    with pytest.raises(ValueError, match="empty"):
        StopSequences([""], pieces)


# ----------------------------------------------------------------------------- the engine

@pytest.fixture(scope="module")
def models():
    pair = tiny_pair(logit_scale=4.0)
    return pair.target, pair.draft


def _engine(models, name, same_draft=True, eos=(), stops=()):
    target, draft = models
    tok = tiny_pair(eos_token_ids=eos, tokenizer_only=True)
    if why := unsupported_by(load_decoder(name), W):
        pytest.skip(why)
    return Engine(target, target if same_draft else draft, load_decoder(name), W, tok.vocab_size,
                  tok.eos_token_ids, StopSequences.from_tokenizer(list(stops), tok.tokenizer))


def _step_of(res, j: int) -> tuple[int, int]:
    """(step, position of its first token) of output position ``j``."""
    pos = 0
    for s, st in enumerate(res.steps):
        if j < pos + st.emitted:
            return s, pos
        pos += st.emitted
    raise IndexError(j)


def _inside_a_block(res, ok) -> int:
    """An output position strictly inside a step's block (neither its first nor its last token)
    for which ``ok(j)`` holds."""
    pos = 0
    for st in res.steps:
        for j in range(pos + 1, pos + st.emitted - 1):
            if ok(j):
                return j
        pos += st.emitted
    raise AssertionError("no multi-token block with a usable position: " + str(res.to_record()["emitted_per_step"]))


def _assert_cut(res, ref, j: int, reason: str) -> None:
    """``res`` is ``ref`` cut after output position ``j``, with per-step records that say so."""
    s, pos = _step_of(ref, j)
    rec, full = res.to_record(), ref.to_record()
    assert res.output_ids == ref.output_ids[: j + 1] and res.stop_reason == reason
    assert rec["new_tokens"] == j + 1 and sum(rec["emitted_per_step"]) == j + 1
    assert rec["emitted_per_step"] == full["emitted_per_step"][:s] + [j + 1 - pos]
    assert rec["accepted_per_step"][:s] == full["accepted_per_step"][:s]
    assert rec["accepted_per_step"][s] == min(full["accepted_per_step"][s], j + 1 - pos)
    assert rec["drafted_per_step"] == full["drafted_per_step"][: s + 1]


@pytest.mark.parametrize("name", ["spd", "tree_mtad"])
def test_an_eos_inside_an_accepted_block_cuts_the_block(models, name):
    ref = _engine(models, name).generate(PROMPT, 40, seed=5)
    assert ref.stop_reason == "length"
    j = _inside_a_block(ref, lambda j: ref.output_ids[j] not in ref.output_ids[:j])
    res = _engine(models, name, eos=[ref.output_ids[j]]).generate(PROMPT, 40, seed=5)
    _assert_cut(res, ref, j, "eos")
    assert ref.steps[_step_of(ref, j)[0]].accepted >= j + 1 - _step_of(ref, j)[1]  # cut among accepted tokens


def _text(ids) -> str:
    return "".join(f" t{i}" for i in ids)


@pytest.mark.parametrize("name", ["spd", "tree_mtad"])
def test_a_stop_sequence_spanning_two_tokens_inside_a_block(models, name):
    ref = _engine(models, name).generate(PROMPT, 40, seed=6)
    out = ref.output_ids

    def spans(j):  # "t{a} t{b}" over tokens j-1, j, found nowhere earlier
        return f"t{out[j - 1]} t{out[j]}" not in _text(out[:j])

    j = _inside_a_block(ref, spans)
    stop = f"t{out[j - 1]} t{out[j]}"
    res = _engine(models, name, stops=[stop]).generate(PROMPT, 40, seed=6)
    _assert_cut(res, ref, j, "stop_sequence")
    assert " ".join(f"t{i}" for i in res.output_ids).endswith(stop)  # the stop sequence is kept


@pytest.mark.parametrize("name", ["spd", "tree_mtad"])
def test_a_stop_sequence_ending_mid_token_keeps_that_token(models, name):
    ref = _engine(models, name).generate(PROMPT, 40, seed=7)
    out = ref.output_ids

    def mid(j):  # "t{a} t{first digit of b}" with b of two digits, first complete at token j
        stop = f"t{out[j - 1]} t{str(out[j])[0]}"
        return out[j] >= 10 and stop not in _text(out[:j])

    j = _inside_a_block(ref, mid)
    res = _engine(models, name, stops=[f"t{out[j - 1]} t{str(out[j])[0]}"]).generate(PROMPT, 40, seed=7)
    _assert_cut(res, ref, j, "stop_sequence")
    assert res.output_ids[-1] == out[j]  # the token the stop ends in is kept whole


@pytest.mark.parametrize("name", group_options("decoder"))
def test_every_decoder_stops_at_an_eos_with_the_stream_unchanged_before_it(models, name):
    """Any decoder, own draft: the output up to the EOS is the unstopped output's prefix."""
    ref = _engine(models, name, same_draft=False).generate(PROMPT, 24, seed=8)
    firsts = [j for j in range(4, len(ref.output_ids)) if ref.output_ids[j] not in ref.output_ids[:j]]
    j = firsts[0]
    res = _engine(models, name, same_draft=False, eos=[ref.output_ids[j]]).generate(PROMPT, 24, seed=8)
    _assert_cut(res, ref, j, "eos")



# ----------------------------------------------------------------------------- the offline pair's EOS ids

OFFLINE_PAIRS = sorted(p for p in (ROOT / "conf" / "model").glob("*.yaml")
                       if "offline_pair" in str(OmegaConf.load(p).get("_target_")))


@pytest.mark.parametrize("path", OFFLINE_PAIRS, ids=lambda p: p.stem)
def test_offline_pairs_stop_at_every_eos_id_of_their_family(path):
    """Every offline pair lists its models' family EOS ids (Qwen2.5: <|endoftext|> 151643 and
    <|im_end|> 151645; the GGUF keeps only the second), and a list without them is refused
    before any weight is read."""
    from mtad.models.offline import MODELS
    from mtad.models.pair import offline_pair

    cfg = OmegaConf.load(path)
    listed = set(cfg.get("eos_token_ids") or [])
    for role in ("target", "draft"):
        family = set(MODELS[cfg[role].id].eos_token_ids)
        assert family == {151643, 151645} and family <= listed, (path.name, role)
    with pytest.raises(ValueError, match=r"lacks \[151643\]"):
        offline_pair("x", dict(cfg.target), dict(cfg.draft), eos_token_ids=[151645], tokenizer_only=True)


@pytest.mark.slow  # needs the converted offline models (make models)
def test_the_converted_tokenizer_names_the_family_ids_and_the_pair_stops_at_both():
    from mtad.models.offline import converted_dir
    from mtad.models.pair import load_tokenizer

    cfg = OmegaConf.load(ROOT / "conf" / "model" / "qwen_coder_offline.yaml")
    if not (converted_dir(cfg.target.id, cfg.target.dtype) / "tokenizer.json").exists():
        pytest.skip("offline models not converted (make models)")
    pair = load_tokenizer(cfg)
    assert pair.eos_token_ids == [151643, 151645]
    assert pair.tokenizer.convert_ids_to_tokens([151643, 151645]) == ["<|endoftext|>", "<|im_end|>"]
    assert pair.tokenizer.eos_token_id == 151645  # what the GGUF kept
    stop = StopSequences.from_tokenizer(["\ndef"], pair.tokenizer)
    ids = pair.tokenizer("    return x\n\ndef g():\n", add_special_tokens=False)["input_ids"]
    j = stop.first(ids)
    assert "\ndef" in pair.tokenizer.decode(ids[: j + 1])
    assert "\ndef" not in pair.tokenizer.decode(ids[:j])

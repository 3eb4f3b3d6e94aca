"""Model pairs: tokenizer compatibility is checked on ids and special tokens."""

import pytest

from mtad.models.pair import check_same_tokenizer, tiny_pair
from mtad.models.tiny import TinyTokenizer


def test_same_tokenizer_passes():
    check_same_tokenizer(TinyTokenizer(50), TinyTokenizer(50), "target-a", "draft-b")


def test_mismatched_tokenizers_name_both_models():
    with pytest.raises(ValueError, match="draft-b.*target-a"):
        check_same_tokenizer(TinyTokenizer(50), TinyTokenizer(60), "target-a", "draft-b")


def test_different_special_tokens_rejected():
    with pytest.raises(ValueError, match="special token ids differ"):
        check_same_tokenizer(TinyTokenizer(50), TinyTokenizer(50, eos_token_id=3), "t", "d")


def test_tiny_pair_records_ids_and_checksums():
    pair = tiny_pair(vocab_size=30, dtype="float64")
    assert pair.vocab_size == 30 and pair.target_id != pair.draft_id
    assert len(pair.info["target_checksum"]) == 16
    with pytest.raises(ValueError, match="model.dtype"):
        tiny_pair(dtype="float8")

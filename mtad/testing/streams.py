"""How many random numbers a CPU ``torch.Generator`` drew between two of its states.

The CPU generator is a Mersenne Twister: its state holds the 624-word block and the words left
before the next twist (``left``: the position in the block). A uniform double takes two 32-bit words,
an exponential two, one ``randint`` below 2**16 one. ``words_between`` steps a clone of the
earlier state by whole blocks until its block is the later state's (as many twists), then
counts the difference of positions: exact, and quick for millions of words (one step per 624).
Draws that rewind the generator (``set_state``) count only what they leave drawn.
"""

from __future__ import annotations

import struct

import torch

__all__ = ["words_between"]

_BLOCK = 624
_LEFT = 8  # byte offset of ``left`` (int32) in ``get_state()``: words left before the next twist
_WORDS = slice(24, 24 + 4 * _BLOCK)  # the block's bytes


def _position(state: torch.Tensor) -> int:
    """Words drawn since the last twist (a freshly seeded generator: a whole block, 624)."""
    return _BLOCK + 1 - struct.unpack_from("<i", bytes(state[_LEFT : _LEFT + 4].tolist()))[0]


def words_between(before: torch.Tensor, after: torch.Tensor, max_words: int = 10**9) -> int:
    """32-bit words drawn from state ``before`` to state ``after`` (``get_state()`` of one CPU
    generator; ``after`` reached from ``before`` by drawing). ValueError past ``max_words``."""
    clone = torch.Generator()
    clone.set_state(before)
    twists = 0
    while not torch.equal(clone.get_state()[_WORDS], after[_WORDS]):
        torch.randint(0, 2**16, (_BLOCK,), generator=clone)
        twists += 1
        if twists * _BLOCK > max_words + _BLOCK:
            raise ValueError(f"more than {max_words} words between the states (or not one stream)")
    n = twists * _BLOCK + _position(after) - _position(before)
    if n < 0 or n > max_words:
        raise ValueError(f"not one stream: {n} words")
    return n

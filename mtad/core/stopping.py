"""Where a generation ends: end-of-sequence ids and stop sequences.

``Stopping.first(ids, start)`` answers, for the tokens generated so far, at which token (at
or after ``start``) the generation must end and why ("eos" or "stop_sequence"). The engine
asks it once per step about the block the step emitted, and cuts the block after that
token; the results store asks it about a finished record to see whether a changed stop set
would have cut it (``mtad.run.sweep.adopt``). One owner of the rule, so both agree.

Semantics of a stop sequence (those of transformers' ``stop_strings`` /
``StopStringCriteria``, and of the HumanEval harnesses' ``EndOfFunctionCriteria``):

- it is matched on the text the generated tokens spell, so it may span token boundaries
  and start inside a token; the prompt is not part of that text (as in bigcode's
  ``EndOfFunctionCriteria``, which decodes ``input_ids[:, start_length:]``; transformers'
  criterion would also match across the prompt's last characters);
- the generation ends with the token in which the stop sequence is complete. That token is
  kept whole, with any characters it has after the stop sequence: the output keeps the stop
  sequence, as transformers does, and token counts, perplexity and block efficiency count
  every token a user receives. The harnesses then cut the text before the stop sequence;
  here the HumanEval scorer cuts the completion to its first function (``docs/scoring.md``).

An end-of-sequence id ends the generation at that token (kept, as before). When one token
is both, the reason is "eos".

This module knows token ids and the bytes each token spells, nothing about models or
decoders; ``token_pieces`` reads those bytes from a tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

EOS, STOP_SEQUENCE = "eos", "stop_sequence"


@dataclass(frozen=True)
class Stop:
    index: int  # position in the generated ids of the last token kept
    reason: str  # EOS or STOP_SEQUENCE


def token_pieces(tokenizer) -> dict[int, bytes]:
    """The bytes each token id adds to the text, from a tokenizer.

    A tokenizer with a ``token_pieces()`` method (the in-process test tokenizer) gives them
    itself; for a transformers tokenizer they come from transformers' own
    ``StopStringCriteria.clean_tokenizer_vocab`` (byte-level BPE tokens as raw bytes, so a
    multi-byte character split over tokens is matched exactly; ``Ġ``/``▁`` prefixes resolved).
    """
    if hasattr(tokenizer, "token_pieces"):
        return dict(tokenizer.token_pieces())
    from transformers.generation.stopping_criteria import StopStringCriteria

    mode_of = getattr(StopStringCriteria, "_get_stop_string_matching_mode", None)
    mode = mode_of(tokenizer) if mode_of else None
    strings, ids = StopStringCriteria.clean_tokenizer_vocab(tokenizer, stop_string_matching_mode=mode)
    return {int(i): s if isinstance(s, bytes) else s.encode("utf-8") for s, i in zip(strings, ids)}


class StopSequences:
    """Finds the first generated token that completes one of ``sequences``.

    Written here rather than calling transformers' ``StopStringCriteria`` per token: that
    criterion answers only "does the whole sequence end with a stop string now" for a batch
    tensor (one call per token of an accepted block, prompt included), while the engine needs
    the first completing position inside a block, over generated tokens only. It reuses the
    criterion's vocabulary cleaning (``token_pieces``); the matching itself is a byte search
    over a window of the last tokens, checked against the criterion in tests/core/test_stopping.py.
    """

    def __init__(self, sequences: Sequence[str], pieces: Mapping[int, bytes]):
        self.sequences = tuple(str(s) for s in sequences)
        if any(not s for s in self.sequences):
            raise ValueError("a stop sequence must not be empty")
        self._targets = tuple(s.encode("utf-8") for s in self.sequences)
        self._pieces = pieces
        self._longest = max((len(t) for t in self._targets), default=0)

    @classmethod
    def from_tokenizer(cls, sequences: Sequence[str], tokenizer) -> StopSequences | None:
        """None when there are no sequences (the tokenizer's vocabulary is then not read)."""
        return cls(sequences, token_pieces(tokenizer)) if sequences else None

    def _piece(self, token: int) -> bytes:
        return self._pieces.get(int(token), b"")

    def first(self, ids: Sequence[int], start: int = 0) -> int | None:
        """Index ``i >= start`` of the first token with a stop sequence complete in ``ids[: i + 1]``.

        ``ids[:start]`` must hold none (the caller stopped there otherwise); only a window
        of them long enough to begin a match ending at or after ``start`` is read.
        """
        if not self._targets or start >= len(ids):
            return None
        lo, held = start, 0
        while lo > 0 and held < self._longest - 1:  # earlier bytes a match may begin in
            lo -= 1
            held += len(self._piece(ids[lo]))
        text, ends = b"", []  # ends[k]: byte offset just after token lo + k
        for t in ids[lo:]:
            text += self._piece(t)
            ends.append(len(text))
        first_new = ends[start - lo - 1] if start > lo else 0  # bytes before token ``start``
        best = None
        for target in self._targets:
            at = text.find(target, max(0, first_new - len(target) + 1))
            if at < 0:
                continue
            end = at + len(target)  # the match's last byte is text[end - 1]
            k = next(k for k, e in enumerate(ends) if e >= end)
            best = k if best is None else min(best, k)
        return None if best is None else lo + best


class Stopping:
    """End-of-sequence ids and, optionally, stop sequences: where a generation must end."""

    def __init__(self, eos_token_ids: Iterable[int] = (), sequences: StopSequences | None = None):
        self.eos = frozenset(int(e) for e in eos_token_ids)
        self.sequences = sequences

    def first(self, ids: Sequence[int], start: int = 0) -> Stop | None:
        """The first token at or after ``start`` that ends the generation ``ids``, or None."""
        eos = next((i for i in range(start, len(ids)) if int(ids[i]) in self.eos), None)
        seq = self.sequences.first(ids, start) if self.sequences is not None else None
        if eos is not None and (seq is None or eos <= seq):
            return Stop(eos, EOS)
        return Stop(seq, STOP_SEQUENCE) if seq is not None else None

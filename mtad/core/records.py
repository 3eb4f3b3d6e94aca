"""One record of ``samples.jsonl``: the fields it holds, their types, and the check of one record.

A record is one (example, turn) of a run. The engine makes the generation's fields
(``ENGINE_FIELDS``: ``mtad.core.engine.GenerationResult.to_record``); the runner
(``mtad.run.evaluate``) adds the example's ids, the text, energy and speed (the rest of
``RECORD_FIELDS``) and, when it computes them, perplexity and the score (``OPTIONAL_FIELDS``).
Every layer that writes or reads records takes their schema from here: the engine (rank 0),
the results store's self-check (``mtad.run.results.folder``), the rescoring and claims of
``mtad.analysis``, the regeneration check of ``mtad.testing``.

A field's types are a tuple of types, or a ``ListOf`` its elements' types; ``value_ok`` also
checks contents: numbers finite, integers in ``INT_RANGE``, no ``bool`` for a number.

This module knows no file format (``mtad.core.io``) nor folder layout (``mtad.run.results``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class ListOf(tuple):
    """The types of a list field, ``(list,)``, whose every element must be one of ``elements``
    (checked like a field)."""

    def __new__(cls, elements: tuple[type, ...]):
        self = super().__new__(cls, (list,))
        self.elements = tuple(elements)
        return self


NUMBER, OPTIONAL_NUMBER = (int, float), (int, float, type(None))
INTS = ListOf((int,))
#: Integers a record may hold (int64): a wider one is damage, not a count.
INT_RANGE = (-(2**63), 2**63 - 1)

#: What ``GenerationResult.to_record`` returns for every generation (and ``shape_per_step``, an
#: optional field, when a decoder knob is ``auto``).
ENGINE_FIELDS: dict[str, tuple[type, ...]] = {
    "prompt_tokens": (int,), "output_ids": INTS, "new_tokens": (int,), "steps": (int,),
    "accepted_per_step": INTS, "drafted_per_step": INTS, "emitted_per_step": INTS,
    "tree_size_per_step": INTS, "target_passes": (int,), "target_forward_time": NUMBER,
    "draft_forward_time": NUMBER, "wall_time": NUMBER, "prefill_time": NUMBER,
    "block_efficiency": NUMBER, "stop_reason": (str,),
}
#: What every record holds, with its types: the example's ids and text, the engine's fields,
#: energy and speed. ``mtad.run.results.PointFolder.append`` refuses a record without them and
#: ``PointFolder.check`` drops a line without them (recomputed), so the writer and every resume
#: agree. Optional fields (``OPTIONAL_FIELDS``) are checked the same way when present.
RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "example_id": (str,), "turn": (int,), "index": (int,), "text": (str,),
    **ENGINE_FIELDS, "energy_j": OPTIONAL_NUMBER, "tokens_per_s": OPTIONAL_NUMBER,
}
#: A score and what made it (``eval.base.Scorer.record_fields``): on the last turn of an
#: example when its task has a scorer; ``mtad.analysis.rescore`` rewrites exactly these.
SCORE_FIELDS: dict[str, tuple[type, ...]] = {
    "score": OPTIONAL_NUMBER, "scorer": (str,), "scorer_version": (str,),
}
#: Fields a record holds when they apply: the shapes ``gamma=auto`` / ``width=auto`` chose per
#: step (the engine; ``mtad.autotune.autoshape``), the target's perplexity of the answer (the
#: runner, unless ``perplexity=false``), the score.
OPTIONAL_FIELDS: dict[str, tuple[type, ...]] = {
    "shape_per_step": ListOf((dict, type(None))), "perplexity": OPTIONAL_NUMBER,
    "nll_sum": OPTIONAL_NUMBER, **SCORE_FIELDS,
}


def value_ok(value: Any, types: tuple[type, ...], finite: bool = True) -> bool:
    """Whether ``value`` has one of ``types`` and sound contents (``RECORD_FIELDS``); with
    ``finite=False`` a float may be NaN or infinite (summaries: an undefined statistic)."""
    if isinstance(types, ListOf):
        return isinstance(value, list) and all(value_ok(v, types.elements, finite) for v in value)
    if isinstance(value, bool) and bool not in types:
        return False
    if not isinstance(value, types):
        return False
    if isinstance(value, int):
        return INT_RANGE[0] <= value <= INT_RANGE[1]
    if isinstance(value, float):
        return math.isfinite(value) or not finite
    return True


def record_problem(record: Mapping[str, Any]) -> str | None:
    """Why ``record`` is not a ``samples.jsonl`` record (a missing field, or one of the wrong type
    or contents), or None."""
    missing = [k for k in RECORD_FIELDS if k not in record]
    wrong = [k for fields in (RECORD_FIELDS, OPTIONAL_FIELDS) for k, types in fields.items()
             if k in record and not value_ok(record[k], types)]
    for what, names in (("no", missing), ("bad", wrong)):
        if names:
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            return f"{what} {', '.join(names[:3])}{more}"
    return None


def record_key(record: Mapping[str, Any]) -> tuple[str, int]:
    """A record's key in its point: (example id, turn); unique in ``samples.jsonl``."""
    return (str(record["example_id"]), int(record["turn"]))

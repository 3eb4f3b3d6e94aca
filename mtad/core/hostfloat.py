"""Tensor float arithmetic on Python floats, bit for bit: what the host-side fast paths of the
drafting and verification rules compute with.

A rule on a few dozen entries costs more in torch calls than in arithmetic, so the CPU paths of
beam scoring, the threshold rules, tree drafting and the multi-draft walk compute on Python
floats. They must give the very bits the tensor form gives, since a draw or an acceptance reads
them. One rule makes that hold:

* float64: Python floats are IEEE doubles, so one ``+ - * /`` is the tensor's operation.
* float32: one ``+ - * /`` of two float32 values done in double and rounded once to float32 is
  the float32 operation (53 >= 2 * 24 + 2 significand bits: the double rounding is innocuous).
  ``rounding(dtype)`` gives that rounding, for one value and for a list.
* Other dtypes: no host form (``rounding`` is None): callers keep the tensor form.

Sums of more than two values are not covered (their order is the tensor kernel's): callers sum
with ``torch.sum`` of the same vector. Logarithms likewise stay torch calls.

``torch.multinomial(masses, 1, generator=g)`` draws ``n`` exponentials ``e`` from ``g`` in the
masses' dtype and returns ``argmax(masses / e)`` (the first index on ties); the generator's
stream is sequential, so ``k`` successive draws take the ``k * n`` exponentials of one call
(``exponentials``). ``multinomial_pick`` is that choice on lists (``tests/propose/test_tree_draws.py``,
``tests/verify/test_small_supports.py`` and ``tests/core/test_device_draw.py`` check it against
``torch.multinomial`` on the installed torch).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable

import torch

__all__ = ["HOST_DTYPES", "exponentials", "multinomial_pick", "rounding"]

HOST_DTYPES = (torch.float32, torch.float64)  # dtypes with a host form
_F32 = struct.Struct("f")


def _one32(x: float) -> float:
    return _F32.unpack(_F32.pack(x))[0]


def _many32(xs: list[float]) -> list[float]:
    return array("f", xs).tolist()


def _same(x):
    return x


def rounding(dtype: torch.dtype) -> tuple[Callable[[float], float], Callable[[list[float]], list[float]]] | None:
    """(round one value, round a list) to ``dtype``; None for a dtype without a host form."""
    if dtype == torch.float64:
        return _same, _same
    if dtype == torch.float32:
        return _one32, _many32
    return None


def exponentials(shape: int | tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """The exponentials ``torch.multinomial`` draws (see the module docstring), in one call."""
    return torch.empty(shape, dtype=dtype).exponential_(1, generator=generator)


def multinomial_pick(masses: list[float], e: list[float], dtype: torch.dtype) -> int:
    """``argmax(masses / e)`` with the quotients rounded to ``dtype`` (float32 / float64), the first
    index on ties: ``torch.multinomial``'s choice given its exponentials ``e`` (none of them 0)."""
    many = rounding(dtype)[1]
    ratios = many([m / x for m, x in zip(masses, e)])
    return ratios.index(max(ratios))

"""Plain data across the sandbox boundary: ``repr`` of literals, read back with ``ast.literal_eval``.

Only exact built-in types cross: ``None``, ``bool``, ``int``, ``float`` (also inf and
nan), ``str``, ``bytes``, ``list``, ``tuple``, ``dict``, ``set`` and ``frozenset``.
Tuples, sets and non-finite floats travel as tagged pairs (``("tuple", (...))``), so a
list and a tuple stay apart and every raw tuple on the wire is a tag. Anything else
(a subclass, an object with its own ``__eq__``, a generator) raises
:class:`WireError` on the sending side; the receiving side accepts only what this
module writes. Nothing is ever unpickled or executed.

The sandboxed child runs this module's source too (it is sent along with the
program), so both ends speak the same format.
"""

from __future__ import annotations

import ast
import math


class WireError(ValueError):
    """A value that cannot cross, or a message that was not written by :func:`dumps`."""


_ATOMS = (type(None), bool, int, str, bytes)
_TAGGED = {"tuple": tuple, "set": set, "frozenset": frozenset}


def _pack(v):
    t = type(v)
    if t in _ATOMS:
        return v
    if t is float:
        return v if math.isfinite(v) else ("float", repr(v))
    if t is list:
        return [_pack(x) for x in v]
    if t is dict:
        return {_pack(k): _pack(x) for k, x in v.items()}
    if t in (tuple, set, frozenset):
        return (t.__name__, tuple(_pack(x) for x in v))
    raise WireError(f"a {t.__name__} cannot cross the sandbox boundary (plain data only)")


def _unpack(v):
    t = type(v)
    if t in _ATOMS or t is float:
        return v
    if t is list:
        return [_unpack(x) for x in v]
    if t is dict:
        return {_unpack(k): _unpack(x) for k, x in v.items()}
    if t is tuple and len(v) == 2 and type(v[0]) is str:
        tag, body = v
        if tag == "float" and body in ("inf", "-inf", "nan"):
            return float(body)
        if tag in _TAGGED and type(body) is tuple:
            return _TAGGED[tag](_unpack(x) for x in body)
    raise WireError(f"not a message of this format: {type(v).__name__}")


def dumps(value) -> str:
    """``value`` as a Python literal (see the module docstring for what may cross)."""
    try:
        return repr(_pack(value))
    except RecursionError as e:
        raise WireError("value nested too deeply or cyclic") from e
    except ValueError as e:  # e.g. an int past sys.get_int_max_str_digits()
        raise WireError(str(e)) from e


def loads(text: str):
    """The value :func:`dumps` wrote; :class:`WireError` on anything else."""
    try:
        return _unpack(ast.literal_eval(text))
    except WireError:
        raise
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise WireError(f"unreadable message: {type(e).__name__}") from e

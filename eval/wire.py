"""Plain data across the sandbox boundary: ``repr`` of literals, read back from ``ast.parse``'s tree.

Only exact built-in types cross: ``None``, ``bool``, ``int``, ``float`` (also inf and
nan), ``str``, ``bytes``, ``list``, ``tuple``, ``dict``, ``set`` and ``frozenset``.
Tuples, sets and non-finite floats travel as tagged pairs (``("tuple", (...))``), so a
list and a tuple stay apart and every raw tuple on the wire is a tag. Anything else
(a subclass, an object with its own ``__eq__``, a generator) raises
:class:`WireError` on the sending side; the receiving side accepts only what this
module writes, reading the parsed message itself (no ``ast.literal_eval``), and can
bound how many values, set elements and dict keys it holds (counted before any container
is built) and how long reading it may take. Nothing is ever unpickled or executed.

The sandboxed child runs this module's source too (it is sent along with the
program), so both ends speak the same format.
"""

from __future__ import annotations

import ast
import math
import time


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


def dumps(value) -> str:
    """``value`` as a Python literal (see the module docstring for what may cross)."""
    try:
        return repr(_pack(value))
    except RecursionError as e:
        raise WireError("value nested too deeply or cyclic") from e
    except ValueError as e:  # e.g. an int past sys.get_int_max_str_digits()
        raise WireError(str(e)) from e


def _count(tree: ast.expr, max_values: int | None, max_keys: int | None) -> None:
    """Refuse a message with too many values, or too many set elements and dict keys (whose
    hashing is quadratic when they all hash alike), before any container is built."""
    values = keys = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.expr):
            continue
        values += 1
        if isinstance(node, ast.Dict):
            keys += len(node.keys)
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and isinstance(node.elts[1], ast.Tuple):
            tag = node.elts[0]
            if isinstance(tag, ast.Constant) and tag.value in ("set", "frozenset"):
                keys += len(node.elts[1].elts)
        if max_values is not None and values > max_values:
            raise WireError(f"more than {max_values} values")
        if max_keys is not None and keys > max_keys:
            raise WireError(f"more than {max_keys} set elements and dict keys")


def _number(node: ast.expr):
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _number(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    raise WireError("not a message of this format: an expression")


class _Reader:
    """Builds the value of a parsed message, accepting only what :func:`dumps` writes."""

    def __init__(self, deadline: float | None):
        self.deadline = deadline

    def value(self, node: ast.expr):
        if isinstance(node, ast.Constant):
            if type(node.value) in _ATOMS or type(node.value) is float:
                return node.value
            raise WireError(f"not a message of this format: {type(node.value).__name__}")
        if isinstance(node, ast.UnaryOp):
            return _number(node)
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise WireError("deadline passed while reading the message")
        if isinstance(node, ast.List):
            return [self.value(x) for x in node.elts]
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {self.value(k): self.value(x) for k, x in zip(node.keys, node.values)}
        if isinstance(node, ast.Tuple) and len(node.elts) == 2:
            tag, body = node.elts
            tag = tag.value if isinstance(tag, ast.Constant) and type(tag.value) is str else None
            if tag == "float" and isinstance(body, ast.Constant) and body.value in ("inf", "-inf", "nan"):
                return float(body.value)
            if tag in _TAGGED and isinstance(body, ast.Tuple):
                return _TAGGED[tag](self.value(x) for x in body.elts)
        raise WireError(f"not a message of this format: {type(node).__name__}")


def loads(text: str, max_values: int | None = None, max_keys: int | None = None,
          deadline: float | None = None):
    """The value :func:`dumps` wrote; :class:`WireError` on anything else.

    ``max_values`` bounds the number of values (atoms and containers), ``max_keys`` the
    number of set elements and dict keys; both are counted before anything is built.
    ``deadline`` (a ``time.monotonic()`` value) stops reading a message once passed.
    """
    try:
        tree = ast.parse(text, mode="eval").body
        _count(tree, max_values, max_keys)
        return _Reader(deadline).value(tree)
    except WireError:
        raise
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise WireError(f"unreadable message: {type(e).__name__}") from e

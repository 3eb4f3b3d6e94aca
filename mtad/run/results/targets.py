"""Stored configs are data: the class paths a results folder may name, checked before any import.

A results folder (``config.json``, a summary's ``config``, a legacy ``point.json``) travels
between people, and its ``_target_`` keys name code. Readers that turn a stored config into
objects (``mtad.analysis.rescore``, ``mtad.testing.regenerate``) or look a class up by its
path (``mtad.analysis.names``) go through here:

- ``trusted_config(config, where)``: the config with moved class paths migrated
  (``mtad.run.results.identity.MOVED_TARGETS``) after every ``_target_`` in it was checked
  against ``ALLOWED_TARGETS`` by its place in the config: ``decoder`` names a class under
  ``mtad.decoders.``, ``task`` one under ``mtad.tasks.``, ``task.scorer`` one under
  ``eval.``, ``model`` a builder under ``mtad.models.pair.``, ``logger`` one under
  ``mtad.run.tracking.``. A ``_target_`` anywhere else, or one that is not a dotted path of
  identifiers, is refused. Nothing is imported to decide this.
- ``stored_object(target, section)``: the object an allowed path names, imported only after
  the check, and only when the path names it where it is defined (a module re-exporting
  ``os`` does not make ``mtad.tasks.common.os.system`` one of the project's names) and it is
  a class (a builder function for ``model``).

- ``data_only(config, where)``: refuses a stored string holding an interpolation (``${...}``,
  never resolved nor shown resolved) and a key that is not a string.

A refusal is ``UntrustedConfig``, one line naming the folder, the place and the path.
``mtad.run.results.described`` is the loader every reader uses; it applies these checks.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any

from mtad.run.results.identity import migrate

#: Place of a ``_target_`` in a stored config -> (package prefix of its path, kinds allowed).
ALLOWED_TARGETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "decoder": ("mtad.decoders.", ("class",)),
    "task": ("mtad.tasks.", ("class",)),
    "task.scorer": ("eval.", ("class",)),
    "model": ("mtad.models.pair.", ("class", "function")),
    "logger": ("mtad.run.tracking.", ("class",)),
}
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


class UntrustedConfig(ValueError):
    """A stored config names code outside the project's own classes."""


def _refuse(where: Any, place: str, target: Any, why: str) -> UntrustedConfig:
    return UntrustedConfig(
        f"{where}: stored config names {place}._target_ = {str(target)[:200]!r}, {why}; refusing to "
        "load it (results folders are data: only the project's own classes are built from them)")


def check_target(target: Any, place: str, where: Any = "stored config") -> str:
    """``target`` when it is an allowed path for ``place`` (string check only, no import)."""
    if place not in ALLOWED_TARGETS:
        raise _refuse(where, place, target, f"a place where no class is built (allowed: "
                      f"{', '.join(ALLOWED_TARGETS)})")
    prefix, _ = ALLOWED_TARGETS[place]
    if not isinstance(target, str) or not _DOTTED.fullmatch(target) or not target.startswith(prefix):
        raise _refuse(where, place, target, f"not a class under {prefix}")
    return target


def _walk(node: Any, place: str, where: Any, resolve: bool) -> None:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "_target_":
                (stored_object if resolve else check_target)(value, place, where)
            else:
                _walk(value, f"{place}.{key}" if place else str(key), where, resolve)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _walk(value, f"{place}[{i}]", where, resolve)


def trusted_config(config: Any, where: Any = "stored config", resolve: bool = False,
                   place: str = "") -> Any:
    """``config`` (the node at ``place``; the whole config by default) migrated (moved class
    paths), after every ``_target_`` in it was allowed. With ``resolve`` (before building
    objects from it) each path is also imported and must name a project class where it is
    defined (``stored_object``)."""
    config = migrate(config)
    _walk(config, place, where, resolve)
    return config


def stored_object(target: str, place: str, where: Any = "stored config") -> Any:
    """The class (or ``model`` builder) an allowed stored path names; UntrustedConfig when the
    path is not allowed or does not name a project object where it is defined; ImportError or
    AttributeError (from Hydra) when it names nothing."""
    from hydra.utils import get_object

    check_target(target, place, where)
    obj = get_object(target)
    _, kinds = ALLOWED_TARGETS[place]
    kind = "class" if inspect.isclass(obj) else "function" if inspect.isfunction(obj) else "other"
    if kind not in kinds:
        raise _refuse(where, place, target, f"a {kind}, not a {' or '.join(kinds)}")
    if f"{obj.__module__}.{obj.__qualname__}" != target:
        raise _refuse(where, place, target, f"which is {obj.__module__}.{obj.__qualname__}, "
                      "defined elsewhere")
    return obj


def data_only(config: Any, where: Any, place: str = "") -> None:
    """UntrustedConfig when a stored value could be more than data: a string holding an
    interpolation (``${...}``: it is never resolved, nor shown resolved) or a key that is not
    a string."""
    if isinstance(config, Mapping):
        for key, value in config.items():
            if not isinstance(key, str):
                raise UntrustedConfig(f"{where}: stored config has a key {str(key)[:40]!r} that is not "
                                      "a string; refusing to load it (results folders are data)")
            data_only(value, where, f"{place}.{key}" if place else key)
    elif isinstance(config, list):
        for i, value in enumerate(config):
            data_only(value, where, f"{place}[{i}]")
    elif isinstance(config, str) and "${" in config:
        raise UntrustedConfig(
            f"{where}: stored config holds an interpolation at {place} ({config[:60]!r}, never "
            "resolved); refusing to load it (results folders are data: nothing in them is resolved)")

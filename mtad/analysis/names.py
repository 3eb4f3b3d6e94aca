"""A point's names as the tables and the claims report show them: config-group names.

A point folder stores the config-group choices it was composed with (``point.json``:
``decoder: tree_mtad``, ``task: humaneval``, ``model: qwen_coder_offline``), and those are its
names. A folder written without them (a single run of another entry point, an old layout) is
named from its stored config the same way, so ``mtad.analysis.render`` and
``mtad.analysis.claims`` agree: the decoder config's ``name`` (``bild_sampling`` sets one), else
the ``name`` of its class, which is its config-group name (``TreeMTAD.name == "tree_mtad"``);
the task's and the model pair's ``name`` fields; last, what the summary says (``decoder``,
``task``, ``model.pair``: the names the run gave them). A name is text: one stored as a number, a
list or a mapping is shown as its JSON text (each output escapes names for its format:
``mtad.core.escape``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _as_name(value: Any) -> str | None:
    """A stored name as text (None when absent or empty)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def decoder_name(choices: Mapping[str, Any], config: Mapping[str, Any],
                 summary: Mapping[str, Any] | None = None) -> str | None:
    """The decoder's config-group name: the stored choice, else from the resolved config."""
    if choices.get("decoder"):
        return _as_name(choices["decoder"])
    decoder = config.get("decoder") or {}
    if decoder.get("name"):
        return _as_name(decoder["name"])
    target = str(decoder.get("_target_") or "")
    if not target:
        return _as_name((summary or {}).get("decoder"))
    from mtad.run.results.described import registry

    name = None
    # only a class the project's decoder configs name is looked up (conf/decoder/*.yaml): a
    # stored path is never imported for its own sake
    if any(member.get("_target_") == target for member in registry("decoder").values()):
        from hydra.utils import get_class

        try:
            name = getattr(get_class(target), "name", None)
        except (ImportError, AttributeError):  # a class that no longer exists: its module's name
            name = None
    if isinstance(name, str) and name:
        return name
    parts = target.split(".")
    return parts[-2] if len(parts) >= 3 else target


def task_name(choices: Mapping[str, Any], config: Mapping[str, Any],
              summary: Mapping[str, Any] | None = None) -> str | None:
    """The task's config-group name: the stored choice, else the resolved task's ``name``."""
    return _as_name(choices.get("task") or (config.get("task") or {}).get("name")
                    or (summary or {}).get("task"))


def pair_name(choices: Mapping[str, Any], config: Mapping[str, Any],
              summary: Mapping[str, Any] | None = None) -> str | None:
    """The model pair's config-group name: the stored choice, else the resolved pair's ``name``."""
    return _as_name(choices.get("model") or (config.get("model") or {}).get("name")
                    or ((summary or {}).get("model") or {}).get("pair"))

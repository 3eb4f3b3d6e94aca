"""A point's identity: what changes the generated tokens, and nothing else.

``identity(cfg)`` keeps, from a composed (or stored, resolved) run config:
- ``decoder``: the decoder's resolved config (``_target_``, its own fields and the values of
  the top-level knobs it interpolates, e.g. ``gamma: ${gamma}``; a knob it does not use is
  absent), and ``decoder_version``, the decoder class's ``version`` string (bumped whenever
  its behaviour changes, so a changed decoder is never served from an old result);
- ``model``: the full pair config (ids, dtype, kernels, ...), not just its name, without the
  size of its cluster job (``cpus``, ``mem_gb``);
- ``task``: the task config without ``scorer`` (scores carry their scorer and version per
  record) and without ``limit``;
- ``sampling`` (temperature, top_k, top_p), ``seed``, ``max_new_tokens``;
- ``draw_version`` (only where draws are made by inverse CDF: ``mtad.core.warping.Warping.scheme``,
  the default at temperature > 0 without top-k, or ``draws: inverse_cdf``): ``draw_version``,
  ``DRAW_VERSION`` followed by ``+`` and the name of the decoder's proposer's own inverse-CDF
  draws where that proposer declares some (``cdf_draws``: beam sampling with replacement draws
  ``slot_then_row``), so exactly the settings such draws touch carry their name.
  Absent for the exponential race, the scheme of every record written before the inverse CDF
  (and of greedy and top-k settings, every committed sweep's), so their identities are unchanged;
  ``draws: race`` at plain temperature or top-p alone names a point of those records;
- ``cost_prior`` (only when a decoder knob is ``auto``): the sha256 of the cost-model prior
  file ``gamma=auto`` loads (``mtad.autotune.costmodel.prior_path``), None when there is none.

The stop set is in it through ``model.eos_token_ids`` (end-of-sequence ids added to the
tokenizer's) and ``task.stop`` (stop sequences): both change where generations end. Each
enters only when non-empty, so a point that cannot stop early keeps the hash it had before
stop sets existed. ``without_stop`` drops both, to find a point stored under another stop set
(``mtad.run.sweep.adopt``).

Not in it: the number of examples (``limit``, ``task.limit``: tasks return a prefix of a
fixed list and every example has its own seed, ``seed + 1000 * index + turn``, so a point
run on 50 examples extends the same point run on 30), output paths, logger, warm-up, resume,
perplexity, the sweep block. A new config key that changes the tokens must be added here.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

HASH_LEN = 12
#: the identity's ``draw_version`` of a point drawn by inverse CDF (the race: absent, version 1)
DRAW_VERSION = "2"
SAMPLING = ("temperature", "top_k", "top_p")
#: Task fields that do not change the tokens of an example.
TASK_NOT_IDENTITY = ("scorer", "limit")
#: Model pair fields that do not change the tokens: the size of a cluster job (CPUs, host memory).
MODEL_NOT_IDENTITY = ("cpus", "mem_gb")
#: Where the stop set lives in an identity: (section, key), each left out when empty.
STOP_KEYS = (("model", "eos_token_ids"), ("task", "stop"))
#: The version every decoder had before decoders carried one (records written until then).
LEGACY_DECODER_VERSION = "1"
#: Class paths that moved (old -> new). A stored config (``config.json``, a summary's
#: ``config``) keeps the path it was written with; ``migrate`` rewrites it wherever a stored
#: config is instantiated or compared. Only paths outside the identity may move: the ``_target_``
#: of a decoder, model or task is part of committed identities and stays valid where it is.
MOVED_TARGETS = {
    "mtad.tracking.NullLogger": "mtad.run.tracking.NullLogger",
    "mtad.tracking.WandbLogger": "mtad.run.tracking.WandbLogger",
}


def _node(cfg: Any, key: str) -> Any:
    """``cfg[key]`` as plain resolved data (a DictConfig node is resolved against its root)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    value = cfg[key]
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _canonical(value: Any) -> Any:
    """Integral floats as ints (``temperature: 1`` == ``1.0``), tuples as lists, keys as str."""
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def migrate(config: Any) -> Any:
    """A copy of a stored config with every ``_target_`` that moved (``MOVED_TARGETS``) under its
    new path; everything else as it was (plain dicts and lists; other values untouched)."""
    if isinstance(config, Mapping):
        return {k: (MOVED_TARGETS.get(v, v) if k == "_target_" and isinstance(v, str) else migrate(v))
                for k, v in config.items()}
    if isinstance(config, list):
        return [migrate(v) for v in config]
    return config


def decoder_version(target: str) -> str:
    """The ``version`` string of the decoder class named by ``target``."""
    from hydra.utils import get_class

    cls = get_class(target)
    version = getattr(cls, "version", None)
    if not isinstance(version, str) or not version:
        raise ValueError(
            f"decoder class {target} declares no version; add `version = \"1\"` to the class "
            "(and bump it whenever its behaviour changes)"
        )
    return version


def identity(cfg: Any, version: str | None = None) -> dict[str, Any]:
    """The identity of the point ``cfg`` runs (a DictConfig, or a stored resolved dict).

    ``version`` overrides the decoder class's version (legacy folders: ``LEGACY_DECODER_VERSION``).
    """
    decoder = dict(_node(cfg, "decoder"))
    task = {k: v for k, v in dict(_node(cfg, "task")).items() if k not in TASK_NOT_IDENTITY}
    model = _node(cfg, "model")
    if isinstance(model, dict):
        model = {k: v for k, v in model.items() if k not in MODEL_NOT_IDENTITY}
    parts = {"model": model, "task": task}
    for section, key in STOP_KEYS:  # an empty stop set is left out: the hash stays as it was
        if isinstance(parts[section], dict) and not parts[section].get(key, True):
            parts[section] = {k: v for k, v in parts[section].items() if k != key}
    task = parts["task"]
    ident = {
        "decoder": decoder,
        "decoder_version": version or decoder_version(decoder["_target_"]),
        "model": parts["model"],
        "task": task,
        "sampling": {k: _node(cfg, k) for k in SAMPLING},
        "seed": _node(cfg, "seed"),
        "max_new_tokens": _node(cfg, "max_new_tokens"),
    }
    if _draw_scheme(cfg) == "inverse_cdf":  # absent for the race: older identities stay as they were
        ident["draw_version"] = draw_version(decoder)
    if "auto" in decoder.values():  # the shapes depend on the prior it loads
        from mtad.autotune.costmodel import file_sha, prior_path

        ident["cost_prior"] = file_sha(prior_path())
    return _canonical(ident)


def draw_version(decoder: Mapping[str, Any]) -> str:
    """The ``draw_version`` of a point of ``decoder`` (its resolved config) drawn by inverse CDF:
    ``DRAW_VERSION``, and after a ``+`` each name its proposer, then its verifier, gives what it
    does in its own way under the inverse CDF (``mtad.decoders.compose.Piece.cdf_draws``) where
    it has some, e.g. ``2+slot_then_row`` (beam sampling's draws), ``2+spectr_rho_select``
    (SpecTr's rho found by selection)."""
    from hydra.utils import get_class

    from mtad.decoders.compose import PROPOSERS, VERIFIERS

    target = decoder["_target_"]
    try:  # a stored config's paths were checked by its reader (``mtad.run.results.targets``) first
        cls = get_class(target)
    except Exception as e:  # ImportError, AttributeError, or not a class: one line, a ValueError
        raise ValueError(f"decoder._target_ {str(target)[:200]!r} names no decoder class "
                         f"({type(e).__name__}); name a class under mtad.decoders") from None
    pieces = getattr(cls, "pieces", None)  # a composition's (proposer, verifier)
    proposer, verifier = pieces(decoder) if callable(pieces) else (None, None)
    own = [reg[name].cdf_draws(decoder) if isinstance(name, str) and name in reg else None
           for reg, name in ((PROPOSERS, proposer), (VERIFIERS, verifier))]
    return "+".join([DRAW_VERSION, *(x for x in own if x)])


def _draw_scheme(cfg: Any) -> str:
    """The draw scheme of a point's settings (``mtad.core.warping.Warping.scheme``)."""
    from mtad.core.warping import DRAW_SCHEMES, default_draws

    draws = _node(cfg, "draws") if "draws" in cfg else None
    if draws is not None and draws not in DRAW_SCHEMES:
        raise ValueError(f"draws must be one of {', '.join(DRAW_SCHEMES)} (or unset), got {draws!r}")
    return draws or default_draws(float(_node(cfg, "temperature")), int(_node(cfg, "top_k")))


def without_stop(ident: Mapping[str, Any]) -> dict[str, Any]:
    """``ident`` without its stop set (``STOP_KEYS``)."""
    out = dict(ident)
    for section, key in STOP_KEYS:
        if isinstance(out.get(section), Mapping):
            out[section] = {k: v for k, v in out[section].items() if k != key}
    return out


def stop_set(ident: Mapping[str, Any]) -> dict[str, list]:
    """The stop set an identity names: ``{"eos_token_ids": [...], "stop": [...]}``."""
    return {key: list((ident.get(section) or {}).get(key) or []) for section, key in STOP_KEYS}


def identity_hash(ident: Mapping[str, Any]) -> str:
    blob = json.dumps(ident, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:HASH_LEN]


def requested_limit(cfg: Any) -> int | None:
    """How many examples a run asks for: the smaller of ``limit`` and ``task.limit`` (None: all)."""
    limits = [_node(cfg, "limit") if "limit" in cfg else None]
    task = cfg["task"] if "task" in cfg else None
    if task is not None and "limit" in task:
        limits.append(_node(task, "limit"))
    limits = [int(v) for v in limits if v is not None]
    return min(limits) if limits else None


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, Mapping):
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def differences(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """``key: stored -> wanted`` for every dotted key whose value differs."""
    a, b = _flat(stored), _flat(wanted)
    missing = object()
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k, missing), b.get(k, missing)
        if va != vb:
            show = lambda v: "(absent)" if v is missing else json.dumps(v, default=str)  # noqa: E731
            out.append(f"{k}: {show(va)} -> {show(vb)}")
    return out

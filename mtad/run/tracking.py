"""Experiment tracking behind a ``logger`` config group: ``none`` (default) or ``wandb``.

One W&B run per evaluated point (``run.py`` or a sweep point):

- group: the sweep's name (``sweep.name``), else Hydra's multirun directory, else ``logger.group``;
- name: the decoder, the knobs that vary, the task: ``tree_mtad g6 t0.3 humaneval``. In a
  sweep the knobs are those taking several values across its points (``sweep.json``); in a
  Hydra multirun the job's overrides; in a single run the decoder's own knobs;
- tags: ``pair:<pair>``, ``task:<task>``, ``decoder:<decoder>``;
- summary: flat keys (``flat_summary``): ``decoder``, ``pair``, ``task``, ``lossless``,
  ``ppl``, ``tokens_per_s``, ``block_efficiency``, ``score`` with ``<key>_ci_low`` /
  ``<key>_ci_high`` where the run has an interval, ``accept_depth_<d>``, and the other
  scalar metrics under their own names.

``read_offline_run`` reads a run back from its offline ``.wandb`` file (no account, no
network). This module knows the layout of run summaries, not how they are computed.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
from pathlib import Path
from typing import Any

from mtad.core.io import read_json
from mtad.run.config import KNOBS

#: Short names of knobs in run names (``g6 t0.3``); other knobs appear as ``key=value``.
KNOB_ABBREV = {
    "gamma": "g",
    "tau": "t",
    "width": "w",
    "temperature": "T",
    "top_k": "k",
    "top_p": "p",
    "max_new_tokens": "n",
    "seed": "s",
}
#: Top-level knobs that only some decoders use (the decoder YAMLs interpolate them): the
#: shared knobs of ``mtad.core.knobs``, as the run config's schema lists them.
DECODER_KNOBS = KNOBS
#: Config groups: named by the run's labels, not as knobs.
GROUP_KEYS = ("model", "decoder", "task", "logger")
#: Summary metrics renamed in the flat summary (others keep their names).
RENAMED = {"perplexity": "ppl"}


class NullLogger:
    """Logs nothing."""

    def start(self, config: dict, name: str | None = None, labels: dict | None = None) -> None:
        pass

    def log_example(self, record: dict) -> None:
        pass

    def log_summary(self, summary: dict) -> None:
        pass

    def log_table(self, name: str, dataframe) -> None:
        pass

    def log_image(self, name: str, path: str) -> None:
        pass

    def log_scatter(self, name: str, dataframe, x: str, y: str, title: str) -> None:
        pass

    def finish(self) -> None:
        pass


# ----------------------------------------------------------------------------- run identity


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _knob(key: str, value: Any) -> str:
    return f"{KNOB_ABBREV[key]}{_fmt(value)}" if key in KNOB_ABBREV else f"{key}={_fmt(value)}"


def _parse_override(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def _sweep_varying(output_dir: Path) -> dict[str, str] | None:
    """This point's values of the keys that take several values in its sweep, else None."""
    point, index = output_dir / "point.json", output_dir.parent / "sweep.json"
    if not (point.is_file() and index.is_file()):
        return None
    values: dict[str, set[str]] = {}
    for row in (read_json(index) or {}).get("points", []):
        for o in row.get("overrides", []):
            k, v = _parse_override(o)
            values.setdefault(k, set()).add(v)
    mine = dict(_parse_override(o) for o in (read_json(point) or {}).get("overrides", []))
    return {k: v for k, v in mine.items() if len(values.get(k, ())) > 1}


def _is_sweep(value: str) -> bool:
    """A Hydra override value that expands to several jobs: ``a,b``, ``range(...)``, ``choice(...)``."""
    value = str(value).strip()
    if re.match(r"(range|choice|glob|interval|shuffle|sort)\(", value):
        return True
    return not value.startswith(("[", "{", "'", '"')) and "," in value


def _hydra_multirun() -> tuple[dict[str, str], str] | None:
    """(this job's values of the swept keys, the multirun directory) inside a Hydra multirun, else None.

    The swept keys are read from the multirun's ``multirun.yaml`` (the command line as given,
    and ``hydra.sweeper.params``); without that file every override of the job counts.
    """
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        from omegaconf import OmegaConf
    except ImportError:
        return None
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return None
    job = dict(_parse_override(o) for o in hc.overrides.task if not o.startswith("hydra"))
    saved = Path(str(hc.sweep.dir)) / "multirun.yaml"
    if saved.is_file():
        h = OmegaConf.load(saved).hydra
        given = [_parse_override(o) for o in h.overrides.task]
        given += [(str(k), str(v)) for k, v in (h.sweeper.get("params") or {}).items()]
        swept = {k for k, v in given if _is_sweep(v)}
        job = {k: v for k, v in job.items() if k in swept}
    return job, str(hc.sweep.dir)


def run_identity(config: dict, labels: dict | None = None) -> dict[str, Any]:
    """``{"name", "group", "tags"}`` of a run from its resolved config and labels.

    ``labels``: ``decoder``, ``task``, ``pair`` names (what the run loaded).
    """
    labels = dict(labels or {})
    decoder_cfg = config.get("decoder") or {}
    sweep = config.get("sweep") if isinstance(config.get("sweep"), dict) else {}
    output_dir = config.get("output_dir")
    varying = _sweep_varying(Path(output_dir)) if output_dir else None
    group = sweep.get("name")
    if varying is None and (multirun := _hydra_multirun()) is not None:
        varying, sweep_dir = multirun
        group = group or "multirun " + "/".join(Path(sweep_dir).parts[-2:])
    if varying is None:  # a single run: the decoder's own knobs
        varying = {k: config[k] for k in KNOB_ABBREV if k in DECODER_KNOBS and k in decoder_cfg}
    knobs = [
        _knob(k, v)
        for k, v in varying.items()
        if k not in GROUP_KEYS
        and not k.startswith(("sweep", "logger", "hydra"))
        and not (k in DECODER_KNOBS and k not in decoder_cfg)  # a knob this decoder does not use
    ]
    parts = [labels.get("decoder")] + knobs + [labels.get("task")]
    if "model" in varying:
        parts.append(labels.get("pair"))
    tags = [f"{k}:{labels[k]}" for k in ("pair", "task", "decoder") if labels.get(k)]
    return {
        "name": " ".join(str(p) for p in parts if p) or None,
        "group": group,
        "tags": tags,
    }


# ----------------------------------------------------------------------------- summary


def _interval(flat: dict, key: str, ci: Any) -> None:
    if isinstance(ci, (list, tuple)) and len(ci) == 2:
        flat[f"{key}_ci_low"], flat[f"{key}_ci_high"] = ci


def flat_summary(summary: dict) -> dict[str, Any]:
    """Flat W&B summary keys from a run's ``summary.json`` content (see the module docstring).

    A bare metrics dict (no ``metrics`` key) is read as the metrics.
    """
    metrics = summary.get("metrics", summary) or {}
    model = summary.get("model") or {}
    flat: dict[str, Any] = {
        k: v
        for k, v in (
            ("decoder", summary.get("decoder")),
            ("pair", model.get("pair")),
            ("task", summary.get("task")),
            ("lossless", summary.get("lossless")),
            ("energy_source", summary.get("energy_source")),
        )
        if v is not None
    }
    if summary.get("energy_devices"):
        flat["energy_devices"] = ",".join(summary["energy_devices"])
    for k, v in metrics.items():
        if k.endswith("_ci"):
            _interval(flat, RENAMED.get(k[:-3], k[:-3]), v)
        elif k == "per_depth_acceptance":
            for d, a in enumerate(v or [], start=1):
                flat[f"accept_depth_{d}"] = a
        elif isinstance(v, (int, float, str, bool)):
            flat[RENAMED.get(k, k)] = v
    score = summary.get("score")
    if isinstance(score, dict):
        flat["score"] = score.get("value")
        _interval(flat, "score", score.get("ci"))
        for k in ("stderr", "n", "metric"):
            if score.get(k) is not None:
                flat[f"score_{k}"] = score[k]
    elif isinstance(score, (int, float)):
        flat["score"] = score
    return flat


# ----------------------------------------------------------------------------- W&B


class WandbLogger(NullLogger):
    """Weights & Biases: online when an API key is set, offline mode otherwise."""

    def __init__(
        self,
        project: str = "mtad",
        entity: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        mode: str | None = None,
        dir: str | None = None,
    ):
        """``dir``: where the ``wandb/`` folder goes (default ``$WANDB_DIR``, else the working directory)."""
        self.project, self.entity, self.group, self.tags = project, entity, group, list(tags or [])
        self.dir = dir
        self.mode = mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self._run: Any = None

    def start(self, config: dict, name: str | None = None, labels: dict | None = None) -> None:
        """Open a run; name, group and tags come from ``run_identity`` unless given."""
        import wandb

        ident = run_identity(config, labels)
        self._run = wandb.init(
            project=self.project,
            entity=self.entity,
            group=self.group or ident["group"],
            tags=self.tags + [t for t in ident["tags"] if t not in self.tags],
            mode=self.mode,
            dir=self.dir,
            config=config,
            name=name or ident["name"],
            reinit="create_new",  # a new run each time; other open runs untouched
        )

    def log_example(self, record: dict) -> None:
        if self._run is not None:
            keys = (
                "new_tokens",
                "steps",
                "wall_time",
                "block_efficiency",
                "tokens_per_s",
                "perplexity",
                "score",
            )
            self._run.log({f"example/{k}": record[k] for k in keys if record.get(k) is not None})

    def log_summary(self, summary: dict) -> None:
        if self._run is not None:
            self._run.summary.update(flat_summary(summary))

    def log_table(self, name: str, dataframe) -> None:
        if self._run is not None:
            import wandb

            self._run.log({name: wandb.Table(dataframe=dataframe)})

    def log_image(self, name: str, path: str) -> None:
        if self._run is not None:
            import wandb

            self._run.log({name: wandb.Image(path)})

    def log_scatter(self, name: str, dataframe, x: str, y: str, title: str) -> None:
        """A W&B scatter chart (``wandb.plot.scatter``) of two columns of ``dataframe``."""
        if self._run is not None:
            import wandb

            table = wandb.Table(dataframe=dataframe)
            self._run.log({name: wandb.plot.scatter(table, x, y, title=title)})

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


# ----------------------------------------------------------------------------- offline runs

_BLOCK, _HEADER = 32768, 7  # the .wandb file is a LevelDB-style log: 32 KiB blocks, 7-byte headers
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _log_records(path: Path):
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # block trailer
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0 or pos + _HEADER + length > len(data):
            return  # the writer has not flushed this record yet (zero padding or a cut chunk)
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk


def _set_nested(d: dict, keys: list[str], value: Any) -> None:
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = value


def read_offline_run(run_dir: str | Path) -> dict[str, Any]:
    """A run logged in offline mode (``wandb/offline-run-*``).

    Returns name, group, tags, config, summary, history, and ``complete``: whether the run's
    exit record is in the file (W&B's writer process may still be flushing a just-finished run).
    A last record that does not parse is one the writer is still flushing: reading stops there
    with ``complete`` False (``offline_runs`` reads again); an unparsable record before the last
    one raises.
    """
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    run_dir = Path(run_dir)
    files = sorted(run_dir.glob("run-*.wandb"))
    if not files:
        raise FileNotFoundError(f"no run-*.wandb file in {run_dir}")
    out: dict[str, Any] = {
        "name": None,
        "group": None,
        "tags": [],
        "config": {},
        "summary": {},
        "history": [],
        "complete": False,
    }
    records = list(_log_records(files[0]))
    for i, raw in enumerate(records):
        rec = pb.Record()
        try:
            rec.ParseFromString(raw)
        except DecodeError:
            if i == len(records) - 1:
                break  # the last record, still being written
            raise
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out.update(name=rec.run.display_name, group=rec.run.run_group, tags=list(rec.run.tags))
            for item in rec.run.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "summary":
            for item in rec.summary.update:
                keys = list(item.nested_key) or [item.key]
                _set_nested(out["summary"], keys, json.loads(item.value_json))
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in rec.history.item:
                _set_nested(row, list(item.nested_key) or [item.key], json.loads(item.value_json))
            out["history"].append(row)
        elif kind == "exit":
            out["complete"] = True
    return out


def offline_runs(wandb_dir: str | Path, wait_s: float = 30.0) -> list[dict[str, Any]]:
    """Every offline run under ``wandb_dir`` (its ``wandb/offline-run-*`` folders), oldest first.

    Waits up to ``wait_s`` seconds for runs whose files are still being written.
    """
    root = Path(wandb_dir)
    root = root / "wandb" if (root / "wandb").is_dir() else root
    deadline = time.monotonic() + wait_s
    while True:
        runs = [read_offline_run(d) for d in sorted(root.glob("offline-run-*"))]
        if all(r["complete"] for r in runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)

"""Command-line checks that run before Hydra: unknown config names get a "did you mean"."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def check_overrides(argv: list[str], conf_dir: Path = CONF_DIR) -> None:
    """Exit with a clear message when an override names an unknown decoder/model/task/logger/experiment."""
    for arg in argv:
        if "=" not in arg or arg.startswith("hydra"):
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith("override "):
            key = key.split(" ", 1)[1]
        if not (conf_dir / key).is_dir():
            continue
        options = group_options(key, conf_dir)
        for v in value.split(","):  # sweeps: decoder=spd,mtad
            if v and v not in options:
                near = difflib.get_close_matches(v, options, n=3, cutoff=0.5)
                hint = f" Did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
                print(f"error: unknown {key} {v!r}.{hint} Available {key}s: {', '.join(options)}",
                      file=sys.stderr)
                sys.exit(2)


def compose_config(overrides: list[str] = (), conf_dir: Path = CONF_DIR, drop: tuple[str, ...] = ()):
    """Compose ``conf/config.yaml`` outside a Hydra run (tests, notebooks, benchmarks).

    ``drop`` removes config groups from the defaults list (e.g. ``("task",)``).
    """
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        return compose("config", overrides=[f"~{g}" for g in drop] + list(overrides))


def load_decoder(name: str, **knobs):
    """Instantiate ``conf/decoder/<name>.yaml`` with top-level knobs (gamma, tau, width, ...)."""
    from hydra.utils import instantiate

    cfg = compose_config([f"decoder={name}"] + [f"{k}={v}" for k, v in knobs.items()],
                         drop=("task", "model", "logger"))
    return instantiate(cfg.decoder)

#!/usr/bin/env python
"""mtad entry point: ``python run.py decoder=tree_mtad gamma=6 tau=0.3 task=humaneval``.

Composes ``conf/config.yaml`` with Hydra and runs one decoder on one task
(``mtad.evaluate.run``) into the run directory (a results folder, ``mtad.results``); with
``-m`` it runs a Hydra multirun. The command line is checked first (``mtad.cli``).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from mtad.cli import check_overrides  # noqa: E402  (also registers the config schema)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    from hydra.core.hydra_config import HydraConfig

    from mtad.evaluate import ConfigError, run
    from mtad.results import FolderBusy, IdentityMismatch

    hc = HydraConfig.get()
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra/") and v}
    try:
        return run(cfg, overrides=list(hc.overrides.task), choices=choices)
    except (ConfigError, IdentityMismatch, FolderBusy) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    check_overrides(sys.argv[1:])
    main()

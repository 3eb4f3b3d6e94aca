#!/usr/bin/env python
"""mtad entry point: ``python run.py decoder=tree_mtad gamma=6 tau=0.3 task=humaneval``.

Composes ``conf/config.yaml`` with Hydra and runs one decoder on one task
(``mtad.evaluate.run``); with ``-m`` it runs a sweep.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from mtad.cli import check_overrides  # noqa: E402


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    from mtad.evaluate import ConfigError, run

    try:
        return run(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    check_overrides(sys.argv[1:])
    main()

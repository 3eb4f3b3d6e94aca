"""``mtad-run`` (and ``python run.py``): one decoder on one task, composed by Hydra.

Composes ``conf/config.yaml`` and runs one point (``mtad.run.evaluate.run``) into the run
directory (a results folder, ``mtad.run.results``); with ``-m`` it runs a Hydra multirun. The
command line is checked first (``mtad.run.cli``: every job composed and checked before the
first runs; Hydra then composes the job it runs).

A refused run (a folder holding another point, busy or not writable) leaves the folder as it
was: Hydra writes nothing into it (``hydra.output_subdir: null``, no log file), and
``.hydra/`` and ``run.log`` are written here once the folder is claimed: never through a link
(a folder whose ``.hydra/`` or ``run.log`` is one is refused before anything is written,
``PointFolder.check_entries``; the files are replaced by rename, the log opened without
following links).
"""

from __future__ import annotations

import logging
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from mtad.core.stack import StackError, require_supported_stack  # noqa: E402
from mtad.run.cli import CONF_DIR, check_overrides  # noqa: E402  (also registers the config schema)


class _RunLog(logging.FileHandler):
    """A log file opened without following a link (``mtad.core.io.open_append``)."""

    def _open(self):
        from mtad.core.io import open_append

        return open_append(self.baseFilename, encoding=self.encoding or "utf-8")


def keep_run_files(folder, cfg: DictConfig, hydra_cfg: DictConfig) -> logging.Handler:
    """What Hydra would have written into the run folder: ``.hydra/{config,hydra,overrides}.yaml``
    and ``run.log`` (the file handler of ``hydra.job_logging``, attached to the root logger and
    returned). Called once the folder is claimed; nothing is written through a link."""
    from mtad.core.io import real_folder, write_text_atomic

    out = real_folder(folder.path / ".hydra")
    for name, node in (("config.yaml", cfg), ("hydra.yaml", OmegaConf.create({"hydra": hydra_cfg})),
                       ("overrides.yaml", hydra_cfg.overrides.task)):
        write_text_atomic(out / name, OmegaConf.to_yaml(node))
    logging_cfg = hydra_cfg.job_logging
    handler = _RunLog(str(logging_cfg.handlers.file.filename))
    handler.setFormatter(logging.Formatter(logging_cfg.formatters.simple.format))
    logging.getLogger().addHandler(handler)
    return handler


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> dict:
    from hydra.core.hydra_config import HydraConfig

    from mtad.run.evaluate import ConfigError, check, run
    from mtad.run.results import (
        BadResultsFile,
        FolderBusy,
        FolderNotWritable,
        IdentityMismatch,
        PointFolder,
    )

    hc = HydraConfig.get()
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra/") and v}
    overrides = list(hc.overrides.task)
    from mtad.run.config import check_scorer
    from mtad.run.sweep.plan import check_task

    try:  # check_overrides checked the command line, with the other jobs of a multirun
        point = check(cfg)  # the config Hydra composed for this job: checked once, passed down
        check_scorer(cfg)  # e.g. HumanEval's bubblewrap: refused before the folder is claimed
        available, reason, _, _ = check_task(cfg)  # its data (task.data_dir, ...): before any folder
        if not available:
            raise ConfigError(f"task {cfg.task.name}: {reason}")
        folder = PointFolder(cfg.output_dir)
        folder.refuse_another(point.identity)  # reads only: a refused folder is left as it was
        with folder.lock(wait=bool(cfg.get("wait_lock", False))):  # re-entered by run()
            folder.claim(point.identity, overrides, choices)
            handler = keep_run_files(folder, cfg, hc)
            try:
                return run(point, overrides=overrides, choices=choices)
            finally:
                logging.getLogger().removeHandler(handler)
                handler.close()
    except (ConfigError, IdentityMismatch, FolderBusy, FolderNotWritable, BadResultsFile, StackError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def cli() -> None:
    """The ``mtad-run`` console script: check the stack and the command line, then let Hydra run it."""
    require_supported_stack()
    check_overrides(sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()

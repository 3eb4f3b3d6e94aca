"""Sweeps that resume: a grid of (model pair, task, decoder, knobs) points, each computed once.

A sweep file (``experiments/*.yaml``) is a Hydra primary config: ``defaults: [config, ...]``
pulls in ``conf/config.yaml``, the file sets the fixed values, a ``sweep:`` block (``name``,
``root``, optional ``profiles``, ``estimate``) and the grid in ``hydra.sweeper.params``
(Hydra's sweep syntax: ``a,b,c``, ``range(2,9)``, ``choice(...)``, ``glob(...)``). The grid is
expanded as Hydra's basic sweeper expands it (first key outermost), so the same file runs:

- ``python -m mtad.run.sweep experiments/table2.yaml --profile cpu [--dry-run] [--wait] [key=value ...]``:
  here, point after point;
- ``python -m mtad.run.sweep experiments/table2.yaml --launcher mtad_slurm [--jobs-per-pair N]``:
  the unfinished points as one Slurm job array per model pair (N jobs at most), each job
  loading its pair once (``mtad.run.sweep.slurm``; other launchers: ``mtad.run.sweep.launcher``);
- ``mtad-sweep hydra -m -cd experiments -cn table2 ...`` (the smoke profile's overrides): a plain Hydra
  multirun whose jobs are single points.

Points are stored by ``mtad.run.results`` (identity, folders, locks, self-check; format in
docs/results.md) under ``<root>/<name>/``; ``sweep.json`` lists the current definition's
points. Modules: ``plan`` (read, expand, compose, check), ``execute`` (run points here),
``launcher`` (Hydra launchers and multiruns), ``slurm`` (Slurm through submitit: job sizes,
checks before submitting, waiting, failures), ``cli`` (the command line). This package knows
nothing about decoders or metrics (``mtad.run.evaluate`` runs a point) nor about tables
(``mtad.analysis.render``).
"""

from mtad.run.sweep.cli import dry_run, estimate, main
from mtad.run.sweep.execute import Report, run, run_point, write_index
from mtad.run.sweep.launcher import hydra_main, launch, pair_job, point_job
from mtad.run.sweep.plan import Composer, Point, Sweep, check_task, load, unknown_names

__all__ = [
    "Composer", "Point", "Report", "Sweep", "check_task", "dry_run", "estimate", "hydra_main",
    "launch", "load", "main", "pair_job", "point_job", "run", "run_point", "unknown_names",
    "write_index",
]

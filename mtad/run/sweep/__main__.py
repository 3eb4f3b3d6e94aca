"""``python -m mtad.run.sweep`` (the ``mtad-sweep`` console script)."""

from mtad.run.sweep.cli import cli

cli()

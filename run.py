#!/usr/bin/env python
"""mtad entry point: ``python run.py decoder=tree_mtad gamma=6 tau=0.3 task=humaneval``.

The same as the ``mtad-run`` console script (``mtad.run.main``): one decoder on one task, with
``-m`` a Hydra multirun.
"""

from mtad.run.main import cli

if __name__ == "__main__":
    cli()

"""``python -m mtad.sweep experiments/<sweep>.yaml [--dry-run] [key=value ...]`` (see mtad.sweep)."""

import sys

from mtad.sweep.cli import main

sys.exit(main())

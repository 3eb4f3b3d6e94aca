"""``mtad-bench NAME [ARGS]``: run a benchmark script of the checkout's ``bench/`` folder.

The benchmarks live beside the package, not in it (they write under ``results/bench/`` and read
the checkout's data); this console script finds them from the checkout this package was
installed from (``pip install -e .``) and runs ``bench/NAME.py`` with ARGS, as
``python bench/NAME.py ARGS`` would. ``mtad-bench`` alone lists them.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

from mtad.core.io import REPO_ROOT


def scripts(root: Path = REPO_ROOT) -> dict[str, Path]:
    folder = root / "bench"
    return {p.stem: p for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    found = scripts()
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0])
        print("benchmarks: " + (", ".join(found) or f"none (no {REPO_ROOT / 'bench'} folder)"))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in found:
        print(f"error: no benchmark {name!r} in {REPO_ROOT / 'bench'}; choose one of: "
              f"{', '.join(found)}", file=sys.stderr)
        return 2
    sys.argv = [str(found[name]), *rest]
    sys.path.insert(0, str(found[name].parent))
    try:
        runpy.run_path(str(found[name]), run_name="__main__")
    except SystemExit as e:  # the script's own exit status
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def cli() -> None:
    """The console script (``[project.scripts]`` in pyproject.toml)."""
    from mtad.core import allocator

    allocator.tune()  # the process's malloc thresholds (mtad.core.allocator); in the provenance
    raise SystemExit(main())


if __name__ == "__main__":
    cli()

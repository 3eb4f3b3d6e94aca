"""Share of a py-spy raw profile's samples inside ``Engine.generate``: the models' forward, and
the rest by the innermost ``mtad/`` source line on the stack (``bench/profile_decoder.py``);
``--functions``: by that line's function.

    python bench/profile_self_time.py /tmp/p.txt [--functions]
"""

from __future__ import annotations

import collections
import re
import sys


def main(path: str, top: int = 25, functions: bool = False) -> None:
    """``functions``: by the innermost ``mtad/`` function instead of its line."""
    where: collections.Counter = collections.Counter()
    total = 0
    for line in open(path):
        stack, n = line.rsplit(" ", 1)
        frames = stack.split(";")
        if not any("generate (mtad/core/engine.py" in f for f in frames):
            continue
        total += int(n)
        if any("module.py" in f and "_call_impl" in f for f in frames):
            where["<model forward>"] += int(n)
            continue
        key = None
        for f in frames:
            if f.split("(")[-1].startswith("mtad/"):
                key = re.sub(r"\(/.*/", "(", f)
                if functions:
                    key = re.sub(r":\d+\)$", ")", key)
        where[key] += int(n)
    print("samples in generate", total)
    for k, v in where.most_common(top):
        print(f"{v / total * 100:5.1f}%  {k}")


if __name__ == "__main__":
    main(sys.argv[1], functions="--functions" in sys.argv[2:])

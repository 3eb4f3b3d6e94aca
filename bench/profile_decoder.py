"""One decoder on the tiny overhead pair (V 32,000, hidden 64; draft random, or equal = a copy of the
target), 3 prompts x 32 tokens, for a sampling profiler:

    py-spy record -r 100 -f raw -o /tmp/p.txt -- python bench/profile_decoder.py tree_mtad sample [random|equal]
    python bench/profile_self_time.py /tmp/p.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import build_pair, make_prompts  # noqa: E402

from mtad.core.engine import Engine  # noqa: E402
from mtad.core.warping import Warping  # noqa: E402
from mtad.run.cli import load_decoder  # noqa: E402

MODES = {"greedy": Warping(0.0), "sample": Warping(1.0, 10, 0.9), "sample_nok": Warping(1.0, 0, 0.9)}


def main(name: str, mode: str, draft: str = "random") -> None:
    torch.set_num_threads(1)
    pair = build_pair(32000, 64, 2, 64, 1, draft)
    knobs = {} if name in ("specinfer", "mcss", "mcns") else {"gamma": 4}
    for i, ids in enumerate(make_prompts(3, 32, 32000)):
        dec = load_decoder(name, **knobs)
        Engine(pair.target, pair.draft, dec, MODES[mode], pair.vocab_size, ()).generate(ids, 32, seed=i)


if __name__ == "__main__":
    main(*sys.argv[1:4])

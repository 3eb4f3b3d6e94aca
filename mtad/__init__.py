"""mtad: multi-token joint decoding (MTAD, tree-MTAD) and speculative-decoding baselines."""

__version__ = "0.1.0"

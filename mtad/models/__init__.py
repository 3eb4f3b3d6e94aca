"""Model pairs (target + draft): offline GGUF pair, hub pairs, tiny random pairs."""

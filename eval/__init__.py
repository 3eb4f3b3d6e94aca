"""Task scorers: one module each, with a fixed interface (see eval/base.py)."""

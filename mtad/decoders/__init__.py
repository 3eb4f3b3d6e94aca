"""Decoders: each one module here plus one YAML under conf/decoder/ (``_target_`` names the class)."""

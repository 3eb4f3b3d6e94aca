"""Decoders: each one module here plus one YAML under conf/decoder/ (``_target_`` names the class).

A speculative decoder is a thin composition (``mtad.decoders.compose``): a proposer
(``mtad.propose``), a verifier (``mtad.verify``) and its knobs; the decoder base
(``mtad.core.decoder.Decoder.step``) owns the near-end clip and ``auto`` shapes. No decoder
imports another decoder module (``compose`` is the shared base, not a decoder of its own
kind beyond ``Speculative``).
"""

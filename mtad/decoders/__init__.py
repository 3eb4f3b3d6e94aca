"""Decoders: each one YAML under conf/decoder/ (``_target_`` names the class).

A decoder with a draft is a composition (``mtad.decoders.compose``) of a registered proposer
(``mtad.propose``) and a registered verifier (``mtad.verify``); its fields are the knobs the
pieces declare (``mtad.core.knobs``). The classes here name their pieces, their version and
their docstring; a class adds logic only where the decoder has some of its own (MJGD/MTJD).
The decoder base (``mtad.core.decoder.Decoder.step``) owns the near-end clip and ``auto``
shapes. No decoder imports another decoder module (``compose`` is the shared base).
"""

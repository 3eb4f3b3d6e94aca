"""Tiny randomly initialised causal LMs built in-process from a config (no download).

Used by the tests and the ``debug`` configs. ``arch`` picks the Hugging Face
architecture so that tree attention and cache handling are exercised on each
family our model configs use (Qwen2, Llama, OPT, GPT-2).
"""

from __future__ import annotations

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ARCHS = ("qwen2", "llama", "opt", "gpt2")


def tiny_causal_lm(
    arch: str = "qwen2",
    vocab_size: int = 99,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "eager",
    logit_scale: float = 1.0,
    max_positions: int = 512,
):
    """A tiny random model of family ``arch``.

    ``logit_scale`` multiplies the output head so that tests can make the model's
    next-token distributions peaked (large) or flat (small).
    """
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    if arch == "qwen2":
        cfg = Qwen2Config(
            hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
            num_attention_heads=num_heads, num_key_value_heads=max(1, num_heads // 2),
            max_position_embeddings=max_positions, tie_word_embeddings=False, **common,
        )
        cls = Qwen2ForCausalLM
    elif arch == "llama":
        cfg = LlamaConfig(
            hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
            num_attention_heads=num_heads, num_key_value_heads=num_heads,
            max_position_embeddings=max_positions, tie_word_embeddings=False, **common,
        )
        cls = LlamaForCausalLM
    elif arch == "opt":
        cfg = OPTConfig(
            hidden_size=hidden_size, ffn_dim=2 * hidden_size, num_hidden_layers=num_layers,
            num_attention_heads=num_heads, word_embed_proj_dim=hidden_size,
            max_position_embeddings=max_positions, **common,
        )
        cls = OPTForCausalLM
    elif arch == "gpt2":
        cfg = GPT2Config(
            n_embd=hidden_size, n_layer=num_layers, n_head=num_heads, n_positions=max_positions,
            **common,
        )
        cls = GPT2LMHeadModel
    else:
        raise ValueError(f"unknown tiny arch {arch!r}; choose one of {ARCHS}")
    cfg._attn_implementation = attn_implementation
    model = cls(cfg)
    model.to(dtype)
    if logit_scale != 1.0:
        head = model.get_output_embeddings()
        with torch.no_grad():
            if getattr(model.config, "tie_word_embeddings", False):
                # untie so that scaling the head does not scale the input embeddings
                head.weight = torch.nn.Parameter(head.weight.detach().clone() * logit_scale)
            else:
                head.weight.mul_(logit_scale)
    model.eval()
    return model


class TinyTokenizer:
    """Byte-free toy tokenizer for tiny models: token i <-> 't{i}'. No chat template."""

    chat_template = None

    def __init__(self, vocab_size: int, eos_token_id: int = 1, bos_token_id: int = 0):
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        self.pad_token_id = bos_token_id
        self.name_or_path = f"tiny-tokenizer-{vocab_size}"

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return {f"t{i}": i for i in range(self.vocab_size)}

    @property
    def all_special_ids(self) -> list[int]:
        return [self.bos_token_id, self.eos_token_id]

    def __call__(self, text: str):
        # deterministic hash of characters into the non-special range
        ids = [2 + (ord(c) % (self.vocab_size - 2)) for c in text] or [2]
        return {"input_ids": ids}

    def token_pieces(self) -> dict[int, bytes]:
        """The text each token adds (``mtad.core.stopping``): `` t{i}``, so ids 5, 7 spell `` t5 t7``
        and ``decode`` gives ``t5 t7``; the stop sequence ``"t5 t7"`` spans two tokens."""
        return {i: f" t{i}".encode() for i in range(self.vocab_size)}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self.all_special_ids]
        return " ".join(f"t{i}" for i in ids)

"""A causal LM with a KV cache that evaluates token trees, one decoding step at a time.

Every decoder talks to both models through this one class, so chains (SpD) and
trees (SpecInfer, tree-MTAD, beam drafts) share the same code path:

* ``begin(committed)`` starts a step. The cache holds a prefix of the committed
  sequence; the committed tokens not yet cached (at least the last one, the
  *endpoint*) are *pending* and are fed with the first forward call of the step.
* ``forward(tokens, parents)`` adds nodes to the step's token tree and returns
  their next-token logits. ``parents[i]`` is ``ROOT`` (-1, the endpoint) or the id
  of a node added earlier in this step (ids count from 0 in the order added).
  Nodes attend to the committed context, to their ancestors and to themselves
  (tree attention: a 4-D additive mask, ``position_ids = endpoint position + depth``).
* ``root_logits`` are the logits at the endpoint (the first new token's distribution).
* ``end(committed)`` keeps, in the cache, the longest path of fed nodes that
  matches the newly committed tokens (``index_select`` on the sequence axis of
  every layer's keys and values; a crop when the path is a prefix) and drops
  every other branch. Nodes with equal tokens under the same parent have equal
  keys and values, so any matching node can be kept.

The runner knows nothing about sampling or acceptance rules: token ids in,
logits out. Batch size is 1. Forward wall time is accumulated in
``forward_time`` (device-synchronised) so the engine can report the harness's
overhead separately from model time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from transformers import DynamicCache

ROOT = -1

_UNSUPPORTED_ATTN = ("flash_attention_2", "flash_attention_3", "flex_attention")


def check_attention_implementation(model) -> None:
    """Refuse attention kernels that ignore a custom 4-D mask (tree attention needs one)."""
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl in _UNSUPPORTED_ATTN:
        raise ValueError(
            f"attn_implementation={impl!r} ignores custom 4-D attention masks, which tree "
            "attention and cache rollback rely on; set the model config's attn_implementation "
            "to 'sdpa' or 'eager'"
        )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def keep_cache_positions(cache: DynamicCache, keep: torch.Tensor | int) -> None:
    """Keep only the given sequence positions of every layer (int = crop to that length)."""
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        if isinstance(keep, int):
            layer.keys = layer.keys[..., :keep, :]
            layer.values = layer.values[..., :keep, :]
        else:
            idx = keep.to(layer.keys.device)
            layer.keys = layer.keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)


def cache_length(cache: DynamicCache | None) -> int:
    return 0 if cache is None else int(cache.get_seq_length())


class ModelRunner:
    """One model, its KV cache and the current step's token tree."""

    def __init__(self, model, vocab_size: int | None = None, name: str = "model"):
        check_attention_implementation(model)
        self.model = model
        self.name = name
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = vocab_size  # logits are cut to the shared tokenizer's size
        self.forward_time = 0.0
        self.forward_calls = 0
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.cached_ids: list[int] = []  # committed tokens whose keys/values are cached
        self._committed: list[int] = []
        self._pending: list[int] = []
        self._pending_fed = False
        self._root_logits: torch.Tensor | None = None
        self._parents: list[int] = []
        self._tokens: list[int] = []
        self._depth: list[int] = []
        self._anc: list[list[int]] = []  # node -> ancestor node ids (incl. itself)
        self._node_pos0 = 0  # cache position of node 0

    def begin(self, committed: Sequence[int]) -> None:
        """Start a step for the committed sequence (prompt + everything emitted)."""
        committed = list(committed)
        n = len(self.cached_ids)
        if n >= len(committed) or committed[:n] != self.cached_ids:
            # The cache must hold a strict prefix of the committed tokens.
            common = 0
            for a, b in zip(self.cached_ids, committed[:-1]):
                if a != b:
                    break
                common += 1
            keep_cache_positions(self.cache, common)
            self.cached_ids = committed[:common]
        self._committed = committed
        self._pending = committed[len(self.cached_ids) :]
        self._pending_fed = False
        self._root_logits = None
        self._parents, self._tokens, self._depth, self._anc = [], [], [], []

    @property
    def endpoint_position(self) -> int:
        return len(self._committed) - 1

    @property
    def num_nodes(self) -> int:
        return len(self._tokens)

    def depth(self, node: int) -> int:
        return 0 if node == ROOT else self._depth[node]

    # ---------------------------------------------------------------- forward
    @property
    def root_logits(self) -> torch.Tensor:  # [V]
        if not self._pending_fed:
            self.forward([], [])
        return self._root_logits

    @torch.no_grad()
    def forward(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:  # [m, V]
        """Add nodes (token, parent) to the step's tree; return their next-token logits."""
        tokens = [int(t) for t in tokens]
        parents = [int(p) for p in parents]
        if len(tokens) != len(parents):
            raise ValueError("tokens and parents must have the same length")
        past = cache_length(self.cache)
        rows_tok: list[int] = []
        rows_pos: list[int] = []
        n_pend = 0
        if not self._pending_fed:
            n_pend = len(self._pending)
            rows_tok += self._pending
            rows_pos += list(range(len(self.cached_ids), len(self._committed)))
            self._node_pos0 = past + n_pend
        first_new = self.num_nodes
        for t, p in zip(tokens, parents):
            if p != ROOT and not (0 <= p < self.num_nodes):
                raise ValueError(f"parent {p} is not a node of this step (have {self.num_nodes})")
            nid = self.num_nodes
            self._tokens.append(t)
            self._parents.append(p)
            d = 1 if p == ROOT else self._depth[p] + 1
            self._depth.append(d)
            self._anc.append(([] if p == ROOT else self._anc[p]) + [nid])
            rows_tok.append(t)
            rows_pos.append(self.endpoint_position + d)
        q_len = len(rows_tok)
        if q_len == 0:
            return torch.empty(0, self.vocab_size or 0)
        kv_len = past + q_len
        mask = torch.full((q_len, kv_len), torch.finfo(self.dtype).min, dtype=self.dtype)
        # committed context (cached + pending rows) is visible to every row, causally
        ctx_end = past + n_pend if n_pend else self._node_pos0
        mask[:, : min(ctx_end, past)] = 0
        for j in range(n_pend):
            mask[j, : past + j + 1] = 0
        for r in range(n_pend, q_len):
            nid = first_new + (r - n_pend)
            mask[r, :ctx_end] = 0
            for a in self._anc[nid]:
                mask[r, self._node_pos0 + a] = 0
        mask = mask.to(self.device)[None, None]
        input_ids = torch.tensor([rows_tok], device=self.device)
        position_ids = torch.tensor([rows_pos], device=self.device)
        _sync(self.device)
        t0 = time.perf_counter()
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=q_len - n_pend + (1 if n_pend else 0),
        )
        logits = out.logits[0]
        _sync(self.device)
        self.forward_time += time.perf_counter() - t0
        self.forward_calls += 1
        if self.vocab_size is not None:
            logits = logits[:, : self.vocab_size]
        if n_pend:
            self._pending_fed = True
            self.cached_ids = list(self._committed)  # pending rows are now cached
            self._root_logits = logits[0]
            return logits[1:]
        return logits

    def prefill(self, ids: Sequence[int]) -> None:
        """Cache all of ``ids`` but the last token (which stays pending for the first step)."""
        self.reset()
        ids = list(ids)
        if len(ids) > 1:
            self.begin(ids[:-1])
            self.forward([], [])
            self.end(ids[:-1] + [ids[-1]])

    # -------------------------------------------------------------------- end
    def end(self, committed: Sequence[int]) -> None:
        """Keep the cached path matching ``committed`` (minus its last token); drop the rest."""
        committed = list(committed)
        if not self._pending_fed:
            return  # nothing fed this step: the cache is unchanged and still a prefix
        base = len(self._committed)
        target = committed[: len(committed) - 1]
        if target[:base] != self._committed:
            # The committed sequence diverged before the endpoint (should not happen).
            self.begin(committed)
            return
        children: dict[int, list[int]] = {}
        for nid, p in enumerate(self._parents):
            children.setdefault(p, []).append(nid)
        path: list[int] = []
        cur = ROOT
        for tok in target[base:]:
            nxt = next((c for c in children.get(cur, ()) if self._tokens[c] == tok), None)
            if nxt is None:
                break
            path.append(nxt)
            cur = nxt
        n_ctx = self._node_pos0
        if path == list(range(len(path))):
            keep_cache_positions(self.cache, n_ctx + len(path))
        else:
            idx = torch.cat(
                [torch.arange(n_ctx), torch.tensor(path, dtype=torch.long) + n_ctx]
            )
            keep_cache_positions(self.cache, idx)
        self.cached_ids = self._committed + [self._tokens[n] for n in path]
        self._parents, self._tokens, self._depth, self._anc = [], [], [], []

    # ------------------------------------------------------------- utilities
    @torch.no_grad()
    def score(self, ids: Sequence[int]) -> torch.Tensor:  # [len(ids), V]
        """Logits for a whole sequence in one pass without touching the step cache."""
        input_ids = torch.tensor([list(ids)], device=self.device)
        logits = self.model(input_ids=input_ids, use_cache=False).logits[0]
        if self.vocab_size is not None:
            logits = logits[:, : self.vocab_size]
        return logits

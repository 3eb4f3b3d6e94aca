"""A causal LM with a KV cache that evaluates token trees, one decoding step at a time.

Every decoder talks to both models through this one class, so chains (SpD) and
trees (SpecInfer, tree-MTAD, beam drafts) share the same code path:

* ``begin(committed)`` starts a step. The cache holds a prefix of the committed
  sequence; the committed tokens not yet cached (at least the last one, the
  *endpoint*) are *pending* and are fed with the first forward call of the step.
* ``forward(tokens, parents)`` adds nodes to the step's token tree and returns
  their next-token logits. ``parents[i]`` is the row of a node added earlier in this
  step, or ``ROOT`` (row 0, the endpoint); see the convention below.
  Nodes attend to the committed context, to their ancestors and to themselves
  (tree attention: a 4-D additive mask, ``position_ids = endpoint position + depth``).
* ``root_logits`` are the logits at the endpoint (the first new token's distribution).

Token-tree convention (the one used throughout the code base: runners, ``mtad.propose.beam``,
``mtad.verify.multidraft``, ``mtad.propose.tree``, the decoders, studies and tests):
a step's tree is a list of *rows*. Row 0 (``ROOT``) is the root, the committed
endpoint; nodes are rows ``1..N`` numbered in the order added; a node's parent row is
smaller than its own (``parents[r] < r``, ``parents[0] = -1`` where a full row list
is kept). So row ``r``'s next-token distribution is ``p[r]`` of a ``[N+1, V]`` tensor
whose row 0 is the root's, with no offset, and a runner's node ids are these rows.
* ``end(committed)`` keeps, in the cache, the longest path of fed nodes that
  matches the newly committed tokens (the path's entries move into place with one
  ``index_select`` per layer on the sequence axis, the context stays; a crop when the path
  is a prefix) and drops every other branch. Nodes with equal tokens under the same parent
  have equal keys and values, so any matching node can be kept. ``begin`` and ``end``
  cost O(step), not O(context): they read the tokens past the cache and check the last
  ``TAIL_CHECK`` cached ones.

Architectures: every model gets the same inputs (token ids, explicit
``position_ids``, the 4-D mask, the cache by the keyword its ``forward`` names:
``mtad.core.stack``). Qwen2 and Llama feed ``position_ids``
to the rotary embedding; OPT (learned positions, offset 2) and GPT-2 (``wpe``) look
their position embeddings up from ``position_ids`` when given one, and only fall
back to a mask cumsum / cache length without it, which would be wrong for a tree.
So ``position_ids`` are always passed, and models whose ``forward`` takes none
are refused, as are attention kernels that ignore a 4-D mask and caches with
sliding-window (or other non-plain) layers, which cannot be rolled back by
position. A call without tree nodes (prefill, a root-only step) passes no mask at
all: the model builds its own causal mask (sdpa can then use ``is_causal``).

The mask is built on the model's device with a few tensor operations per call: the
committed context is a slice fill, the pending rows a ``triu_``, and every node's ancestor
columns one ``index_fill_`` from ancestor lists kept per node (no per-element writes).
A pass makes one host-to-device copy (``mtad.core.devices.to_device``: pinned, non-blocking
on CUDA) holding its token ids, positions, parent rows and the mask's ancestor cells; the
new nodes' tokens and parents stay on the device (``fed_tokens``, ``fed_parents``) for the
verification rules' gathers.

The runner knows nothing about sampling or acceptance rules: token ids in,
logits out. Batch size is 1. Forward time is accumulated in ``forward_time``
(``mtad.core.devices.ForwardTimer``: CUDA events on one GPU, no synchronisation per pass) so
the engine can report the harness's overhead separately from model time. Inputs go to
the device of the model's first parameters; logits come back on its output head's device
(``devices`` lists every device a spread model uses).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from mtad.core.devices import ForwardTimer, model_devices, to_device
from mtad.core.protocols import ROOT  # noqa: E402  (re-exported: row of the root)
from mtad.core.stack import checked_cache_keyword

#: tokens before the endpoint that ``begin``/``end`` compare with the cache (O(1) checks)
TAIL_CHECK = 32

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


def check_model_supported(model) -> None:
    """Refuse models the tree runner would silently get wrong (see the module docstring)."""
    check_attention_implementation(model)
    name = type(model).__name__
    if "position_ids" not in inspect.signature(model.forward).parameters:
        raise ValueError(
            f"{name}.forward takes no position_ids; tree nodes need explicit positions "
            "(endpoint position + depth), so this architecture is not supported"
        )
    layers = DynamicCache(config=model.config).layers
    odd = sorted({type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer})
    if odd:
        raise ValueError(
            f"{name}'s cache has {', '.join(odd)} layers (sliding-window or chunked attention); "
            "the tree runner needs plain full-attention layers whose keys/values it can "
            "crop and index by position"
        )


def keep_cache_positions(cache: DynamicCache, keep: torch.Tensor | int, start: int = 0) -> None:
    """Keep only the given sequence positions of every layer.

    ``keep`` an int: crop every layer to that length (views, nothing moves). ``keep`` a host
    tensor of ascending positions, all ``>= start``: positions before ``start`` stay where
    they are, and only the entries at ``keep`` move, to positions ``start, start + 1, ...``
    (one ``index_select`` and one write per layer of ``len(keep)`` entries, whatever the
    cache's length); the index crosses to each device once (``to_device``, pinned).
    """
    if isinstance(keep, int):
        for layer in cache.layers:
            if not getattr(layer, "is_initialized", True) or layer.keys is None:
                continue
            layer.keys = layer.keys[..., :keep, :]
            layer.values = layer.values[..., :keep, :]
        return
    n = start + keep.numel()
    on: dict[torch.device, torch.Tensor] = {}  # the index, once per device
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        dev = layer.keys.device
        if dev not in on:
            (on[dev],) = to_device([keep], dev)
        idx = on[dev]
        keys, values = layer.keys.index_select(-2, idx), layer.values.index_select(-2, idx)
        layer.keys = layer.keys[..., :n, :]
        layer.values = layer.values[..., :n, :]
        layer.keys[..., start:n, :] = keys
        layer.values[..., start:n, :] = values


def fed_tensors(
    runner, tokens: Sequence[int], parents: Sequence[int] | None, device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``tokens`` (and ``parents``) as long tensors on ``device``.

    When they are the nodes of ``runner``'s last forward call, the pass's own device copy
    is used (``ModelRunner.fed_tokens`` / ``fed_parents``; no host-to-device copy, at most a
    device-to-device one); otherwise they are copied over once (``to_device``).
    """
    last = getattr(runner, "_fed_host", None)
    tokens, parents = [int(t) for t in tokens], None if parents is None else [int(p) for p in parents]
    if last is not None and last[0] == tokens and (parents is None or last[1] == parents):
        return runner.fed_tokens.to(device), None if parents is None else runner.fed_parents.to(device)
    host = torch.tensor([tokens, parents if parents is not None else tokens], dtype=torch.long)
    (dev,) = to_device([host], device)
    return dev[0], None if parents is None else dev[1]


def cache_length(cache: DynamicCache | None) -> int:
    return 0 if cache is None else int(cache.get_seq_length())


class ModelRunner:
    """One model, its KV cache and the current step's token tree."""

    def __init__(self, model, vocab_size: int | None = None, name: str = "model"):
        check_model_supported(model)
        # the keyword this transformers takes the cache by; range check and cache probe (mtad.core.stack)
        self._cache_kw = checked_cache_keyword(model, ModelRunner)
        self.model = model
        self.name = name
        self.devices = model_devices(model)  # every device it spans (device_map="auto": several)
        self.device = self.devices[0]  # where its inputs go (the embeddings' device)
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = vocab_size  # logits are cut to the shared tokenizer's size
        self._timer = ForwardTimer(self.devices)
        self.forward_calls = 0
        self.reset()

    @property
    def forward_time(self) -> float:
        """Seconds in forward passes so far (``mtad.core.devices.ForwardTimer``: no sync per pass)."""
        return self._timer.seconds

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.cached_ids: list[int] = []  # committed tokens whose keys/values are cached
        self._n_committed = 0  # length of the step's committed sequence
        self._pending: list[int] = []  # its tokens past the cache (fed with the first call)
        self._pending_fed = False
        self._in_step = False
        self._root_logits: torch.Tensor | None = None
        self._clear_tree()

    def _clear_tree(self) -> None:
        # per node, at index row - 1:
        self._parents: list[int] = []  # parent row
        self._tokens: list[int] = []
        self._depth: list[int] = []
        self._anc: list[list[int]] = []  # ancestors' offsets (row - 1), root side first, incl. itself
        self._node_pos0 = 0  # cache position of row 1 (= committed length once pending is fed)
        self.fed_tokens: torch.Tensor | None = None  # [m] the last call's node tokens (input device)
        self.fed_parents: torch.Tensor | None = None  # [m] their parent rows (input device)
        self._fed_host: tuple[list[int], list[int]] | None = None  # the same, on the host

    def begin(self, committed: Sequence[int]) -> None:
        """Start a step for the committed sequence (prompt + everything emitted).

        O(step) when ``committed`` extends what is cached (the engine's case): only its
        tokens past the cache are read, and the last ``TAIL_CHECK`` cached tokens are
        compared with it. A sequence that differs there (or is not longer than the cache)
        is compared whole and the cache cropped to the common prefix. A caller that rewrites
        the sequence further back must start over with ``prefill``.
        """
        n_c = len(committed)
        if not n_c:
            raise ValueError("begin() needs at least one committed token (the endpoint)")
        n = len(self.cached_ids)
        if n >= n_c or not self._tail_matches(committed, n):
            # The cache must hold a strict prefix of the committed tokens.
            committed = [int(t) for t in committed]
            common = 0
            for a, b in zip(self.cached_ids, committed[:-1]):
                if a != b:
                    break
                common += 1
            keep_cache_positions(self.cache, common)
            del self.cached_ids[common:]
        self._n_committed = n_c
        self._pending = [int(t) for t in committed[len(self.cached_ids) :]]
        self._pending_fed = False
        self._in_step = True
        self._root_logits = None
        self._clear_tree()

    def _tail_matches(self, seq: Sequence[int], n: int) -> bool:
        """``seq[n - TAIL_CHECK : n]`` equals the cached ids there (O(1) in the context)."""
        k = max(0, n - TAIL_CHECK)
        return [int(t) for t in seq[k:n]] == self.cached_ids[k:n]

    @property
    def endpoint_position(self) -> int:
        return self._n_committed - 1

    @property
    def num_nodes(self) -> int:
        """Nodes added this step; they are rows ``1..num_nodes``."""
        return len(self._tokens)

    def depth(self, node: int) -> int:
        return 0 if node == ROOT else self._depth[node - 1]

    # ---------------------------------------------------------------- forward
    @property
    def root_logits(self) -> torch.Tensor:  # [V]
        if not self._pending_fed:
            self.forward([], [])
        return self._root_logits

    @torch.no_grad()
    def forward(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:  # [m, V]
        """Add nodes (token, parent) to the step's tree; return their next-token logits."""
        if not self._in_step:
            raise RuntimeError("forward() outside a step: call begin(committed) first")
        tokens = [int(t) for t in tokens]
        parents = [int(p) for p in parents]
        if len(tokens) != len(parents):
            raise ValueError("tokens and parents must have the same length")
        first_new = self.num_nodes
        for i, p in enumerate(parents):  # validate before touching any state
            if not (ROOT <= p <= first_new + i):
                raise ValueError(
                    f"parent {p} of new node {first_new + i + 1} is not the root or a node "
                    f"added before it in this step (rows {ROOT}..{first_new + i})"
                )
        m = len(tokens)
        past = cache_length(self.cache)
        n_pend = 0 if self._pending_fed else len(self._pending)
        if not self._pending_fed:
            self._node_pos0 = past + n_pend
        q_len = n_pend + m
        if q_len == 0:
            width = self.vocab_size or getattr(self.model.config, "vocab_size", 0)
            return torch.empty(0, width, dtype=self.dtype, device=self.devices[-1])

        endpoint = self.endpoint_position
        positions = list(range(len(self.cached_ids), self._n_committed)) if n_pend else []
        for t, p in zip(tokens, parents):
            if p == ROOT:
                d, anc = 1, []
            else:
                d, anc = self._depth[p - 1] + 1, self._anc[p - 1]
            self._anc.append(anc + [len(self._tokens)])
            self._tokens.append(t)
            self._parents.append(p)
            self._depth.append(d)
            positions.append(endpoint + d)
        # One host-to-device copy per pass: ids, positions, parents, the mask's ancestor cells.
        cells = self._ancestor_cells(past, n_pend, first_new) if m else []
        host = torch.tensor((self._pending if n_pend else []) + tokens + positions + parents + cells)
        (dev,) = to_device([host], self.device)
        input_ids, position_ids = dev[None, :q_len], dev[None, q_len : 2 * q_len]
        self.fed_tokens, self.fed_parents = dev[q_len - m : q_len], dev[2 * q_len : 2 * q_len + m]
        self._fed_host = (tokens, parents)
        mask = self._tree_mask(past, n_pend, first_new, dev[2 * q_len + m :]) if m else None

        with self._timer:
            out = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=position_ids,
                **{self._cache_kw: self.cache},
                use_cache=True,
                logits_to_keep=m + (1 if n_pend else 0),
            )
        logits = out.logits[0]
        self.forward_calls += 1
        if self.vocab_size is not None:
            logits = logits[:, : self.vocab_size]
        if n_pend:
            self._pending_fed = True
            self.cached_ids.extend(self._pending)  # pending rows are now cached
            self._root_logits = logits[0]
            return logits[1:]
        return logits

    def _ancestor_cells(self, past: int, n_pend: int, first_new: int) -> list[int]:
        """Flat mask indices of every new node row's ancestors and itself (``_tree_mask``)."""
        kv_len = past + n_pend + self.num_nodes - first_new
        ctx = self._node_pos0
        flat: list[int] = []
        for row, anc in enumerate(self._anc[first_new:], start=n_pend):
            base = row * kv_len + ctx
            flat += [base + a for a in anc]
        return flat

    def _tree_mask(self, past: int, n_pend: int, first_new: int, cells: torch.Tensor) -> torch.Tensor:
        """Additive mask [1, 1, q, past + q] for ``n_pend`` pending rows then the new nodes.

        Built on the model's device. Every row sees the committed context (cache + pending
        rows, causally among the pending rows); a node row also sees its ancestors and
        itself, at cache column ``node_pos0 + tree row - 1``: one ``index_fill_`` on the
        flattened mask at ``cells`` (``_ancestor_cells``, already on the device).
        """
        q_len = n_pend + self.num_nodes - first_new
        kv_len = past + q_len
        ctx = self._node_pos0
        mask = torch.full((q_len, kv_len), torch.finfo(self.dtype).min, dtype=self.dtype,
                          device=self.device)
        if n_pend <= 1:  # (a single pending row, the endpoint, sees exactly the context)
            mask[:, :ctx] = 0
        else:
            mask[:, :past] = 0
            mask[:n_pend, past:ctx].triu_(1)  # pending rows: causal among themselves
            mask[n_pend:, past:ctx] = 0
        mask.view(-1).index_fill_(0, cells, 0)
        return mask[None, None]

    def prefill(self, ids: Sequence[int]) -> None:
        """Cache all of ``ids`` but the last token (which stays pending for the first step)."""
        self.reset()
        ids = [int(t) for t in ids]
        if len(ids) > 1:
            self.begin(ids[:-1])
            self.forward([], [])
            self.end(ids)

    # -------------------------------------------------------------------- end
    def end(self, committed: Sequence[int]) -> None:
        """Keep the cached path matching ``committed`` (minus its last token); drop the rest.

        O(step): the step's new tokens are read, and the last ``TAIL_CHECK`` tokens before
        them compared with the cache; the kept path's entries move (``keep_cache_positions``),
        not the context's.
        """
        self._in_step = False
        if not self._pending_fed:
            return  # nothing fed this step: the cache is unchanged and still a prefix
        base = self._n_committed
        if len(committed) - 1 < base or not self._tail_matches(committed, base):
            # The committed sequence diverged before the endpoint: keep the common prefix.
            self.begin(committed)
            self._in_step = False
            return
        path = self._matching_path([int(t) for t in committed[base : len(committed) - 1]])
        n_ctx = self._node_pos0
        if path == list(range(len(path))):
            keep_cache_positions(self.cache, n_ctx + len(path))
        else:
            keep_cache_positions(self.cache, torch.tensor(path, dtype=torch.long) + n_ctx, start=n_ctx)
        self.cached_ids.extend(self._tokens[n] for n in path)
        self._clear_tree()

    def _matching_path(self, tokens: list[int]) -> list[int]:
        """Offsets (row - 1) of a longest root path whose tokens are a prefix of ``tokens``.

        Siblings may repeat a token (independent drafts): all of them are followed, so a
        match continuing under the second copy is found too. Of the deepest matches the
        lowest id is kept (a prefix of node order when one exists: a crop, no gather).
        """
        children: dict[int, list[int]] = {}
        for row, p in enumerate(self._parents, start=1):
            children.setdefault(p, []).append(row)
        frontier = [ROOT]
        for tok in tokens:
            nxt = [c for n in frontier for c in children.get(n, ()) if self._tokens[c - 1] == tok]
            if not nxt:
                break
            frontier = nxt
        node = min(frontier)
        if node == ROOT:
            return []
        return list(self._anc[node - 1])

    # ------------------------------------------------------------- utilities
    @torch.no_grad()
    def score(self, ids: Sequence[int]) -> torch.Tensor:  # [len(ids), V]
        """Logits for a whole sequence in one pass without touching the step cache."""
        input_ids = torch.tensor([list(ids)], device=self.device)
        logits = self.model(input_ids=input_ids, use_cache=False).logits[0]
        if self.vocab_size is not None:
            logits = logits[:, : self.vocab_size]
        return logits

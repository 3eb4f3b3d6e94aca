"""The top ``m`` entries (``topk_rows``) and the argmax (``argmax_rows``) of long CPU rows, from
block maxima instead of ``torch.topk`` / ``torch.argmax`` over each whole row.

On the CPU, ``torch.topk(rows, m)`` over a vocabulary row (151,936 entries) costs about as
much as a softmax over it and more than twice a max reduction, and the harness takes such a
top-m at every greedy beam depth and at every top-k warping. ``topk_rows`` reads the rows
once with a block-wise max (a vectorised reduction), keeps the ``m`` blocks with the largest
maxima, and takes the top ``m`` of those blocks' entries (plus the tail that does not fill a
block): a few hundred entries per row instead of the vocabulary.

Exact: every block that holds one of a row's top ``m`` values has a maximum at least the
row's ``m``-th largest value, and every other block's maximum is at most that value, so the
``m`` blocks with the largest maxima hold the row's top ``m`` values, and the values returned
equal ``torch.topk``'s, in the same (descending) order. Indices are the same wherever the
values are distinct; among entries tied in value, which indices are returned is unspecified,
as it is for ``torch.topk`` itself. NaN ranks above every number, as in ``torch.topk``.
"""

from __future__ import annotations

import torch

BLOCK = 64  # entries per block: 151,936 = 2,374 x 64
_MIN_BLOCKS_PER_PICK = 8  # below this many blocks per picked entry the plain topk is as cheap
_LONE_ROW_CHUNK = 1024  # a single row takes argmax_rows' block path from 65,536 entries


def _blockwise(rows: torch.Tensor, parts: int, least: int) -> bool:
    """Whether the block form pays: real floating rows on the CPU cut into ``parts >= least``."""
    return (rows.device.type == "cpu" and rows.dim() > 0 and rows.dtype.is_floating_point
            and parts >= least)


def topk_rows(rows: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(rows, m, dim=-1)`` for rows ``[..., V]`` (values descending, then indices).

    Takes the block path on the CPU for rows much longer than ``m`` blocks; elsewhere (an
    accelerator, short rows, a large ``m``) it is ``torch.topk`` itself.
    """
    vocab = rows.shape[-1]
    nb = vocab // BLOCK
    if m <= 0 or not _blockwise(rows, nb, _MIN_BLOCKS_PER_PICK * m):
        return torch.topk(rows, m, dim=-1)
    lead = rows.shape[:-1]
    flat = rows.reshape(-1, vocab)  # a view for contiguous rows
    r = flat.shape[0]
    # block g holds entries g, g + nb, g + 2 nb, ...: the max over them is an elementwise max of
    # BLOCK contiguous slices (vectorised), where contiguous blocks would reduce 64 entries each
    main = flat[:, : nb * BLOCK].reshape(r, BLOCK, nb)
    _, blocks = torch.topk(main.amax(1), m, dim=-1)  # [r, m] the blocks with the largest maxima
    ids = (blocks[:, :, None] + torch.arange(BLOCK) * nb).reshape(r, m * BLOCK)
    tail = vocab - nb * BLOCK
    if tail:
        ids = torch.cat([ids, torch.arange(nb * BLOCK, vocab).expand(r, tail)], dim=1)
    vals, pos = torch.topk(flat.gather(1, ids), m, dim=-1)
    return vals.reshape(*lead, m), ids.gather(1, pos).reshape(*lead, m)


def _first_max(rows: torch.Tensor) -> torch.Tensor:
    """``rows.argmax(-1)`` on the CPU as ``rows.max(-1).indices``: the same answer (the first
    maximum; the first NaN where a row has one: ``torch.max`` and ``torch.argmax`` document the
    same first-index rule, checked in ``tests/core/test_topk.py`` with ties, NaN and
    infinities), from the vectorised max reduction, about 3x cheaper than ``torch.argmax`` on
    this CPU (torch 2.13). Elsewhere ``torch.argmax`` itself."""
    return rows.max(-1).indices if rows.device.type == "cpu" else rows.argmax(-1)


def argmax_rows(rows: torch.Tensor) -> torch.Tensor:
    """``rows.argmax(-1)`` for rows ``[..., V]``: the first index of each row's maximum (the first
    NaN where a row has one), as ``torch.argmax``.

    On the CPU, for several long rows, each row is cut into ``BLOCK`` contiguous chunks: one
    vectorised max per chunk, the first chunk holding the row's maximum (the first maximum of
    the chunk maxima), then the first maximum inside that chunk; entries past the last whole
    chunk are compared after them. Every index before the answer lies in an earlier chunk
    (below the maximum) or earlier in the same chunk, so it is ``torch.argmax``'s answer. Short
    rows, and a single row shorter than ``_LONE_ROW_CHUNK`` chunks, take one max reduction
    (``_first_max``): there the block path's extra calls cost more than they save (measured
    in decoding steps on this CPU: a lone 32,000-token row is cheaper by the max reduction, a
    lone 151,936-token one by the block path). On an accelerator ``torch.argmax``.
    """
    vocab = rows.shape[-1]
    chunk = vocab // BLOCK
    lone = rows.numel() == vocab  # one row: the block path pays only on long ones
    if not _blockwise(rows, chunk, _LONE_ROW_CHUNK if lone else 2 * BLOCK):
        return _first_max(rows)
    lead = rows.shape[:-1]
    flat = rows.reshape(-1, vocab)
    r = flat.shape[0]
    main = flat[:, : chunk * BLOCK].reshape(r, BLOCK, chunk)
    first = _first_max(main.amax(-1))  # [r] the first chunk holding the maximum (NaN: the first NaN)
    inner = _first_max(main[torch.arange(r), first])  # [r] its first maximum
    idx = first * chunk + inner
    if vocab > chunk * BLOCK:  # the tail: after every chunk, so it wins only when strictly larger
        tail = flat[:, chunk * BLOCK:]
        t_idx = _first_max(tail)
        t_val = tail.gather(1, t_idx[:, None])[:, 0]
        m_val = flat.gather(1, idx[:, None])[:, 0]
        later = (t_val > m_val) | (t_val.isnan() & ~m_val.isnan())
        idx = torch.where(later, chunk * BLOCK + t_idx, idx)
    return idx.reshape(lead)

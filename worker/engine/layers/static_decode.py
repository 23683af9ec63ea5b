"""Attention for the static-shape decode step: one query per row over a padded page table, all as tensors.

The reference sdpa backend's decode path with no value read back to the host: each row's pages are
gathered with `index_select` (unpacking an 8-bit cache), keys before the row's new token are kept by a
mask built from a tensor, and the new token's own key and value join as one more column, so one
`scaled_dot_product_attention` covers the batch. The pass does not write the cache: each layer's new keys
and values are kept on the batch (`new_kv`) and the runner writes them after it (a compiled graph that
wrote the cache in place could copy the whole cache). Shapes depend only on the padded batch and table
width, so the step traces whole (torch.compile) and replays as a CUDA graph. With the `triton` backend the
rows read their pages in place instead (triton_paged, through a custom op the compiler leaves whole).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tandem.worker.engine.layers.kv_int8 import pack, read_pages, unpack


@dataclass
class StaticDecodeBatch:
    """Where one padded decode batch's single tokens go and what they read; every field a device tensor."""

    slot_mapping: torch.Tensor  # [B] flat cache slot each row's new token is written to (after the pass)
    table: torch.Tensor  # [B, W] pages of each row's context, padded (any page: masked out)
    context_lens: torch.Tensor  # [B] tokens each row attends to, its new one included (>= 1)
    block_size: int
    backend: str = "sdpa"  # sdpa: gather the pages, then SDPA | triton: read them in place
    new_kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # per layer, for the runner


def as_stored(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """`x` as the cache will give it back: through 8 bits and back for an 8-bit cache (the general path
    reads a decode token's own key from the cache, so it sees the rounded one)."""
    return unpack(pack(x), x.dtype) if cache.dtype == torch.uint8 else x


def static_decode_attention(
    q: torch.Tensor,  # [B, NH, D]
    k_new: torch.Tensor,  # [B, KVH, D]
    v_new: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D], without this step's keys
    v_cache: torch.Tensor,
    batch: StaticDecodeBatch,
    scale: float,
) -> torch.Tensor:  # [B, NH, D]
    """Each row's query over its cached context and its own new key: one SDPA for the batch (or one Triton
    kernel over the pages in place)."""
    if batch.backend == "triton":
        from tandem.worker.engine.layers.triton_paged import paged_decode_op

        k_stored, v_stored = as_stored(k_new, k_cache), as_stored(v_new, v_cache)
        return paged_decode_op(
            q, k_cache, v_cache, batch.table, batch.context_lens - 1, scale, k_stored, v_stored
        )
    b, width = batch.table.shape
    kvh, d = k_new.shape[1], q.shape[2]
    pages = batch.table.reshape(-1)
    length = width * batch.block_size
    ks = read_pages(k_cache, pages, q.dtype).view(b, length, kvh, d)
    vs = read_pages(v_cache, pages, q.dtype).view(b, length, kvh, d)
    ks = torch.cat([ks, as_stored(k_new, k_cache)[:, None]], dim=1).transpose(1, 2)  # [B, KVH, L + 1, D]
    vs = torch.cat([vs, as_stored(v_new, v_cache)[:, None]], dim=1).transpose(1, 2)
    keys = torch.arange(length + 1, device=q.device)
    cached = batch.context_lens[:, None] - 1  # tokens before the new one
    mask = ((keys[None, :] < cached) | (keys[None, :] == length))[:, None, None, :]  # [B, 1, 1, L + 1]
    gqa = q.shape[1] != kvh
    o = F.scaled_dot_product_attention(q[:, :, None, :], ks, vs, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return o[:, :, 0, :]

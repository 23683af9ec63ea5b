"""The 8-bit paged KV cache (`engine.kvCacheDtype: int8`): about twice the sequences in the same memory.

Each token's key (or value) for one head is stored as `head_dim` int8 values followed by its float32
absmax scale, one packed row of `head_dim + 4` bytes, so a layer's pool is a uint8 tensor
[num_blocks, block_size, num_kv_heads, head_dim + 4]. A scale per token and head (the finest
per-block-per-head granularity) keeps writes local: a decode step quantizes only its own token and never
rescales what a block already holds. A block is one tensor of bytes, so the KV transfer moves it as it
is, scales included. Attention unpacks the pages it gathers back to the model's dtype.
"""

from __future__ import annotations

import torch

from tandem.spec_engine import KV_INT8_NEEDS_SDPA
from tandem.worker.kv.layout import KV_CACHE_DTYPES, SCALE_BYTES, is_packed, row_bytes

__all__ = ["KV_INT8_NEEDS_SDPA", "KV_CACHE_DTYPES", "SCALE_BYTES", "is_packed", "pack", "row_bytes", "unpack"]


def pack(x: torch.Tensor) -> torch.Tensor:
    """[..., D] floats -> [..., D + 4] uint8: int8 values rounded against the row's absmax / 127, then the
    scale."""
    x32 = x.float()
    scale = (x32.abs().amax(dim=-1, keepdim=True) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(x32 / scale).clamp_(-127, 127).to(torch.int8)
    return torch.cat([q.view(torch.uint8), scale.view(torch.uint8)], dim=-1)


def unpack(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., D + 4] uint8 -> [..., D] in `dtype`."""
    d = packed.shape[-1] - SCALE_BYTES
    flat = packed.reshape(-1, d + SCALE_BYTES)  # contiguous rows
    q = flat.view(torch.int8)[:, :d]
    # Reinterpret whole rows, then slice: inductor's CUDA lowering cannot take view(dtype) of a column slice
    # made contiguous (a stale stride), which the compiled decode step with this cache would need.
    if d % SCALE_BYTES == 0:
        scale = flat.view(torch.float32)[:, d // SCALE_BYTES :]  # [N, 1]
    else:
        scale = flat[:, d:].contiguous().view(torch.float32)
    return (q.float() * scale).to(dtype).view(*packed.shape[:-1], d)


def write_slots(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """cache slot `slots[i]` = x[i] ([T, KVH, D]); packs into an 8-bit (uint8) pool."""
    if cache.dtype == torch.uint8:
        x = pack(x)
    cache.view(-1, *x.shape[1:]).index_copy_(0, slots, x)


def read_pages(cache: torch.Tensor, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The blocks `blocks` of a pool, [len(blocks), block_size, KVH, D] in `dtype` (unpacked if 8-bit)."""
    pages = cache.index_select(0, blocks)
    return unpack(pages, dtype) if cache.dtype == torch.uint8 else pages

"""Attention for the static-shape decode step: one query per row over a padded page table, all as tensors.

The reference sdpa backend's decode path with no value read back to the host: each row's pages are
gathered with `index_select` (unpacking an 8-bit cache), keys past the row's context length are masked out
from a tensor, and one `scaled_dot_product_attention` covers the batch. Shapes depend only on the padded
batch and table width, so the step traces whole (torch.compile) and replays as a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tandem.worker.engine.kv_int8 import read_pages


@dataclass
class StaticDecodeBatch:
    """Where one padded decode batch's single tokens go and what they read; every field a device tensor."""

    slot_mapping: torch.Tensor  # [B] flat cache slot each row's new token is written to
    table: torch.Tensor  # [B, W] pages of each row's context, padded (any page: masked out)
    context_lens: torch.Tensor  # [B] tokens each row attends to, its new one included (>= 1)
    block_size: int


def static_decode_attention(
    q: torch.Tensor,  # [B, NH, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D], this step's keys already written
    v_cache: torch.Tensor,
    batch: StaticDecodeBatch,
    scale: float,
) -> torch.Tensor:  # [B, NH, D]
    """Each row's query over its context: gathered pages, masked by context length, one SDPA for the batch."""
    b, width = batch.table.shape
    kvh, d = k_cache.shape[2], q.shape[2]
    pages = batch.table.reshape(-1)
    length = width * batch.block_size
    ks = read_pages(k_cache, pages, q.dtype).view(b, length, kvh, d).transpose(1, 2)  # [B, KVH, L, D]
    vs = read_pages(v_cache, pages, q.dtype).view(b, length, kvh, d).transpose(1, 2)
    keys = torch.arange(length, device=q.device)
    mask = (keys[None, :] < batch.context_lens[:, None])[:, None, None, :]  # [B, 1, 1, L]
    gqa = q.shape[1] != kvh
    o = F.scaled_dot_product_attention(q[:, :, None, :], ks, vs, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return o[:, :, 0, :]

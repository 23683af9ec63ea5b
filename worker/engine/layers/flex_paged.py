"""FlexAttention over the paged KV cache in place: a block mask built from the step's page tables.

The per-layer cache [num_blocks, block_size, KVH, D] is viewed, without a copy, as one KV sequence
[1, KVH, num_blocks * block_size, D] shared by every sequence of the step. Each sequence's queries are
padded to one row of a [S, NH, Q, D] batch; its block-mask row lists the physical pages of its page
table (the mask's KV block is one page), so the kernel loads only those pages, from where they are.
`mask_mod` maps a physical slot back to its logical position for the causal rule.

On CUDA the call is compiled (once per padded shape: sequences and query rows round up to powers of
two, so a server sees a handful of shapes); elsewhere it runs eagerly, which is correct but slow.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

if TYPE_CHECKING:
    from tandem.worker.engine.layers.attention import AttentionBatch

Q_BLOCK = 128  # query rows per block-mask row


@dataclass(frozen=True)
class FlexLayout:
    """One step's padded query layout and block mask, shared by every layer."""

    token_rows: torch.Tensor  # [T] row of each flat token in the flattened [S_pad * Q_pad] query grid
    num_seqs: int  # S_pad
    query_rows: int  # Q_pad
    block_mask: BlockMask


def padded(n: int, bucket: bool) -> int:
    """`n` rounded up to a power of two when bucketing (compiled shapes), else as is."""
    return 1 << (n - 1).bit_length() if bucket and n > 1 else n


def flex_layout(batch: AttentionBatch, pool: int) -> FlexLayout:
    """The block mask and query layout of `batch` over a pool of `pool` pages (vectorised)."""
    device, bs = batch.device, batch.block_size
    bucket = device.type == "cuda"
    s, s_pad = batch.num_seqs, padded(batch.num_seqs, bucket)
    q_pad = padded(max(batch.query_lens), bucket)
    qlens = torch.tensor(batch.query_lens).to(device, non_blocking=True)
    ctx = torch.tensor(batch.context_lens).to(device, non_blocking=True)
    need = (ctx + bs - 1) // bs  # [S] pages per context
    table = batch.pages
    width = table.shape[1]
    # flat token -> (sequence, row): sequences are back to back in T
    seq_of_token = torch.repeat_interleave(torch.arange(s, device=device), qlens)
    starts = torch.cumsum(qlens, 0) - qlens
    row_in_seq = torch.arange(int(qlens.sum()), device=device) - starts[seq_of_token]
    token_rows = seq_of_token * q_pad + row_in_seq
    # physical page -> logical page of each sequence (-1: not its page); padding goes to a spare column
    valid = torch.arange(width, device=device)[None, :] < need[:, None]  # [S, W]
    logical = torch.full((s_pad, pool + 1), -1, dtype=torch.long, device=device)
    cols = torch.where(valid, table, pool)
    logical[:s].scatter_(1, cols, torch.arange(width, device=device).expand(s, width).contiguous())
    logical = logical[:, :pool]
    q_pos = torch.zeros(s_pad, q_pad, dtype=torch.long, device=device)
    q_pos[:s] = (ctx - qlens)[:, None] + torch.arange(q_pad, device=device)[None, :]

    def mask_mod(b, h, q_idx, kv_idx):
        page = logical[b, kv_idx // bs]
        return (page >= 0) & (page * bs + kv_idx % bs <= q_pos[b, q_idx])

    q_blocks = -(-q_pad // Q_BLOCK)
    has_rows = torch.arange(q_blocks, device=device)[None, :] * Q_BLOCK < qlens[:, None]  # [S, QB]
    kv_num = torch.zeros(s_pad, 1, q_blocks, dtype=torch.int32, device=device)
    kv_num[:s, 0] = torch.where(has_rows, need[:, None], 0).to(torch.int32)
    kv_indices = torch.zeros(s_pad, 1, q_blocks, pool, dtype=torch.int32, device=device)
    kv_indices[:s, 0, :, :width] = table[:, None, :].to(torch.int32)
    mask = BlockMask.from_kv_blocks(
        kv_num, kv_indices, BLOCK_SIZE=(Q_BLOCK, bs), mask_mod=mask_mod, seq_lengths=(q_pad, pool * bs)
    )
    return FlexLayout(token_rows, s_pad, q_pad, mask)


_compiled = None


def _flex():
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled


def flex_paged_attention(
    q: torch.Tensor,  # [T, NH, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D], this step's keys already written
    v_cache: torch.Tensor,
    layout: FlexLayout,
    scale: float,
) -> torch.Tensor:  # [T, NH, D]
    t, nh, d = q.shape
    n, bs, kvh, _ = k_cache.shape
    keys = k_cache.view(1, n * bs, kvh, d).transpose(1, 2)  # [1, KVH, N * bs, D], a view
    values = v_cache.view(1, n * bs, kvh, d).transpose(1, 2)
    grid = q.new_zeros(layout.num_seqs * layout.query_rows, nh, d)
    grid[layout.token_rows] = q
    queries = grid.view(layout.num_seqs, layout.query_rows, nh, d).transpose(1, 2)  # [S, NH, Q, D]
    if q.is_cuda:
        out = _flex()(queries, keys, values, block_mask=layout.block_mask, scale=scale, enable_gqa=nh != kvh)
    else:
        with warnings.catch_warnings():  # eager flex warns that it is meant to be compiled
            warnings.simplefilter("ignore")
            out = flex_attention(
                queries, keys, values, block_mask=layout.block_mask, scale=scale, enable_gqa=nh != kvh
            )
    assert isinstance(out, torch.Tensor)
    return out.transpose(1, 2).reshape(-1, nh, d)[layout.token_rows]

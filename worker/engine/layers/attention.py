"""Attention over the paged KV cache: where one step's queries look, and the backends that compute it.

`AttentionBatch` holds the step's layout once (built from tensors, not per-token Python loops); every
layer reuses it. Two backends:

- `sdpa`, the reference: decodes (and other short queries, such as a decode step's draft tokens) as one
  padded batch and longer prompt chunks one by one, each over its context gathered from the cache with
  `index_select`, then `scaled_dot_product_attention`.
- `flex`: one FlexAttention call for the whole step that reads the cache in place. The cache is one
  long KV sequence of pages; a block mask lists, per sequence, the physical pages it owns (its page
  table), and the mask maps each physical slot back to its logical position for causality. Nothing
  is gathered. Compiled on CUDA; elsewhere it runs eagerly (correct, slow: for tests).
- `triton`: our own Triton kernel (triton_paged) for the whole step, reading the cache in place through the
  block table, the 8-bit cache included; the static decode step (decode_graphs) runs it too. CUDA only (on the
  CPU, Triton's interpreter runs it for tests). The default stays `sdpa` until the three are measured
  side by side on the GPU (bench/gpu_engine.py).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

import torch
import torch.nn.functional as F

from tandem.worker.engine.layers.kv_int8 import read_pages, write_slots
from tandem.worker.engine.layers.static_decode import StaticDecodeBatch, static_decode_attention

if TYPE_CHECKING:
    from tandem.worker.engine.layers.flex_paged import FlexLayout
    from tandem.worker.engine.layers.triton_paged import TileLayout

BACKENDS = ("sdpa", "flex", "triton")
TRITON_NEEDS_CUDA = (
    "the triton attention backend needs a CUDA device (on the CPU Triton runs only under its interpreter, "
    "TRITON_INTERPRET=1, for tests); use sdpa or flex"
)
SHORT_QUERY_TOKENS = 17  # sequences with at most this many new tokens attend as one padded batch (sdpa)


@dataclass
class AttentionBatch:
    """Where the tokens of one forward pass go in the paged KV cache.

    Sequences are laid out back to back in the flat token dimension T.
    """

    query_lens: list[int]  # new tokens per sequence
    context_lens: list[int]  # tokens in the cache after this step (cached + new), per sequence
    block_tables: list[list[int]]  # KV block ids per sequence
    slot_mapping: torch.Tensor  # [T] flat slot (block * block_size + offset) for each new token
    block_size: int
    backend: str = "sdpa"
    table: torch.Tensor | None = None  # [S, W] block ids covering each context, padded; derived if None
    starts: list[int] = field(init=False)  # first flat token of each sequence
    decode_rows: list[int] = field(init=False)  # sequences with few new tokens, attended as one batch
    _flex: FlexLayout | None = field(init=False, default=None, repr=False)
    _tiles: TileLayout | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {self.backend!r}; one of {', '.join(BACKENDS)}")
        self.starts = [0]
        for n in self.query_lens:
            self.starts.append(self.starts[-1] + n)
        if self.table is None:
            self.table = block_table_tensor(self.block_tables, self.context_lens, self.block_size).to(
                self.device
            )
        rows = [i for i, n in enumerate(self.query_lens) if n <= SHORT_QUERY_TOKENS]
        self.decode_rows = rows if len(rows) > 1 else []

    @property
    def pages(self) -> torch.Tensor:  # [S, W]
        assert self.table is not None
        return self.table

    @property
    def device(self) -> torch.device:
        return self.slot_mapping.device

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    # --- what the sdpa backend needs, derived once per step -------------------------------------
    @functools.cached_property
    def decode_index(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(flat token of each query row [B, Q], the real rows of the flattened [B * Q] grid [R] and their
        flat tokens [R], the blocks [B * W], the causal mask over each context [B, 1, Q, W * block_size]); Q
        is the longest query, shorter ones padded. Indices come from the host: nothing waits on the device."""
        rows = self.decode_rows
        q_len = max(self.query_lens[i] for i in rows)
        lens = torch.tensor([self.context_lens[i] for i in rows])
        qlens = torch.tensor([self.query_lens[i] for i in rows])
        starts = torch.tensor([self.starts[i] for i in rows])
        need = max(-(-self.context_lens[i] // self.block_size) for i in rows)
        offsets = torch.arange(q_len)
        real = offsets[None, :] < qlens[:, None]  # [B, Q]
        tokens = torch.where(
            real, starts[:, None] + offsets[None, :], starts[:, None]
        )  # padding repeats row 0
        q_pos = (lens - qlens)[:, None] + offsets[None, :]  # [B, Q]
        real_rows = real.flatten().nonzero()[:, 0]
        put = functools.partial(torch.Tensor.to, device=self.device, non_blocking=True)
        q_pos, lens = put(q_pos), put(lens)
        kv = torch.arange(need * self.block_size, device=self.device)
        mask = (kv[None, None, :] <= q_pos[:, :, None]) & (
            kv[None, None, :] < lens[:, None, None]
        )  # [B, Q, L]
        blocks = self.pages.index_select(0, put(torch.tensor(rows, dtype=torch.long)))[:, :need].flatten()
        return put(tokens), put(real_rows), put(tokens.flatten()[real_rows]), blocks, mask[:, None]

    # --- what the flex backend needs ---------------------------------------------------------------
    def flex_layout(self, num_pool_blocks: int) -> FlexLayout:
        """The block mask over a pool of `num_pool_blocks` pages, built by the first layer that asks."""
        if self._flex is None:
            from tandem.worker.engine.layers.flex_paged import flex_layout

            self._flex = flex_layout(self, num_pool_blocks)
        return self._flex

    # --- what the triton backend needs -------------------------------------------------------------
    def tile_layout(self, group: int) -> TileLayout:
        """The step's query tiles for `group` query heads per KV head, built by the first layer that asks."""
        if self._tiles is None:
            from tandem.worker.engine.layers.triton_paged import tile_layout

            self._tiles = tile_layout(self.query_lens, self.context_lens, group, self.device)
        return self._tiles


StepBatch: TypeAlias = (
    AttentionBatch | StaticDecodeBatch
)  # a step's layout: any step, or a padded pure-decode batch


def check_backend(backend: str, device: torch.device) -> None:
    """Refuse a backend this device cannot run (triton off CUDA, unless Triton's interpreter is on)."""
    if backend not in BACKENDS:
        raise ValueError(f"attention must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(TRITON_NEEDS_CUDA)


def store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: StepBatch
) -> None:
    """Write this step's keys and values to their slots; the static decode step keeps them instead, and its
    runner writes them after the pass (a compiled graph may copy a whole cache it writes in place)."""
    if isinstance(batch, StaticDecodeBatch):
        batch.new_kv.append((k, v))
        return
    write_slots(k_cache, batch.slot_mapping, k)
    write_slots(v_cache, batch.slot_mapping, v)


def block_table_tensor(
    block_tables: list[list[int]], context_lens: list[int], block_size: int
) -> torch.Tensor:
    """[S, W] the blocks that cover each context, padded with block 0 to the longest (on the host)."""
    need = [-(-ctx // block_size) for ctx in context_lens]
    width = max(need, default=0)
    padded = [t[:k] + [0] * (width - k) for t, k in zip(block_tables, need, strict=True)]
    return torch.tensor(padded, dtype=torch.long).view(len(padded), width)


def attend(
    q: torch.Tensor,  # [T, NH, D]
    k_new: torch.Tensor,  # [T, KVH, D]
    v_new: torch.Tensor,
    # [num_blocks, block_size, KVH, D], this step's keys already written (static step: not)
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: StepBatch,
    scale: float,
) -> torch.Tensor:  # [T, NH, D]
    """Causal attention of each sequence's new queries over its whole context, by the batch's backend."""
    if isinstance(batch, StaticDecodeBatch):  # the static-shape decode step (decode_graphs)
        return static_decode_attention(q, k_new, v_new, k_cache, v_cache, batch, scale)
    if batch.backend == "flex":
        if k_cache.dtype == torch.uint8:
            raise ValueError("the flex attention backend cannot read the 8-bit KV cache; use sdpa")
        from tandem.worker.engine.layers.flex_paged import flex_paged_attention

        return flex_paged_attention(q, k_cache, v_cache, batch.flex_layout(k_cache.shape[0]), scale)
    if batch.backend == "triton":
        from tandem.worker.engine.layers.triton_paged import paged_attention

        layout = batch.tile_layout(q.shape[1] // k_cache.shape[2])
        return paged_attention(q, k_cache, v_cache, batch.pages, layout, scale)
    return sdpa_paged_attention(q, k_new, v_new, k_cache, v_cache, batch, scale)


def sdpa_paged_attention(
    q: torch.Tensor,  # [T, NH, D]
    k_new: torch.Tensor,  # [T, KVH, D]
    v_new: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,
    batch: AttentionBatch,
    scale: float,
) -> torch.Tensor:
    """The reference: gather each context from the cache (unpacking an 8-bit one), then SDPA (decodes
    batched over padded contexts)."""
    out = torch.empty_like(q)
    gqa = q.shape[1] != k_new.shape[1]
    kvh, d = k_new.shape[1], k_new.shape[2]
    if batch.decode_rows:
        b = len(batch.decode_rows)
        tokens, real_rows, real_tokens, blocks, valid = batch.decode_index
        ks = read_pages(k_cache, blocks, q.dtype).view(b, -1, kvh, d).transpose(1, 2)  # [B, KVH, L, D]
        vs = read_pages(v_cache, blocks, q.dtype).view(b, -1, kvh, d).transpose(1, 2)
        qb = q[tokens].transpose(1, 2)  # [B, NH, Q, D]
        o = F.scaled_dot_product_attention(qb, ks, vs, attn_mask=valid, scale=scale, enable_gqa=gqa)
        out[real_tokens] = o.transpose(1, 2).flatten(0, 1).index_select(0, real_rows)
    decoded = set(batch.decode_rows)
    for i, (n, ctx) in enumerate(zip(batch.query_lens, batch.context_lens, strict=True)):
        if i in decoded:
            continue
        s, e = batch.starts[i], batch.starts[i] + n
        qi = q[s:e].transpose(0, 1)[None]  # [1, NH, n, D]
        if ctx == n:  # nothing cached before: attend over the fresh keys directly
            ki, vi = k_new[s:e], v_new[s:e]
            mask, causal = None, n > 1
        else:
            blocks = batch.pages[i, : -(-ctx // batch.block_size)]
            ki = read_pages(k_cache, blocks, q.dtype).flatten(0, 1)[:ctx]  # [ctx, KVH, D]
            vi = read_pages(v_cache, blocks, q.dtype).flatten(0, 1)[:ctx]
            q_pos = torch.arange(ctx - n, ctx, device=q.device)
            mask, causal = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None], False  # [n, ctx]
        o = F.scaled_dot_product_attention(
            qi,
            ki.transpose(0, 1)[None],
            vi.transpose(0, 1)[None],
            attn_mask=mask,
            is_causal=causal,
            scale=scale,
            enable_gqa=gqa,
        )
        out[s:e] = o[0].transpose(0, 1)
    return out

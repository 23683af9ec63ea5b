"""The paged KV cache's storage: one preallocated block pool per layer, read and written by block id.

This is the small interface the KV transfer uses; which block belongs to whom is the block manager's job.
"""

from __future__ import annotations

import math

import torch

from tandem.worker.hf.config import ModelConfig
from tandem.worker.kv.layout import block_shape, storage_dtype, write_rows


def kv_block_nbytes(
    config: ModelConfig, block_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto"
) -> int:
    """Bytes one block takes across all layers, keys and values (8-bit: values and their scales)."""
    shape = block_shape(block_size, config.num_kv_heads, config.head_dim, kv_cache_dtype)
    elem = torch.tensor([], dtype=storage_dtype(dtype, kv_cache_dtype)).element_size()
    return 2 * config.num_layers * math.prod(shape) * elem


class KvCache:
    """Per layer `k[layer]`, `v[layer]`: [num_blocks, block_size, num_kv_heads, head_dim] in `dtype`,
    contiguous; with `kv_cache_dtype` int8, uint8 [..., head_dim + 4] (values and scale per token and head,
    see kv_int8).

    Each layer's pool is its own tensor, not a view of one: a compiled graph given views of one storage as
    inputs handles them through one base, and writing one of them copied the whole storage."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
        kv_cache_dtype: str = "auto",
    ):
        self.num_blocks, self.block_size, self.dtype = num_blocks, block_size, dtype
        self.kv_cache_dtype = kv_cache_dtype
        shape = (num_blocks, *block_shape(block_size, config.num_kv_heads, config.head_dim, kv_cache_dtype))
        store = storage_dtype(dtype, kv_cache_dtype)
        self.k = [torch.zeros(shape, dtype=store, device=device) for _ in range(config.num_layers)]
        self.v = [torch.zeros(shape, dtype=store, device=device) for _ in range(config.num_layers)]

    @property
    def num_layers(self) -> int:
        return len(self.k)

    def read_blocks(self, layer: int, block_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.k[layer].device)
        return self.k[layer][ids], self.v[layer][ids]

    def write_blocks(self, layer: int, block_ids: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        write_rows(self.k[layer], block_ids, k)
        write_rows(self.v[layer], block_ids, v)

"""A plain KvBlockStore over per-layer tensors [num_blocks, block_size, kv_heads, head_dim] (tests, bench)."""

from __future__ import annotations

import torch

from tandem.worker.kv.layout import write_rows

from .base import KvLayout


class TensorKvStore:
    def __init__(self, layout: KvLayout, num_blocks: int, device: str | torch.device = "cpu"):
        shape = (num_blocks, *layout.block_shape)
        self.layout = layout
        self.k = [
            torch.zeros(shape, dtype=layout.storage_dtype, device=device) for _ in range(layout.num_layers)
        ]
        self.v = [
            torch.zeros(shape, dtype=layout.storage_dtype, device=device) for _ in range(layout.num_layers)
        ]

    @classmethod
    def random(cls, layout: KvLayout, num_blocks: int, seed: int = 0) -> TensorKvStore:
        store = cls(layout, num_blocks)
        gen = torch.Generator().manual_seed(seed)
        for t in store.k + store.v:
            if layout.packed:
                t.copy_(torch.randint(0, 256, t.shape, generator=gen, dtype=torch.uint8))
            else:
                t.copy_(torch.randn(t.shape, generator=gen).to(layout.dtype))
        return store

    def read_blocks(self, layer: int, block_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.as_tensor(block_ids, dtype=torch.long, device=self.k[layer].device)
        return self.k[layer][ids], self.v[layer][ids]

    def write_blocks(self, layer: int, block_ids: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        write_rows(self.k[layer], block_ids, k)
        write_rows(self.v[layer], block_ids, v)

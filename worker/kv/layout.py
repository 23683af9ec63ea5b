"""The paged KV block as the engine stores it and the transports move it: a layer's pool is
[num_blocks, block_size, num_kv_heads, row] with row = head_dim in the model's dtype, or, for the 8-bit cache,
head_dim int8 values and a float32 scale packed as head_dim + SCALE_BYTES uint8; and writing blocks by id.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem.spec_engine import KvCacheDtype

KV_CACHE_DTYPES = tuple(d.value for d in KvCacheDtype)  # auto: the model's dtype
SCALE_BYTES = 4  # the 8-bit cache: one float32 scale per token and head, after its int8 values
MAX_RUNS = 8  # more runs than this: one index_copy_ beats a Python loop of slice copies


def is_packed(kv_cache_dtype: str) -> bool:
    """Whether the cache stores packed 8-bit rows; ValueError for a storage it does not know."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kvCacheDtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    return kv_cache_dtype == KvCacheDtype.int8


def row_bytes(head_dim: int) -> int:
    """Bytes of one token's one head in the 8-bit cache."""
    return head_dim + SCALE_BYTES


def block_shape(
    block_size: int, num_kv_heads: int, head_dim: int, kv_cache_dtype: str
) -> tuple[int, int, int]:
    """One layer's block: [block_size, num_kv_heads, row]."""
    return (block_size, num_kv_heads, row_bytes(head_dim) if is_packed(kv_cache_dtype) else head_dim)


def storage_dtype(dtype: torch.dtype, kv_cache_dtype: str) -> torch.dtype:
    """The dtype of the pool's tensors: the model's, or uint8 for packed 8-bit rows."""
    return torch.uint8 if is_packed(kv_cache_dtype) else dtype


def id_runs(ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(source row, destination id, length) for each run of consecutive ids, in order (pure)."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            runs.append((start, ids[start], i - start))
            start = i
    return runs


def write_rows(dst: torch.Tensor, ids: Sequence[int], src: torch.Tensor) -> None:
    """dst[ids[i]] = src[i] for every i; converts dtype and device; one copy of the bytes."""
    if len(ids) != src.shape[0]:
        raise ValueError(f"{len(ids)} ids for {src.shape[0]} rows")
    runs = id_runs(ids)
    if len(runs) <= MAX_RUNS:
        for row, dest, n in runs:
            dst[dest : dest + n].copy_(src[row : row + n])
        return
    index = torch.as_tensor(list(ids), dtype=torch.long, device=dst.device)
    dst.index_copy_(0, index, src.to(dst.device, dst.dtype))

"""KV blocks to chunk bytes and back: keys then values, raw in the KV dtype or int8 with per-block scales.

An 8-bit KV cache (`engine.kvCacheDtype: int8`) travels raw: its blocks are already 8 bits with their
scales, so the wire compression (`kvTransfer.compression: int8`) is a no-op for it (`wire_compression`).
"""

from __future__ import annotations

import math
import warnings

import torch

from tandem.v1 import decode_pb2

from .base import InvalidChunk, KvLayout
from .compression import dequantize_int8, quantize_int8

NONE = decode_pb2.KV_COMPRESSION_NONE
INT8 = decode_pb2.KV_COMPRESSION_INT8_ABSMAX

# Received payloads are read-only bytes; the tensors made over them are only read from.
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (copied to contiguous first if needed)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def wire_compression(requested: str, kv_cache_dtype: str) -> int:
    """The chunk compression a prefill worker uses: `int8` on the wire only for a full-precision cache."""
    if requested not in ("none", "int8"):
        raise ValueError(f"unknown KV compression {requested!r}; none or int8")
    return INT8 if requested == "int8" and kv_cache_dtype == "auto" else NONE


def chunk_nbytes(layout: KvLayout, num_blocks: int, compression: int = NONE) -> int:
    per = layout.block_elems if compression == INT8 else layout.block_nbytes
    return 2 * num_blocks * per


def encode_blocks(
    k: torch.Tensor, v: torch.Tensor, compression: int = NONE
) -> tuple[list[torch.Tensor], list[float]]:
    """(uint8 byte tensors for keys and values, per-block scales interleaved k,v) for one chunk."""
    if k.shape != v.shape:
        raise ValueError(f"keys {tuple(k.shape)} and values {tuple(v.shape)} differ")
    if compression == NONE:
        return [as_bytes(k), as_bytes(v)], []
    if compression != INT8:
        raise ValueError(f"unknown compression {compression}")
    if k.dtype == torch.uint8:
        raise ValueError("an 8-bit KV cache travels raw (its blocks are already int8 with scales)")
    qk, sk = quantize_int8(k)
    qv, sv = quantize_int8(v)
    scales = torch.stack([sk, sv], dim=1).reshape(-1).tolist()
    return [as_bytes(qk), as_bytes(qv)], scales


def decode_blocks(
    data: torch.Tensor,
    layout: KvLayout,
    num_blocks: int,
    compression: int = NONE,
    scales: list[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [num_blocks, *block_shape] from a flat uint8 tensor (views when uncompressed)."""
    expected = chunk_nbytes(layout, num_blocks, compression)
    if data.numel() != expected:
        raise InvalidChunk(f"chunk of {num_blocks} blocks should carry {expected} bytes, got {data.numel()}")
    half = expected // 2
    shape = (num_blocks, *layout.block_shape)
    if compression == NONE:
        dt = layout.storage_dtype
        return data[:half].view(dt).view(shape), data[half:].view(dt).view(shape)
    if layout.packed:
        raise InvalidChunk("an 8-bit KV cache's chunks must travel uncompressed")
    if compression != INT8 or scales is None or len(scales) != 2 * num_blocks:
        raise InvalidChunk(f"compression {compression} needs {2 * num_blocks} scales")
    if not all(math.isfinite(x) for x in scales):
        raise InvalidChunk("a chunk's scales must be finite")
    s = torch.tensor(scales, dtype=torch.float32, device=data.device).reshape(num_blocks, 2)
    k = dequantize_int8(data[:half].view(torch.int8).view(shape), s[:, 0], layout.dtype)
    v = dequantize_int8(data[half:].view(torch.int8).view(shape), s[:, 1], layout.dtype)
    return k, v


def tensor_over(buf: memoryview) -> torch.Tensor:
    """A uint8 tensor over received bytes without copying them."""
    if len(buf) == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(buf, dtype=torch.uint8)

"""The transport's contracts: the KV layout, the block store it reads and writes, the sender, the errors."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from tandem.v1 import common_pb2, decode_pb2
from tandem.worker.kv import layout

from .handshake import kv_cache_dtype_of

PROTOCOL_VERSION = 2  # 2: chunk checksums are XXH3-64 (low 32 bits) instead of crc32


@dataclass(frozen=True)
class KvLayout:
    """Shape of one layer's KV block: [block_size, num_kv_heads, head_dim] in `dtype`, for `num_layers`.

    With `kv_cache_dtype` int8 the cache stores each head's row packed (int8 values and a float32 scale,
    `head_dim + 4` bytes; kv/layout), and a block travels as those bytes, scales included."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    kv_cache_dtype: str = "auto"

    @property
    def packed(self) -> bool:
        return layout.is_packed(self.kv_cache_dtype)

    @property
    def storage_dtype(self) -> torch.dtype:
        """The dtype of the cache's tensors: the model's, or uint8 for the packed 8-bit rows."""
        return layout.storage_dtype(self.dtype, self.kv_cache_dtype)

    @property
    def block_shape(self) -> tuple[int, int, int]:
        return layout.block_shape(self.block_size, self.num_kv_heads, self.head_dim, self.kv_cache_dtype)

    @property
    def block_elems(self) -> int:
        return self.block_size * self.num_kv_heads * self.block_shape[2]

    @property
    def block_nbytes(self) -> int:
        """Bytes of the keys (or the values) of one block in one layer."""
        return self.block_elems * self.storage_dtype.itemsize

    @classmethod
    def from_worker_info(cls, info: common_pb2.WorkerInfo) -> KvLayout:
        return cls(
            info.num_layers,
            info.block_size,
            info.num_kv_heads,
            info.head_dim,
            dtype_from_name(info.dtype),
            kv_cache_dtype_of(info),
        )


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown KV dtype {name!r}")
    return dtype


@runtime_checkable
class KvBlockStore(Protocol):
    """What the transport needs of a paged KV cache: per-layer block reads and writes by block id.

    `k`/`v` are shaped [len(block_ids), block_size, num_kv_heads, head_dim].
    """

    def read_blocks(self, layer: int, block_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]: ...

    def write_blocks(self, layer: int, block_ids: list[int], k: torch.Tensor, v: torch.Tensor) -> None: ...


class KvTransferError(RuntimeError):
    """A transfer that cannot complete; the reservation it belongs to is freed."""


class DecodeUnreachable(KvTransferError):
    """The push never reached a decode worker (no connection, or a TLS handshake the peer failed); the
    transport's details are logged, not passed on."""


class ChecksumMismatch(KvTransferError):
    """A chunk whose bytes do not match its checksum."""


class InvalidChunk(KvTransferError):
    """A chunk that does not fit its reservation (wrong blocks, layer or size)."""


class IncompleteTransfer(KvTransferError):
    """A commit that arrived before every block of every layer."""


class KvSender(ABC):
    """Sender side of one transfer (one reservation), whatever the transport.

    `send` may return before the bytes have left; `commit` sends the first token last, waits for the
    decode worker's verdict and closes the stream; `abort` drops the transfer.
    """

    transport: int  # a common_pb2.KvTransport value

    @abstractmethod
    def send(
        self,
        layer: int,
        block_ids: Sequence[int],
        k: torch.Tensor,
        v: torch.Tensor,
        ready: torch.cuda.Event | None = None,
    ) -> None:
        """Queue one layer's blocks; `ready`, when given, is the CUDA event after which `k` and `v` hold
        them."""

    @abstractmethod
    def send_chunk(self, header: decode_pb2.KvChunkHeader, payload: bytes | memoryview = b"") -> None: ...

    @abstractmethod
    def commit(
        self,
        first_token: int,
        first_token_logprob: float = 0.0,
        top_logprobs: list[tuple[int, float]] | None = None,
    ) -> decode_pb2.PushKvReply: ...

    @abstractmethod
    def abort(self, reason: str = "") -> None: ...

    def close(self) -> None:
        """Abort unless committed; safe to call twice."""
        self.abort("closed")

    def __enter__(self) -> KvSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

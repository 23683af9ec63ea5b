"""Decode side of a transfer: check each chunk against its reservation, verify it, write it into the cache."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from tandem.v1 import decode_pb2

from .base import ChecksumMismatch, IncompleteTransfer, InvalidChunk, KvBlockStore, KvLayout
from .codec import decode_blocks, tensor_over
from .framing import checksum
from .reservations import ChunkVerdict, Released, Reservation, ReservationTable


@dataclass(frozen=True)
class Committed:
    reservation: Reservation
    first_token: int
    first_token_logprob: float
    first_token_top_logprobs: list[tuple[int, float]] = field(default_factory=list)


def chunk_checksum(parts: Iterable[torch.Tensor], scales: Iterable[float] = ()) -> int:
    """framing.checksum (XXH3-64, low 32 bits) of a chunk's bytes (CPU uint8 tensors, in order) followed
    by its float32 scales."""
    bufs = [p.numpy().data for p in parts]
    scales = list(scales)
    if scales:
        bufs.append(torch.tensor(scales, dtype=torch.float32).numpy().data)
    return checksum(bufs)


class KvReceiver:
    """Applies chunks into a KvBlockStore under a ReservationTable; thread-safe.

    `on_release` gets every reservation that ends without completing (abort, expiry, failure,
    superseded): the caller frees its blocks (and its staging ring). `on_commit` gets the completed ones.
    """

    def __init__(
        self,
        store: KvBlockStore,
        layout: KvLayout,
        on_release: Callable[[Released], None],
        on_commit: Callable[[Committed], None] = lambda c: None,
        clock: Callable[[], float] = time.monotonic,
        vocab_size: int | None = None,
    ):
        self.store, self.layout, self.vocab_size = store, layout, vocab_size
        self.table = ReservationTable()
        self._on_release, self._on_commit, self._clock = on_release, on_commit, clock
        self._lock = threading.Lock()
        self._guards: dict[int, threading.Lock] = {}

    # -- reservations ------------------------------------------------------------------------------
    def reserve(
        self, transfer_id: str, request_id: str, block_ids: Iterable[int], lease_s: float
    ) -> Reservation:
        with self._lock:
            res, superseded = self.table.reserve(
                transfer_id, request_id, block_ids, self.layout.num_layers, lease_s, self._clock()
            )
            self._guards[res.epoch] = threading.Lock()
        self._release(superseded)
        return res

    def abort(self, transfer_id: str = "", request_id: str = "", reason: str = "aborted") -> list[Released]:
        with self._lock:
            gone = self.table.abort(transfer_id, request_id, reason)
        self._release(gone)
        return gone

    def fail(self, transfer_id: str, epoch: int, reason: str) -> list[Released]:
        """End the transfer's reservation if it is still at `epoch` (a newer one is left alone)."""
        with self._lock:
            res = self.table.get(transfer_id)
            gone = (
                self.table.abort(transfer_id, reason=reason) if res is not None and res.epoch == epoch else []
            )
        self._release(gone)
        return gone

    def expire(self) -> list[Released]:
        with self._lock:
            gone = self.table.expire(self._clock())
        self._release(gone)
        return gone

    def _release(self, gone: list[Released]) -> None:
        for rel in gone:
            guard = self._guards.pop(rel.reservation.epoch, None)
            if guard is not None:
                with guard:  # wait for a chunk being written into these blocks
                    pass
            self._on_release(rel)

    # -- chunks --------------------------------------------------------------------------------------
    def apply(self, header: decode_pb2.KvChunkHeader, payload: memoryview) -> ChunkVerdict:
        """Write one data chunk into the store. STALE/UNKNOWN chunks are dropped untouched; a bad
        checksum, a chunk outside its reservation or out of sequence raises (the caller fails the
        transfer)."""
        with self._lock:
            verdict = self.table.check(header.transfer_id, header.epoch, self._clock())
            res = self.table.get(header.transfer_id)
            guard = self._guards.get(header.epoch)
        if verdict is not ChunkVerdict.ACCEPT or res is None or guard is None:
            return verdict if verdict is not ChunkVerdict.ACCEPT else ChunkVerdict.UNKNOWN
        with guard:
            with self._lock:
                if self.table.get(header.transfer_id) is not res:
                    return ChunkVerdict.UNKNOWN
            if header.sequence != res.next_sequence:
                raise InvalidChunk(
                    f"transfer {header.transfer_id}: chunk {header.sequence} arrived where chunk "
                    f"{res.next_sequence} was due (replayed or out of order)"
                )
            ids = list(header.block_ids)
            self._check_fits(header, ids, res)
            staged = header.HasField("staging")
            if staged:
                if res.staging is None:
                    raise InvalidChunk("chunk points into a staging ring, but none is lent to this transfer")
                data = res.staging.view(header.staging)
            else:
                data = tensor_over(payload)
            if header.has_checksum:
                if data.is_cuda:
                    raise InvalidChunk("checksums are not computed over GPU staging buffers")
                got = chunk_checksum([data], header.scales)
                if got != header.checksum:
                    raise ChecksumMismatch(
                        f"transfer {header.transfer_id} layer {header.layer}: checksum {got:#010x} != "
                        f"{header.checksum:#010x}"
                    )
            k, v = decode_blocks(data, self.layout, len(ids), header.compression, list(header.scales))
            self.store.write_blocks(header.layer, ids, k, v)
            if staged:
                if data.is_cuda:
                    torch.cuda.current_stream(data.device).synchronize()
                res.staging.release(header.staging)
            with self._lock:
                if self.table.get(header.transfer_id) is res:
                    self.table.record(header.transfer_id, header.layer, ids, self._clock())
                res.next_sequence += 1
        return ChunkVerdict.ACCEPT

    def _check_fits(self, header: decode_pb2.KvChunkHeader, ids: list[int], res: Reservation) -> None:
        if not ids:
            raise InvalidChunk("data chunk without blocks")
        if header.layer >= self.layout.num_layers:
            raise InvalidChunk(f"layer {header.layer} out of range ({self.layout.num_layers} layers)")
        outside = set(ids) - set(res.block_ids)
        if outside:
            raise InvalidChunk(
                f"blocks {sorted(outside)[:8]} are not reserved for transfer {header.transfer_id}"
            )

    def commit(self, header: decode_pb2.KvChunkHeader) -> tuple[ChunkVerdict, Committed | None]:
        """Complete the reservation if every block of every layer arrived; raises IncompleteTransfer if
        not."""
        with self._lock:
            verdict = self.table.check(header.transfer_id, header.epoch, self._clock())
            if verdict is not ChunkVerdict.ACCEPT:
                return verdict, None
            res = self.table.get(header.transfer_id)
            assert res is not None
            if self.vocab_size is not None and not 0 <= header.first_token < self.vocab_size:
                raise InvalidChunk(
                    f"first token {header.first_token} is outside the vocabulary of {self.vocab_size}"
                )
            if not res.is_complete():
                raise IncompleteTransfer(
                    f"transfer {header.transfer_id} committed with {res.missing()} layer-blocks missing"
                )
            self.table.complete(header.transfer_id, header.epoch)
            self._guards.pop(res.epoch, None)
        top = [(t.token_id, t.logprob) for t in header.first_token_top_logprobs]
        done = Committed(res, header.first_token, header.first_token_logprob, top)
        self._on_commit(done)
        return verdict, done

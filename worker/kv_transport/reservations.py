"""Decode-side reservations of KV blocks under a lease: reserve, receive, complete, abort, expire.

Pure bookkeeping: the caller passes the clock (`now`, seconds) and frees the block ids it gets back.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


class ChunkVerdict(enum.Enum):
    ACCEPT = "accept"
    STALE = "stale"  # an older epoch of a live transfer: drop the chunk
    UNKNOWN = "unknown"  # no live reservation (never made, aborted, expired or completed)


def classify_epoch(current_epoch: int | None, chunk_epoch: int) -> ChunkVerdict:
    """ACCEPT a chunk of the reservation's epoch, drop one from another epoch, UNKNOWN without one."""
    if current_epoch is None:
        return ChunkVerdict.UNKNOWN
    return ChunkVerdict.ACCEPT if chunk_epoch == current_epoch else ChunkVerdict.STALE


@dataclass
class Reservation:
    transfer_id: str
    request_id: str
    block_ids: list[int]
    epoch: int
    lease_s: float
    deadline: float
    num_layers: int
    received: set[tuple[int, int]] = field(default_factory=set, repr=False)
    next_sequence: int = (
        0  # the `sequence` the next data chunk must carry (a replayed or reordered one is refused)
    )
    staging: Any = None  # a staging ring lent to this transfer, released with it

    def is_complete(self) -> bool:
        return len(self.received) == self.num_layers * len(self.block_ids)

    def missing(self) -> int:
        return self.num_layers * len(self.block_ids) - len(self.received)


@dataclass(frozen=True)
class Released:
    """A reservation that ended without completing, and the blocks the caller must free."""

    reservation: Reservation
    reason: str

    @property
    def block_ids(self) -> list[int]:
        return self.reservation.block_ids


class ReservationTable:
    """Live reservations by transfer id; epochs grow monotonically across the table."""

    def __init__(self) -> None:
        self._live: dict[str, Reservation] = {}
        self._epochs = itertools.count(1)

    def __len__(self) -> int:
        return len(self._live)

    def get(self, transfer_id: str) -> Reservation | None:
        return self._live.get(transfer_id)

    def reserved_blocks(self) -> int:
        return sum(len(r.block_ids) for r in self._live.values())

    def reserve(
        self,
        transfer_id: str,
        request_id: str,
        block_ids: Iterable[int],
        num_layers: int,
        lease_s: float,
        now: float,
    ) -> tuple[Reservation, list[Released]]:
        """A new reservation with a fresh epoch; one already held under the same transfer id is superseded
        (returned for freeing), so its late chunks become stale."""
        superseded = self._live.pop(transfer_id, None)
        res = Reservation(
            transfer_id, request_id, list(block_ids), next(self._epochs), lease_s, now + lease_s, num_layers
        )
        self._live[transfer_id] = res
        return res, ([Released(superseded, "superseded")] if superseded else [])

    def check(self, transfer_id: str, epoch: int, now: float) -> ChunkVerdict:
        res = self._live.get(transfer_id)
        if res is not None and now >= res.deadline:
            return ChunkVerdict.UNKNOWN
        return classify_epoch(res.epoch if res else None, epoch)

    def record(self, transfer_id: str, layer: int, block_ids: Iterable[int], now: float) -> None:
        """Note blocks of a layer as received and renew the lease (progress keeps a transfer alive)."""
        res = self._live[transfer_id]
        res.received.update((layer, b) for b in block_ids)
        res.deadline = max(res.deadline, now + res.lease_s)

    def complete(self, transfer_id: str, epoch: int) -> Reservation:
        """Hand a fully received reservation over to its sequence (its blocks are no longer the table's)."""
        res = self._live.get(transfer_id)
        if res is None or res.epoch != epoch:
            raise KeyError(f"no live reservation {transfer_id} at epoch {epoch}")
        if not res.is_complete():
            raise ValueError(f"transfer {transfer_id} is missing {res.missing()} layer-blocks")
        del self._live[transfer_id]
        return res

    def abort(self, transfer_id: str = "", request_id: str = "", reason: str = "aborted") -> list[Released]:
        """End the reservations matching a transfer id or a request id."""
        hits = [
            t
            for t, r in self._live.items()
            if (transfer_id and t == transfer_id) or (request_id and r.request_id == request_id)
        ]
        return [Released(self._live.pop(t), reason) for t in hits]

    def expire(self, now: float) -> list[Released]:
        """End every reservation whose lease has run out."""
        return [
            Released(self._live.pop(t), "lease expired")
            for t, r in list(self._live.items())
            if now >= r.deadline
        ]

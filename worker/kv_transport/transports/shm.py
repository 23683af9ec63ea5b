"""Shared memory: the decode worker lends a staging ring in /dev/shm, the prefill worker writes KV into it and
sends only (offset, length) on the stream. Both on one host, both caches on the CPU."""

from __future__ import annotations

from typing import Any

from tandem.v1 import common_pb2, decode_pb2

from . import KvTransport, same_host

RINGS, RING_BYTES = 4, 64 << 20


def _offered(setting: str, device: str) -> bool:
    if setting == "shm" and device != "cpu":
        raise ValueError(f"kvTransfer.transport shm needs the KV cache on the CPU, not on {device}")
    return setting in ("auto", "shm") and device == "cpu"


def _staging(device: str) -> Any:
    from tandem.shm_segments import sweep_dead_segments
    from tandem.worker.kv_transport.staging import StagingPool, StagingRing

    sweep_dead_segments()  # a restart: the rings of the worker it replaces, if that one was killed
    return StagingPool([StagingRing.create_shm(RING_BYTES) for _ in range(RINGS)])


def _attach(reservation: decode_pb2.ReserveReply, cuda_device: int) -> Any:
    from tandem.worker.kv_transport.staging import StagingRing

    return StagingRing.attach_shm(reservation.shm_name) if reservation.shm_name else None


TRANSPORT = KvTransport(
    kind=common_pb2.KV_TRANSPORT_SHM,
    priority=10,
    offered=_offered,
    pairs=lambda sender, receiver: (
        same_host(sender, receiver) and sender.shm_capable and receiver.shm_capable
    ),
    setting="shm",
    staging=_staging,
    describe=lambda ring: {"shm_name": ring.name, "shm_capacity": ring.capacity},
    attach=_attach,
)

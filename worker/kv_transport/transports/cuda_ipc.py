"""CUDA IPC: the decode worker lends a staging ring whose data is a CUDA buffer, the prefill worker opens it
by its IPC handle and copies KV device to device. Both on one host with their caches on the same GPU (the same
device UUID: a GPU another process cannot see cannot be opened); offered by `auto` on a GPU."""

from __future__ import annotations

from typing import Any

from tandem.v1 import common_pb2, decode_pb2

from . import KvTransport, same_host

RINGS, RING_BYTES = 2, 64 << 20


def _pairs(sender: common_pb2.WorkerInfo, receiver: common_pb2.WorkerInfo) -> bool:
    return (
        same_host(sender, receiver)
        and bool(sender.cuda_device_uuid)
        and sender.cuda_device_uuid == receiver.cuda_device_uuid
    )


def _staging(device: str) -> Any:
    from tandem.worker.kv_transport.cuda_ipc import create_cuda_ring
    from tandem.worker.kv_transport.staging import StagingPool

    return StagingPool([create_cuda_ring(RING_BYTES, device) for _ in range(RINGS)])


def _describe(ring: Any) -> dict[str, Any]:
    from tandem.worker.kv_transport.cuda_ipc import export_buffer

    return {"shm_name": ring.name, "shm_capacity": ring.capacity, "cuda_ipc": export_buffer(ring)}


def _attach(reservation: decode_pb2.ReserveReply, cuda_device: int) -> Any:
    from tandem.worker.kv_transport.cuda_ipc import attach_cuda_ring

    if not reservation.HasField("cuda_ipc"):
        return None
    return attach_cuda_ring(reservation.shm_name, reservation.cuda_ipc, cuda_device)


TRANSPORT = KvTransport(
    kind=common_pb2.KV_TRANSPORT_CUDA_IPC,
    priority=20,
    offered=lambda setting, device: setting == "auto" and device.startswith("cuda"),
    pairs=_pairs,
    staging=_staging,
    describe=_describe,
    attach=_attach,
)

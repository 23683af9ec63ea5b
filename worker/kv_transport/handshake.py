"""Handshake decisions (pure): are two workers' KV layouts compatible, and which transport to use.

The transports themselves, and the order they are tried in, are the registry's (`transports/`); the decode
worker grants what `reserve_transports` lists.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.v1 import common_pb2
from tandem.worker.kv_transport import transports

T = common_pb2
DEFAULT_LEASE_MS = (
    30_000  # how long a decode worker holds reserved blocks for a transfer (spec kvTransfer.leaseMs)
)

_LAYOUT_FIELDS = (
    "model_name",
    "dtype",
    "num_layers",
    "num_kv_heads",
    "head_dim",
    "block_size",
    "protocol_version",
)
KV_CACHE_HINT = "set engine.kvCacheDtype the same for the prefill and decode pools"
_SENDERS = (T.WORKER_ROLE_PREFILL, T.WORKER_ROLE_COLOCATED)
_RECEIVERS = (T.WORKER_ROLE_DECODE, T.WORKER_ROLE_COLOCATED)


def kv_cache_dtype_of(info: common_pb2.WorkerInfo) -> str:
    """A worker's KV cache storage; one that does not say stores the model's dtype."""
    return info.kv_cache_dtype or "auto"


def check_compatible(sender: common_pb2.WorkerInfo, receiver: common_pb2.WorkerInfo) -> list[str]:
    """Reasons why `sender` may not push KV into `receiver`; empty when it may."""
    problems = []
    for name in _LAYOUT_FIELDS:
        a, b = getattr(sender, name), getattr(receiver, name)
        if a != b:
            problems.append(
                f"{name} differs: {sender.worker_id or 'sender'} has {a!r}, "
                f"{receiver.worker_id or 'receiver'} has {b!r}"
            )
    a, b = kv_cache_dtype_of(sender), kv_cache_dtype_of(receiver)
    if a != b:
        problems.append(
            f"kv_cache_dtype differs: {sender.worker_id or 'sender'} stores {a!r}, "
            f"{receiver.worker_id or 'receiver'} stores {b!r} ({KV_CACHE_HINT})"
        )
    for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
        if getattr(sender, name) == 0 or getattr(receiver, name) == 0:
            problems.append(f"{name} is unset")
    if sender.role not in _SENDERS and sender.role != T.WORKER_ROLE_UNSPECIFIED:
        problems.append(f"{T.WorkerRole.Name(sender.role)} cannot send KV")
    if receiver.role not in _RECEIVERS and receiver.role != T.WORKER_ROLE_UNSPECIFIED:
        problems.append(f"{T.WorkerRole.Name(receiver.role)} cannot receive KV")
    if choose_transport(sender, receiver) == T.KV_TRANSPORT_UNSPECIFIED:
        offers = [[T.KvTransport.Name(t) for t in w.transports] for w in (sender, receiver)]
        problems.append(f"no KV transport in common: the sender offers {offers[0]}, the receiver {offers[1]}")
    return problems


def choose_transport(sender: common_pb2.WorkerInfo, receiver: common_pb2.WorkerInfo) -> int:
    """The best transport both offer and may pair on (the registry, best first); KV_TRANSPORT_UNSPECIFIED
    when they share none (a worker told to use only shared memory, paired with one on another host)."""
    return transports.choose_transport(sender, receiver)


def reserve_transports(
    offered: Sequence[int],
    sender_host_id: str,
    receiver: common_pb2.WorkerInfo,
    sender_cuda_device_uuid: str = "",
) -> list[int]:
    """What a decode worker may grant a reservation, best first, from what the prefill worker says of itself
    in it (an empty list of transports: the gRPC stream only)."""
    return transports.candidates(
        transports.sender_from_reserve(offered, sender_host_id, sender_cuda_device_uuid), receiver
    )


def reserve_transport(
    offered: Sequence[int],
    sender_host_id: str,
    receiver: common_pb2.WorkerInfo,
    sender_cuda_device_uuid: str = "",
) -> int:
    """The transport a decode worker grants a reservation when its staging has room."""
    return next(
        iter(reserve_transports(offered, sender_host_id, receiver, sender_cuda_device_uuid)),
        T.KV_TRANSPORT_UNSPECIFIED,
    )

"""Handshake decisions (pure): are two workers' KV layouts compatible, and which transport to use.

The one place that decides the KV transport: the decode worker grants what `reserve_transport` says.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.v1 import common_pb2

T = common_pb2
DEFAULT_LEASE_MS = 30_000  # how long a decode worker holds reserved blocks for a transfer (spec kvTransfer.leaseMs)

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
                f"{name} differs: {sender.worker_id or 'sender'} has {a!r}, {receiver.worker_id or 'receiver'} has {b!r}"
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


def same_host(a: common_pb2.WorkerInfo, b: common_pb2.WorkerInfo) -> bool:
    return bool(a.host_id) and a.host_id == b.host_id


def _offers(worker: common_pb2.WorkerInfo) -> set[int]:
    """The transports a worker offers; one that lists none speaks the gRPC stream, the protocol's baseline."""
    return set(worker.transports) or {T.KV_TRANSPORT_GRPC}


def choose_transport(
    sender: common_pb2.WorkerInfo, receiver: common_pb2.WorkerInfo, allow_cuda_ipc: bool = True
) -> int:
    """The fastest transport both sides offer: CUDA IPC (same host, both caches on GPUs), then shared
    memory (same host, both shm-capable), else the gRPC stream; KV_TRANSPORT_UNSPECIFIED when they share
    none (a worker told to use only shared memory, paired with one on another host)."""
    both = _offers(sender) & _offers(receiver)
    if same_host(sender, receiver):
        gpus = sender.cuda_device >= 0 and receiver.cuda_device >= 0
        if allow_cuda_ipc and gpus and T.KV_TRANSPORT_CUDA_IPC in both:
            return T.KV_TRANSPORT_CUDA_IPC
        if sender.shm_capable and receiver.shm_capable and T.KV_TRANSPORT_SHM in both:
            return T.KV_TRANSPORT_SHM
    return T.KV_TRANSPORT_GRPC if T.KV_TRANSPORT_GRPC in both else T.KV_TRANSPORT_UNSPECIFIED


def reserve_transport(offered: Sequence[int], sender_host_id: str, receiver: common_pb2.WorkerInfo) -> int:
    """The transport a decode worker grants a reservation, from what the prefill worker offers in it (an
    empty list: the gRPC stream only). The decode server stages no CUDA IPC buffers, so never that."""
    sender = common_pb2.WorkerInfo(
        host_id=sender_host_id, transports=offered, shm_capable=T.KV_TRANSPORT_SHM in offered, cuda_device=-1
    )
    return choose_transport(sender, receiver, allow_cuda_ipc=False)

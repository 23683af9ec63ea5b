"""The KV transport registry: each module in this package declares one transport (what a worker offers,
whether a sender and a receiver can pair on it, the decode side's staging and the prefill side's view of it);
the registry walks them best first. A new transport is one module here plus its tandem.v1 KvTransport value.

Pure and torch-free at import (the router's handshake uses it): staging and attaching import torch when run.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tandem.v1 import common_pb2, decode_pb2

T = common_pb2
AUTO = "auto"  # the kvTransfer.transport setting that offers every transport the cache's device allows


def _none(*_: Any) -> None:
    return None


@dataclass(frozen=True)
class KvTransport:
    kind: int  # its tandem.v1 KvTransport value
    priority: int  # tried before every transport of a lower priority
    # (kvTransfer.transport setting, KV cache device) -> whether a worker offers it; ValueError for a setting
    # that forces it where it cannot work
    offered: Callable[[str, str], bool]
    # (sender, receiver) -> whether the two may use it, beyond both offering it
    pairs: Callable[[common_pb2.WorkerInfo, common_pb2.WorkerInfo], bool] = lambda sender, receiver: True
    setting: str | None = None  # the kvTransfer.transport value that forces it alone (None: `auto` only)
    # Decode side, once at start: (KV cache device) -> the StagingPool it lends per reservation; None: the
    # KV travels inline on the PushKv stream
    staging: Callable[[str], Any] = _none
    # Decode side: (lent ring) -> the ReserveReply fields that describe it to the sender
    describe: Callable[[Any], dict[str, Any]] = lambda ring: {}
    # Prefill side: (ReserveReply, sender's cuda device) -> the ring to write into (None: inline)
    attach: Callable[[decode_pb2.ReserveReply, int], Any] = _none

    @property
    def staged(self) -> bool:
        return self.staging is not _none

    @property
    def name(self) -> str:
        return T.KvTransport.Name(self.kind)


def same_host(a: common_pb2.WorkerInfo, b: common_pb2.WorkerInfo) -> bool:
    return bool(a.host_id) and a.host_id == b.host_id


def _discover() -> tuple[KvTransport, ...]:
    found = [
        importlib.import_module(f"{__name__}.{m.name}").TRANSPORT for m in pkgutil.iter_modules(__path__)
    ]
    return tuple(sorted(found, key=lambda t: -t.priority))


REGISTRY = _discover()
_BY_KIND = {t.kind: t for t in REGISTRY}


def by_kind(kind: int) -> KvTransport:
    return _BY_KIND[kind]


def known(kind: int) -> bool:
    return kind in _BY_KIND


def settings() -> tuple[str, ...]:
    """The kvTransfer.transport values a worker accepts."""
    return (AUTO, *(t.setting for t in REGISTRY if t.setting))


def offered_transports(setting: str, device: str) -> list[int]:
    """What a worker with this setting and its KV cache on `device` offers, best first. ValueError for an
    unknown setting, or one that forces a transport the device cannot use."""
    if setting not in settings():
        raise ValueError(f"unknown KV transport {setting!r}; one of {', '.join(settings())}")
    return [t.kind for t in REGISTRY if t.offered(setting, device)]


def offers(worker: common_pb2.WorkerInfo) -> set[int]:
    """The transports a worker offers; one that lists none speaks the gRPC stream, the protocol's baseline."""
    return set(worker.transports) or {T.KV_TRANSPORT_GRPC}


def candidates(sender: common_pb2.WorkerInfo, receiver: common_pb2.WorkerInfo) -> list[int]:
    """Every transport both offer and may pair on, best first."""
    both = offers(sender) & offers(receiver)
    return [t.kind for t in REGISTRY if t.kind in both and t.pairs(sender, receiver)]


def choose_transport(sender: common_pb2.WorkerInfo, receiver: common_pb2.WorkerInfo) -> int:
    """The best transport the two may use; KV_TRANSPORT_UNSPECIFIED when they share none."""
    return next(iter(candidates(sender, receiver)), T.KV_TRANSPORT_UNSPECIFIED)


def sender_from_reserve(
    offered: Sequence[int], host_id: str, cuda_device_uuid: str = ""
) -> common_pb2.WorkerInfo:
    """What a ReserveRequest says of the prefill worker that sent it, as the WorkerInfo pairing reads."""
    return common_pb2.WorkerInfo(
        host_id=host_id,
        transports=offered,
        shm_capable=T.KV_TRANSPORT_SHM in offered,
        cuda_device=0 if cuda_device_uuid else -1,
        cuda_device_uuid=cuda_device_uuid,
    )

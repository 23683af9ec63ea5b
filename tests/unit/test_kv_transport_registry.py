"""The KV transport registry: one module per transport, every tandem.v1 transport declared once, tried best
first; what a worker offers follows its setting and where its cache lives."""

import pytest

from tandem.v1 import common_pb2 as C
from tandem.worker.kv_transport import transports
from tandem.worker.kv_transport.transports import offered_transports


def test_every_proto_transport_has_exactly_one_module():
    kinds = [t.kind for t in transports.REGISTRY]
    assert sorted(kinds) == sorted(v for v in C.KvTransport.values() if v != C.KV_TRANSPORT_UNSPECIFIED)
    priorities = [t.priority for t in transports.REGISTRY]
    assert priorities == sorted(priorities, reverse=True) and len(set(priorities)) == len(priorities)


@pytest.mark.parametrize(
    "setting, device, offered",
    [
        ("auto", "cpu", [C.KV_TRANSPORT_SHM, C.KV_TRANSPORT_GRPC]),
        (
            "auto",
            "cuda:1",
            [C.KV_TRANSPORT_CUDA_IPC, C.KV_TRANSPORT_GRPC],
        ),  # CUDA IPC reachable from the served stack
        ("grpc", "cuda:0", [C.KV_TRANSPORT_GRPC]),
        ("shm", "cpu", [C.KV_TRANSPORT_SHM]),
    ],
)
def test_offers_follow_the_setting_and_the_device(setting, device, offered):
    assert offered_transports(setting, device) == offered


def test_settings_a_device_cannot_honour_are_refused():
    with pytest.raises(ValueError, match="CPU"):
        offered_transports("shm", "cuda:0")
    with pytest.raises(ValueError, match="unknown KV transport .rdma.; one of auto, "):
        offered_transports("rdma", "cpu")


def test_the_spec_settings_are_the_registry_settings():
    from tandem.spec_workers import Transport

    assert set(transports.settings()) == {t.value for t in Transport}


def test_inline_and_staged_transports():
    assert not transports.by_kind(C.KV_TRANSPORT_GRPC).staged
    assert (
        transports.by_kind(C.KV_TRANSPORT_SHM).staged and transports.by_kind(C.KV_TRANSPORT_CUDA_IPC).staged
    )

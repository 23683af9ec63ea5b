"""The gRPC stream: KV chunks inline on the PushKv stream. Every worker speaks it; the baseline."""

from tandem.v1 import common_pb2

from . import KvTransport

TRANSPORT = KvTransport(
    kind=common_pb2.KV_TRANSPORT_GRPC,
    priority=0,
    offered=lambda setting, device: setting in ("auto", "grpc"),
    setting="grpc",
)

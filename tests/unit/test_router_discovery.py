"""A failed worker lookup keeps the pool it last resolved to (one DNS failure must not retire every worker),
and says so in a log line and a router metric; a name the DNS answers has no addresses (a headless Service
whose pods are gone) empties its pool: the router's membership against a real gRPC worker on loopback."""

from __future__ import annotations

import logging
import socket

import pytest
from grpc import aio

from tandem import names
from tandem.v1 import common_pb2, decode_pb2_grpc
from tandem.worker.router.dispatch import GrpcBackend
from tandem.worker.router.membership import DiscoveryError, keep_last_good, resolve
from tandem.worker.router.metrics import RouterMetrics

NAME = "dns:///decode-pool.default.svc:{port}"


class _Decode(decode_pb2_grpc.DecodeServiceServicer):
    async def Handshake(self, request, context):
        return common_pb2.HandshakeReply(worker=common_pb2.WorkerInfo(worker_id="d", block_size=16))

    async def Load(self, request, context):
        return common_pb2.LoadReport(worker_id="d", total_kv_blocks=64, free_kv_blocks=64)


class FlakyDns:
    """Answers with the worker's loopback address until told to fail, as a resolver that loses its server."""

    def __init__(self, address: str) -> None:
        self.address, self.failing, self.emptied = address, False, False

    def __call__(self, name: str) -> list[str]:
        if self.failing:
            raise DiscoveryError(f"cannot resolve {name}: [Errno -3] Temporary failure in name resolution")
        return [] if self.emptied else [self.address]


def test_keep_last_good():
    assert keep_last_good(None, ["a"]) == ["a"]
    assert keep_last_good(["a", "b"], None) == ["a", "b"]
    assert keep_last_good(["a", "b"], ["c"]) == ["c"]  # an answer, even a smaller one, is the truth
    assert keep_last_good(None, None) == []


@pytest.mark.asyncio
async def test_a_failed_lookup_keeps_the_last_good_workers_and_says_so(caplog):
    server = aio.server()
    decode_pb2_grpc.add_DecodeServiceServicer_to_server(_Decode(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    name = NAME.format(port=port)
    dns = FlakyDns(f"127.0.0.1:{port}")
    backend = GrpcBackend("disaggregated", {"decode": [name]}, poll_interval_s=60)
    backend.pools.resolver = dns
    metrics = RouterMetrics("svc", backend.queue_depth, discovery_stale=backend.discovery_stale)
    try:
        await backend.start()
        assert backend.routable_workers()["decode"] == 1
        dns.failing = True
        with caplog.at_level(logging.WARNING, logger="tandem.worker.router.membership"):
            for _ in range(3):
                await backend.pools.refresh()
                await backend.pools.poll_all()
        assert backend.routable_workers()["decode"] == 1, "one failed lookup retired the pool"
        assert list(backend.pools.workers["decode"]) == [f"127.0.0.1:{port}"] and not backend.pools.retiring
        warnings = [r.getMessage() for r in caplog.records if "cannot resolve" in r.getMessage()]
        assert len(warnings) == 1 and "keeping its last 1 addresses" in warnings[0]  # once, not every poll
        exposition = metrics.registry.get_sample_value(
            names.ROUTER_DISCOVERY_STALE, {"service": "svc", "pool": "router"}
        )
        assert exposition == 1
        dns.failing = False
        await backend.pools.refresh()
        assert backend.pools.stale_names == set()
        assert (
            metrics.registry.get_sample_value(
                names.ROUTER_DISCOVERY_STALE, {"service": "svc", "pool": "router"}
            )
            == 0
        )
    finally:
        await backend.close()
        await server.stop(None)


@pytest.mark.parametrize(
    ("code", "answer"),
    [
        (socket.EAI_NONAME, []),  # NXDOMAIN: the Service has no pods (or no longer exists)
        (socket.EAI_AGAIN, DiscoveryError),  # the name server did not answer: keep the last answer
        (socket.EAI_FAIL, DiscoveryError),
    ],
)
def test_a_name_without_addresses_is_an_answer_a_failed_lookup_is_not(monkeypatch, code, answer):
    def getaddrinfo(*args, **kwargs):
        raise socket.gaierror(code, "lookup")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    if answer is DiscoveryError:
        with pytest.raises(DiscoveryError):
            resolve("dns:///decode-pool.default.svc:50051")
    else:
        assert resolve("dns:///decode-pool.default.svc:50051") == answer


@pytest.mark.asyncio
async def test_an_emptied_headless_service_empties_its_pool(caplog):
    server = aio.server()
    decode_pb2_grpc.add_DecodeServiceServicer_to_server(_Decode(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    dns = FlakyDns(f"127.0.0.1:{port}")
    backend = GrpcBackend("disaggregated", {"decode": [NAME.format(port=port)]}, poll_interval_s=60)
    backend.pools.resolver = dns
    try:
        await backend.start()
        assert backend.routable_workers()["decode"] == 1
        dns.emptied = True
        with caplog.at_level(logging.INFO, logger="tandem.worker.router.membership"):
            await backend.pools.refresh()
            await backend.pools.poll_all()
        assert backend.routable_workers()["decode"] == 0, "the pool kept a worker its Service no longer has"
        assert backend.pools.stale_names == set()
        assert any("has no addresses now" in r.getMessage() for r in caplog.records)
        dns.emptied = False
        await backend.pools.refresh()
        await backend.pools.poll_all()
        assert backend.routable_workers()["decode"] == 1
    finally:
        await backend.close()
        await server.stop(None)

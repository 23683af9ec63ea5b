"""The router's client certificate renewed in place (the service moving to a new CA): over real mutual-TLS
sockets, the router redials its workers with the new certificate without a restart, a token stream opened
before the renewal finishes on the old connection, polls of the old worker never fail, and a worker that
joins trusting only the new CA is reached. Before client reload the joining worker refused the router."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent import futures

import grpc
import pytest
from grpc import aio

from tandem.identity import Identity
from tandem.operator.certs import Authority, write_dir
from tandem.v1 import common_pb2, decode_pb2, decode_pb2_grpc
from tandem.worker.api.tls import TlsConfig
from tandem.worker.router.membership import Pools

SERVICE = "reload"
TOKENS = 30


class _Decode(decode_pb2_grpc.DecodeServiceServicer):
    def __init__(self, name: str) -> None:
        self.name = name

    async def Handshake(self, request, context):
        return common_pb2.HandshakeReply(worker=common_pb2.WorkerInfo(worker_id=self.name, block_size=16))

    async def Load(self, request, context):
        return common_pb2.LoadReport(worker_id=self.name, total_kv_blocks=64, free_kv_blocks=64)

    async def StreamTokens(self, request, context):
        for i in range(TOKENS):
            await asyncio.sleep(0.05)
            yield common_pb2.TokenEvent(request_id=request.request_id, has_token=True, token_id=i)


async def _serve(name: str, cert: bytes, key: bytes, trusted: bytes) -> tuple[aio.Server, str]:
    from tandem.worker.api.tls import add_port

    server = aio.server()
    decode_pb2_grpc.add_DecodeServiceServicer_to_server(_Decode(name), server)
    port = add_port(server, "127.0.0.1:0", TlsConfig(cert, key, trusted))  # a port no other process holds
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.asyncio
async def test_a_renewed_client_certificate_is_used_without_a_restart_and_streams_go_on(tmp_path):
    old_ca, new_ca = Authority("old CA"), Authority("new CA")
    bundle = old_ca.pem + new_ca.pem
    old_decode = old_ca.issue(Identity("decode", SERVICE))
    # the running worker trusts both CAs (the bundle is rolled out first); the one that joins, only the new
    server_a, a = await _serve("a", old_decode.cert, old_decode.key, bundle)
    new_decode = new_ca.issue(Identity("decode", SERVICE))
    server_b, b = await _serve("b", new_decode.cert, new_decode.key, new_decode.ca)
    router_dir, workers = tmp_path / "router", tmp_path / "workers.json"
    write_dir(router_dir, old_ca.issue(Identity("router", SERVICE)))
    workers.write_text(json.dumps({"decode": [a]}))
    pools = Pools({}, workers_file=str(workers), tls=TlsConfig.from_dir(router_dir, service=SERVICE))
    pools.certs.every_s = 0.0  # look at the files at every refresh
    try:
        await pools.refresh()
        await pools.poll_all()
        assert [v.routable for v in pools.views("decode")] == [True]
        worker_a = pools.workers["decode"][a]
        worker_a.in_use += 1  # as the dispatcher holds a worker for a request
        stream = worker_a.stub.StreamTokens(decode_pb2.StreamTokensRequest(request_id="open"))  # type: ignore[attr-defined]
        tokens = [(await stream.read()).token_id]
        old_channel = worker_a.channel

        # the renewal: the router's certificate from the new CA, trusting both; then worker b joins
        renewed = new_ca.issue(Identity("router", SERVICE))
        write_dir(router_dir, renewed)
        (router_dir / "ca.crt").write_bytes(bundle)
        workers.write_text(json.dumps({"decode": [a, b]}))
        unhealthy_a = 0
        for _ in range(20):
            await pools.refresh()
            await pools.poll_all()
            unhealthy_a += not pools.workers["decode"][a].view.healthy
            if all(v.routable for v in pools.views("decode")):
                break
            await asyncio.sleep(0.1)
        assert {v.address: v.routable for v in pools.views("decode")} == {a: True, b: True}, (
            "the joining worker (trusting only the new CA) was not reached with the renewed certificate"
        )
        assert pools.certs.reloads == 1
        assert unhealthy_a == 0
        assert worker_a.channel is not old_channel and [ch for _, ch in pools.renewed_away] == [old_channel]
        while (event := await stream.read()) is not aio.EOF:  # the stream opened before the renewal finishes
            tokens.append(event.token_id)
        assert tokens == list(range(TOKENS))
        worker_a.in_use -= 1
        await pools.close_retired()
        assert pools.renewed_away == []  # the old channel is closed once no request holds its worker
    finally:
        await pools.close()
        await server_a.stop(None)
        await server_b.stop(None)


class _SyncDecode(decode_pb2_grpc.DecodeServiceServicer):
    def Load(self, request, context):
        return common_pb2.LoadReport(worker_id="w", total_kv_blocks=64, free_kv_blocks=64)

    def StreamTokens(self, request, context):
        for i in range(TOKENS):
            time.sleep(0.05)
            yield common_pb2.TokenEvent(request_id=request.request_id, has_token=True, token_id=i)


def _serve_sync(cert: bytes, key: bytes, trusted: bytes) -> tuple[grpc.Server, str]:
    from tandem.worker.api.tls import add_port

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    decode_pb2_grpc.add_DecodeServiceServicer_to_server(_SyncDecode(), server)
    port = add_port(server, "127.0.0.1:0", TlsConfig(cert, key, trusted))
    server.start()
    return server, f"127.0.0.1:{port}"


def test_the_prefill_workers_decode_channels_follow_a_renewed_certificate(tmp_path):
    """The prefill to decode hop: after the renewal a decode worker trusting only the new CA is reached,
    a push-like stream open on the old channel finishes, and the old channels close at the next renewal."""
    from tandem.worker.serve.decode_channels import DecodeChannels

    old_ca, new_ca = Authority("old CA"), Authority("new CA")
    bundle = old_ca.pem + new_ca.pem
    old_decode, new_decode = (
        old_ca.issue(Identity("decode", SERVICE)),
        new_ca.issue(Identity("decode", SERVICE)),
    )
    server_a, a = _serve_sync(old_decode.cert, old_decode.key, bundle)
    server_b, b = _serve_sync(new_decode.cert, new_decode.key, new_decode.ca)
    prefill_dir = tmp_path / "prefill"
    write_dir(prefill_dir, old_ca.issue(Identity("prefill", SERVICE)))
    channels = DecodeChannels(TlsConfig.from_dir(prefill_dir, service=SERVICE))
    channels.certs.every_s = 0.0
    try:
        old_a = channels.get(a)
        stream = decode_pb2_grpc.DecodeServiceStub(old_a).StreamTokens(
            decode_pb2.StreamTokensRequest(request_id="open")
        )
        tokens = [next(stream).token_id]
        write_dir(prefill_dir, new_ca.issue(Identity("prefill", SERVICE)))
        (prefill_dir / "ca.crt").write_bytes(bundle)
        for address in (a, b):
            load = decode_pb2_grpc.DecodeServiceStub(channels.get(address)).Load(
                common_pb2.LoadRequest(), timeout=10
            )
            assert load.free_kv_blocks == 64, address
        assert (
            channels.get(a) is not old_a and channels.renewed_away == [old_a] and channels.certs.reloads == 1
        )
        tokens += [e.token_id for e in stream]  # the open stream finishes on the old channel
        assert tokens == list(range(TOKENS))
        write_dir(prefill_dir, new_ca.issue(Identity("prefill", SERVICE)))  # the renewal after
        channels.get(b)
        with pytest.raises(ValueError):  # closed
            decode_pb2_grpc.DecodeServiceStub(old_a).Load(common_pb2.LoadRequest(), timeout=5)
    finally:
        server_a.stop(None)
        server_b.stop(None)


def test_the_decode_channels_stay_bounded():
    from tandem.worker.serve.decode_channels import DecodeChannels

    channels = DecodeChannels(None, limit=2)
    first = channels.get("127.0.0.1:1")
    channels.get("127.0.0.1:2")
    assert channels.get("127.0.0.1:1") is first  # kept, and now the most recent
    channels.get("127.0.0.1:3")
    assert len(channels) == 2 and channels.get("127.0.0.1:1") is first  # 2 went, not 1

"""A worker that starts listening long after the router first dialled it is routable within a couple of
seconds of its start, over a real gRPC socket: the router's channel does not sit in gRPC's growing
reconnect backoff (which left a slow-starting replacement unreached for 15 s and cost a drain its 503s)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from grpc import aio

from tandem.v1 import common_pb2, decode_pb2_grpc
from tandem.worker.router.membership import Pools

pytestmark = pytest.mark.slow

START_AFTER_S = 10.5  # refused dials until then: gRPC's default backoff would next try 3-7 s after the start


class _Starting(decode_pb2_grpc.DecodeServiceServicer):
    async def Handshake(self, request, context):
        return common_pb2.HandshakeReply(worker=common_pb2.WorkerInfo(worker_id="late", block_size=16))

    async def Load(self, request, context):
        return common_pb2.LoadReport(worker_id="late", total_kv_blocks=64, free_kv_blocks=64)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.asyncio
async def test_a_worker_that_starts_late_is_routable_soon_after_it_listens():
    address = f"127.0.0.1:{_free_port()}"
    pools = Pools({"decode": [address]})
    await pools.refresh()
    server = aio.server()
    try:
        began = time.monotonic()
        while time.monotonic() - began < START_AFTER_S:  # the router polls a worker that is not there yet
            await pools.poll_all("decode")
            assert not pools.views("decode")[0].routable
            await asyncio.sleep(0.2)
        decode_pb2_grpc.add_DecodeServiceServicer_to_server(_Starting(), server)
        server.add_insecure_port(address)
        await server.start()
        listening = time.monotonic()
        while not pools.views("decode")[0].routable:
            assert time.monotonic() - listening < 2.5, "the router did not reach the worker once it listened"
            await asyncio.sleep(0.2)
            await pools.poll_all("decode")
        assert pools.views("decode")[0].free_kv_blocks == 64
    finally:
        await pools.close()
        await server.stop(None)

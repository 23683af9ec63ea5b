"""A worker that starts listening long after the router first dialled it is routable within a couple of
seconds of its start, over a real gRPC socket: the router's channel does not sit in gRPC's growing
reconnect backoff (which left a slow-starting replacement unreached for 15 s and cost a drain its 503s).
"Soon" is measured against a router that first dials the worker once it listens, polled beside it in the same
loop: what a busy host adds to a dial and a poll, it adds to both."""

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
BACKOFF_SLACK_S = (
    2.5  # the router's backoff is at most 1 s (+20% jitter): it dials again within this of a fresh one
)


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
    fresh = None
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
        fresh = Pools({"decode": [address]})  # dials the worker for the first time now that it listens
        await fresh.refresh()
        reached: dict[str, float] = {}
        while len(reached) < 2:
            await asyncio.gather(pools.poll_all("decode"), fresh.poll_all("decode"))
            for name, p in (("late", pools), ("fresh", fresh)):
                if name not in reached and p.views("decode")[0].routable:
                    reached[name] = time.monotonic() - listening
            assert time.monotonic() - listening < 60, (
                f"a router did not reach the listening worker: {reached}"
            )
            await asyncio.sleep(0.2)
        assert reached["late"] < reached["fresh"] + BACKOFF_SLACK_S, f"seconds after it listened: {reached}"
        assert pools.views("decode")[0].free_kv_blocks == 64
    finally:
        await pools.close()
        if fresh is not None:
            await fresh.close()
        await server.stop(None)

"""The router beside a worker that took the colocated role: over real gRPC on loopback, a disaggregated
service's colocated worker runs requests whole (the decode pool may be empty), a worker listed as decode that
reports colocated moves to the colocated pool, and in mode auto a decode worker prefills itself while the
prefill pool is empty (a collapse under way) instead of holding the request."""

from __future__ import annotations

import json
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from tandem.v1 import colocated_pb2_grpc, common_pb2, decode_pb2_grpc
from tandem.worker.api.params import SamplingParams
from tandem.worker.router.backend import Timing
from tandem.worker.router.dispatch import GrpcBackend
from tandem.worker.router.wake_queue import WakeLimits
from tests.scripted_workers import INFO, serve_on_loopback
from tests.unit.test_router_stream_ends import EndingDecode

PARAMS = SamplingParams(max_tokens=3)


def _tokens(request_id: str, first: int, n: int = 3):
    for i in range(n):
        yield common_pb2.TokenEvent(request_id=request_id, token_id=first + i, has_token=True, index=i)
    yield common_pb2.TokenEvent(request_id=request_id, finish_reason=common_pb2.FINISH_REASON_STOP, index=n)


class Colocated(colocated_pb2_grpc.ColocatedServiceServicer):
    def Handshake(self, request, context):
        info = common_pb2.WorkerInfo(worker_id="c", role=common_pb2.WORKER_ROLE_COLOCATED, **INFO)
        return common_pb2.HandshakeReply(worker=info)

    def Load(self, request, context):
        return common_pb2.LoadReport(
            worker_id="c", role=common_pb2.WORKER_ROLE_COLOCATED, free_kv_blocks=100, total_kv_blocks=100
        )

    def Generate(self, request, context):
        yield from _tokens(request.request_id, 200)


class NowColocated(EndingDecode):
    """A decode worker's service after the worker took the colocated role: its Load says so."""

    def Load(self, request, context):
        return common_pb2.LoadReport(worker_id="c", role=common_pb2.WORKER_ROLE_COLOCATED)


class LocalDecode(EndingDecode):
    """A decode worker that also prefills a prompt itself (Generate)."""

    def Generate(self, request, context):
        yield from _tokens(request.request_id, 300)


async def _run(backend: GrpcBackend) -> tuple[list[int], Timing]:
    timing = Timing()
    await backend.start()
    try:
        return [t.token_id async for t in backend.generate("req", [1, 2, 3], PARAMS, timing)], timing
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_a_colocated_worker_stands_in_for_an_empty_decode_pool():
    servers, (address,) = serve_on_loopback(
        [(colocated_pb2_grpc.add_ColocatedServiceServicer_to_server, Colocated())]
    )
    try:
        backend = GrpcBackend("disaggregated", {"colocated": [address]}, poll_interval_s=60)
        tokens, timing = await _run(backend)
        assert tokens == [200, 201, 202] and timing.prefill == "colocated" and timing.decode_worker == address
    finally:
        servers[0].stop(0)


@pytest.mark.asyncio
async def test_a_worker_listed_as_decode_that_reports_colocated_is_routed_as_colocated(tmp_path: Path):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    decode_pb2_grpc.add_DecodeServiceServicer_to_server(
        NowColocated(tokens=3, finish=common_pb2.FINISH_REASON_STOP), server
    )
    colocated_pb2_grpc.add_ColocatedServiceServicer_to_server(Colocated(), server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    workers = tmp_path / "workers.json"
    workers.write_text(json.dumps({"prefill": [], "decode": [address], "colocated": []}))
    try:
        backend = GrpcBackend("disaggregated", {}, str(workers), poll_interval_s=60, wake=WakeLimits(8, 10))
        tokens, timing = await _run(backend)
        assert tokens == [200, 201, 202] and timing.prefill == "colocated"
        assert address in backend.pools.workers["colocated"] and not backend.pools.workers["decode"]
    finally:
        server.stop(0)


@pytest.mark.asyncio
async def test_mode_auto_prefills_on_the_decode_worker_while_the_prefill_pool_is_empty():
    servers, (address,) = serve_on_loopback(
        [
            (
                decode_pb2_grpc.add_DecodeServiceServicer_to_server,
                LocalDecode(tokens=3, finish=common_pb2.FINISH_REASON_STOP),
            ),
        ]
    )
    try:
        backend = GrpcBackend(
            "auto", {"decode": [address], "prefill": []}, poll_interval_s=60, wake=WakeLimits(8, 10)
        )
        tokens, timing = await _run(backend)
        assert tokens == [300, 301, 302] and timing.prefill == "local"
    finally:
        servers[0].stop(0)

"""A worker at its concurrency limit (RESOURCE_EXHAUSTED) is not a failed worker: the router tries another one
for the same request and keeps the full one in rotation. Real gRPC on loopback to scripted workers."""

from __future__ import annotations

import grpc
import pytest

from tandem.v1 import common_pb2, decode_pb2_grpc, prefill_pb2_grpc
from tandem.worker.api.params import SamplingParams
from tandem.worker.router.backend import Timing
from tandem.worker.router.dispatch import GrpcBackend
from tests.scripted_workers import serve_on_loopback
from tests.unit.test_router_stream_ends import EndingDecode, QuickPrefill


class FullDecode(EndingDecode):
    def __init__(self) -> None:
        super().__init__(tokens=0, finish=common_pb2.FINISH_REASON_STOP)
        self.reserves = 0

    def Reserve(self, request, context):
        self.reserves += 1
        context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "decode worker at its limit of 8 token streams; try another worker",
        )


@pytest.mark.asyncio
async def test_a_full_worker_sends_the_request_to_another_and_stays_in_rotation():
    full, free = FullDecode(), EndingDecode(tokens=3, finish=common_pb2.FINISH_REASON_STOP)
    servers, addresses = serve_on_loopback(
        [
            (decode_pb2_grpc.add_DecodeServiceServicer_to_server, full),
            (decode_pb2_grpc.add_DecodeServiceServicer_to_server, free),
            (prefill_pb2_grpc.add_PrefillServiceServicer_to_server, QuickPrefill()),
        ]
    )
    backend = GrpcBackend(
        "disaggregated", {"decode": addresses[:2], "prefill": addresses[2:]}, poll_interval_s=60
    )
    await backend.start()
    try:
        for view in backend.pools.views("decode"):  # the full worker looks the emptier: picked first
            view.free_kv_blocks = 1000 if view.address == addresses[0] else 10
        timing = Timing()
        tokens = [t async for t in backend.generate("req", [1, 2, 3], SamplingParams(max_tokens=8), timing)]
        assert len(tokens) == 3 and timing.decode_worker == addresses[1] and timing.retries == 1
        assert full.reserves == 1
        assert backend.routable_workers()["decode"] == 2  # full, not failed
    finally:
        await backend.close()
        for s in servers:
            s.stop(0)

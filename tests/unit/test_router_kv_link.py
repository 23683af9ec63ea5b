"""A prefill worker that could not push KV to a decode worker names the decode side as the failure; the router
takes that decode worker out of rotation only when it cannot reach it either. Real gRPC on loopback."""

from __future__ import annotations

import grpc
import pytest

from tandem.v1 import common_pb2, decode_pb2_grpc, prefill_pb2_grpc
from tandem.worker.api.params import SamplingParams
from tandem.worker.router.backend import Timing
from tandem.worker.router.dispatch import GrpcBackend
from tests.scripted_workers import serve_on_loopback
from tests.unit.test_router_stream_ends import EndingDecode, QuickPrefill


class LinkFailsOnce(QuickPrefill):
    """Its first push fails as a broken KV link does; `before_failing` runs first (to stop the decode server)."""

    def __init__(self) -> None:
        self.calls = 0
        self.before_failing = lambda: None

    def Prefill(self, request, context):
        self.calls += 1
        if self.calls == 1:
            self.before_failing()
            context.abort(grpc.StatusCode.UNAVAILABLE, "KV transfer failed: the decode worker could not be reached")
        return super().Prefill(request, context)


async def _one_request_after_a_broken_link(stop_the_decode_worker: bool) -> tuple[GrpcBackend, Timing, list]:
    first, second = (EndingDecode(tokens=3, finish=common_pb2.FINISH_REASON_STOP) for _ in range(2))
    prefill = LinkFailsOnce()
    servers, addresses = serve_on_loopback([
        (decode_pb2_grpc.add_DecodeServiceServicer_to_server, first),
        (decode_pb2_grpc.add_DecodeServiceServicer_to_server, second),
        (prefill_pb2_grpc.add_PrefillServiceServicer_to_server, prefill),
    ])  # fmt: skip
    if stop_the_decode_worker:
        prefill.before_failing = lambda: servers[0].stop(0)
    backend = GrpcBackend("disaggregated", {"decode": addresses[:2], "prefill": addresses[2:]}, poll_interval_s=60)
    await backend.start()
    for view in backend.pools.views("decode"):  # the first decode worker looks the emptier: picked first
        view.free_kv_blocks = 1000 if view.address == addresses[0] else 10
    timing = Timing()
    tokens = [t async for t in backend.generate("req", [1, 2, 3], SamplingParams(max_tokens=8), timing)]
    assert len(tokens) == 3 and timing.retries == 1 and prefill.calls == 2
    assert timing.decode_worker == addresses[1]  # the retry goes to the other decode worker either way
    return backend, timing, servers


@pytest.mark.asyncio
@pytest.mark.parametrize("dead", [False, True], ids=["decode-worker-alive", "decode-worker-dead"])
async def test_a_broken_kv_link_fails_the_decode_worker_only_if_the_router_cannot_reach_it(dead):
    backend, _, servers = await _one_request_after_a_broken_link(stop_the_decode_worker=dead)
    try:
        assert backend.routable_workers()["decode"] == (1 if dead else 2)
        assert backend.routable_workers()["prefill"] == 1  # the prefill worker ran the prompt: it stays
    finally:
        await backend.close()
        for s in servers:
            s.stop(0)

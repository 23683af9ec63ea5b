"""A prefill worker that could not push KV to a decode worker names the decode side as the failure; the router
takes that decode worker out of rotation when it cannot reach it either, or when a push to it breaks a second
time, but not for one push that broke once. Real gRPC on loopback to scripted workers."""

from __future__ import annotations

import grpc
import pytest

from tandem.v1 import common_pb2, decode_pb2_grpc, prefill_pb2_grpc
from tandem.worker.api.params import SamplingParams
from tandem.worker.router.backend import BackendError, Timing
from tandem.worker.router.dispatch import GrpcBackend
from tests.scripted_workers import serve_on_loopback
from tests.unit.test_router_stream_ends import EndingDecode, QuickPrefill


class LinkFails(QuickPrefill):
    """Its first `times` pushes fail as a broken KV link does; `before_failing` runs first (to stop a
    server)."""

    def __init__(self, times: int) -> None:
        self.times, self.calls = times, 0
        self.before_failing = lambda: None

    def Prefill(self, request, context):
        self.calls += 1
        if self.calls <= self.times:
            self.before_failing()
            context.abort(
                grpc.StatusCode.UNAVAILABLE, "KV transfer failed: the decode worker could not be reached"
            )
        return super().Prefill(request, context)


async def _backend(decode_workers: int, prefill: LinkFails):
    decodes = [EndingDecode(tokens=3, finish=common_pb2.FINISH_REASON_STOP) for _ in range(decode_workers)]
    servers, addresses = serve_on_loopback(
        [(decode_pb2_grpc.add_DecodeServiceServicer_to_server, d) for d in decodes]
        + [(prefill_pb2_grpc.add_PrefillServiceServicer_to_server, prefill)]
    )
    pools = {"decode": addresses[:decode_workers], "prefill": addresses[decode_workers:]}
    backend = GrpcBackend("disaggregated", pools, poll_interval_s=60)
    await backend.start()
    for view in backend.pools.views("decode"):  # the first decode worker looks the emptiest: picked first
        view.free_kv_blocks = 1000 if view.address == addresses[0] else 10
    return backend, servers, addresses


@pytest.mark.asyncio
@pytest.mark.parametrize("dead", [False, True], ids=["decode-worker-alive", "decode-worker-dead"])
async def test_one_broken_kv_link_fails_the_decode_worker_only_if_the_router_cannot_reach_it(dead):
    prefill = LinkFails(times=1)
    backend, servers, addresses = await _backend(2, prefill)
    if dead:
        prefill.before_failing = lambda: servers[0].stop(0)
    try:
        timing = Timing()
        tokens = [t async for t in backend.generate("req", [1, 2, 3], SamplingParams(max_tokens=8), timing)]
        assert len(tokens) == 3 and timing.retries == 1 and prefill.calls == 2
        assert timing.decode_worker == addresses[1]  # the retry goes to the other decode worker either way
        assert backend.routable_workers()["decode"] == (1 if dead else 2)
        assert backend.routable_workers()["prefill"] == 1  # the prefill worker ran the prompt: it stays
    finally:
        await backend.close()
        for s in servers:
            s.stop(0)


@pytest.mark.asyncio
async def test_a_kv_link_that_stays_broken_fails_the_decode_worker_and_the_request_names_the_decode_side():
    prefill = LinkFails(times=100)
    backend, servers, _ = await _backend(1, prefill)
    try:
        with pytest.raises(BackendError) as err:
            [t async for t in backend.generate("req", [1, 2, 3], SamplingParams(max_tokens=8), Timing())]
        assert err.value.status == 503 and "no healthy decode worker" in str(err.value)
        assert prefill.calls == 2  # the second broken push took the decode worker out: no third
        assert backend.routable_workers() == {"prefill": 1, "decode": 0, "colocated": 0}
    finally:
        await backend.close()
        for s in servers:
            s.stop(0)

"""The router's wake queue: a request for a pool with no worker is held (bounded, timed) until the pool's
first worker answers, instead of a 503; past the bounds, 503 with Retry-After and the reason; a request
cancelled while held (its client left) leaves nothing behind. The real gRPC backend against scripted
workers on loopback that join through the workers file, as `tandem up` and DNS make them join. A retry that
finds its pool momentarily empty (its only worker began to drain for a flip) is held the same way."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from tandem import names
from tandem.v1 import common_pb2, decode_pb2_grpc, prefill_pb2_grpc
from tandem.worker.api.params import SamplingParams
from tandem.worker.router.answers import timing_headers
from tandem.worker.router.app import create_app
from tandem.worker.router.backend import COLD_START_S, BackendError, Timing
from tandem.worker.router.dispatch import GrpcBackend
from tandem.worker.router.wake_queue import TIMED_OUT_RETRY_AFTER_S, WakeLimits, WakeQueue
from tandem.worker.serve.drain import refuse_while_draining
from tests.scripted_workers import serve_on_loopback
from tests.unit.test_router_stream_ends import EndingDecode, QuickPrefill

PARAMS = SamplingParams(max_tokens=4)


async def _generate(backend: GrpcBackend, timing: Timing | None = None) -> list[int]:
    return [t.token_id async for t in backend.generate("req", [1, 2, 3], PARAMS, timing or Timing())]


def _write(path: Path, **roles: list[str]) -> None:
    path.write_text(json.dumps({"prefill": [], "decode": [], "colocated": [], **roles}))


async def _backend(tmp_path: Path, limits: WakeLimits, **roles: list[str]) -> GrpcBackend:
    workers = tmp_path / "workers.json"
    _write(workers, **roles)
    backend = GrpcBackend("disaggregated", {}, str(workers), poll_interval_s=0.2, wake=limits)
    await backend.start()
    return backend


async def _until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.02)


@pytest.fixture
def workers():
    servers, addresses = serve_on_loopback(
        [
            (
                decode_pb2_grpc.add_DecodeServiceServicer_to_server,
                EndingDecode(tokens=3, finish=common_pb2.FINISH_REASON_STOP),
            ),
            (prefill_pb2_grpc.add_PrefillServiceServicer_to_server, QuickPrefill()),
        ]
    )
    yield {"decode": [addresses[0]], "prefill": [addresses[1]]}
    for s in servers:
        s.stop(0)


@pytest.mark.asyncio
async def test_a_request_for_a_pool_at_zero_waits_for_its_first_worker(tmp_path, workers):
    backend = await _backend(tmp_path, WakeLimits(8, 30), prefill=workers["prefill"])
    try:
        assert backend.ready()  # a pool at zero keeps the router in its Service: requests wait for it
        timing = Timing()
        request = asyncio.ensure_future(_generate(backend, timing))
        await _until(lambda: backend.wake_queue.held("decode") == 1)
        assert backend.wake_queue.held("prefill") == 0 and backend.wake_queue.oldest_s("decode") > 0
        await asyncio.sleep(0.5)
        assert not request.done()  # held, not refused
        _write(tmp_path / "workers.json", **workers)  # the autoscaler started the first decode worker
        assert await asyncio.wait_for(request, 10) == [100, 101, 102]
        assert timing.extra[COLD_START_S] >= 0.5
        assert int(timing_headers(timing)[names.COLD_START_HEADER]) >= 500
        assert len(backend.wake_queue) == 0
        warm = Timing()
        await _generate(backend, warm)
        assert COLD_START_S not in warm.extra and names.COLD_START_HEADER not in timing_headers(warm)
    finally:
        await backend.close()


class SlowFirstLoad(EndingDecode):
    """A worker that introduces itself at once but takes a while over its first load report."""

    def __init__(self) -> None:
        super().__init__(tokens=3, finish=common_pb2.FINISH_REASON_STOP)
        self.loads = 0

    def Load(self, request, context):
        self.loads += 1
        if self.loads == 1:
            time.sleep(0.6)
        return super().Load(request, context)


@pytest.mark.asyncio
async def test_a_worker_that_introduced_itself_but_has_not_reported_its_load_is_still_waking(
    tmp_path, workers
):
    """Between its Handshake and its first Load answer a new worker is neither failed nor routable: the held
    request keeps waiting for it instead of ending its hold on a 503."""
    servers, addresses = serve_on_loopback(
        [(decode_pb2_grpc.add_DecodeServiceServicer_to_server, SlowFirstLoad())]
    )
    backend = await _backend(tmp_path, WakeLimits(8, 30), prefill=workers["prefill"])
    try:
        request = asyncio.ensure_future(_generate(backend))
        await _until(lambda: backend.wake_queue.held("decode") == 1)
        _write(tmp_path / "workers.json", prefill=workers["prefill"], decode=addresses)
        assert await asyncio.wait_for(request, 10) == [100, 101, 102]
    finally:
        await backend.close()
        for s in servers:
            s.stop(0)


class FlipsAway(EndingDecode):
    """The only decode worker, whose flip to prefill begins as a request reaches it: it refuses the
    reservation as a draining worker does, and reports draining from then on."""

    def __init__(self) -> None:
        super().__init__(tokens=3, finish=common_pb2.FINISH_REASON_STOP)
        self.draining = False

    def Reserve(self, request, context):
        self.draining = True
        refuse_while_draining(context, "decode worker")

    def Load(self, request, context):
        return common_pb2.LoadReport(
            worker_id="d", free_kv_blocks=100, total_kv_blocks=100, draining=self.draining
        )


@pytest.mark.asyncio
async def test_a_retry_finding_its_pool_momentarily_empty_is_held_until_a_worker_joins_it(tmp_path, workers):
    """A flip's window: the decode pool's only worker begins to drain under a request, and the worker that
    takes its place has not joined the pool yet. The retry is held, not refused, and served once it joins."""
    servers, (leaving,) = serve_on_loopback(
        [(decode_pb2_grpc.add_DecodeServiceServicer_to_server, FlipsAway())]
    )
    backend = await _backend(tmp_path, WakeLimits(8, 30), prefill=workers["prefill"], decode=[leaving])
    try:
        await _until(lambda: backend.routable_workers()["decode"] == 1)
        timing = Timing()
        request = asyncio.ensure_future(_generate(backend, timing))
        await _until(lambda: backend.wake_queue.held("decode") == 1)  # its first attempt was refused: held
        await asyncio.sleep(0.5)  # polls come and go; the pool has no routable worker yet
        assert not request.done() and backend.routable_workers()["decode"] == 0
        _write(tmp_path / "workers.json", prefill=workers["prefill"], decode=[leaving, *workers["decode"]])
        assert await asyncio.wait_for(request, 10) == [100, 101, 102]
        assert timing.retries == 1 and timing.decode_worker == workers["decode"][0]
        assert len(backend.wake_queue) == 0
    finally:
        await backend.close()
        for s in servers:
            s.stop(0)


@pytest.mark.asyncio
async def test_both_pools_at_zero_wake_together(tmp_path, workers):
    backend = await _backend(tmp_path, WakeLimits(8, 30))
    try:
        request = asyncio.ensure_future(_generate(backend))
        await _until(
            lambda: backend.wake_queue.held("decode") == 1 and backend.wake_queue.held("prefill") == 1
        )
        _write(tmp_path / "workers.json", **workers)
        assert await asyncio.wait_for(request, 10) == [100, 101, 102]
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_past_the_bound_a_request_is_refused_with_retry_after_and_the_reason(tmp_path):
    backend = await _backend(tmp_path, WakeLimits(2, 60))
    try:
        held = [asyncio.ensure_future(_generate(backend)) for _ in range(2)]
        await _until(lambda: len(backend.wake_queue) == 2)
        with pytest.raises(BackendError) as refused:
            await _generate(backend)
        e = refused.value
        assert e.status == 503 and "2 requests already wait" in str(e) and "maxRequests 2" in str(e)
        assert e.retry_after_s == TIMED_OUT_RETRY_AFTER_S  # 60 s left to the oldest hold: come back sooner
        for h in held:
            h.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        assert len(backend.wake_queue) == 0 and backend.inflight == 0
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_a_pool_that_does_not_wake_in_time_is_a_503_with_retry_after(tmp_path):
    backend = await _backend(tmp_path, WakeLimits(4, 0.3))
    try:
        with pytest.raises(BackendError) as timed_out:
            await _generate(backend)
        assert timed_out.value.status == 503 and timed_out.value.retry_after_s == TIMED_OUT_RETRY_AFTER_S
        assert "no decode or prefill worker came up within 0.3 s" in str(timed_out.value)
        assert len(backend.wake_queue) == 0
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_a_pool_whose_workers_failed_is_refused_at_once_not_held(tmp_path, workers):
    backend = await _backend(tmp_path, WakeLimits(8, 30), **workers)
    try:
        await _until(lambda: backend.routable_workers()["decode"] == 1)
        for w in backend.pools.workers["decode"].values():
            w.mark_failed()  # it answered once: a failure, not a pool waking
        started = asyncio.get_running_loop().time()
        with pytest.raises(BackendError, match="no healthy decode worker"):
            await _generate(backend)
        assert asyncio.get_running_loop().time() - started < 1 and len(backend.wake_queue) == 0
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_no_hold_refuses_at_once_and_an_empty_pool_is_then_not_ready(tmp_path):
    backend = await _backend(tmp_path, WakeLimits(0, 30))
    try:
        assert not backend.ready()
        with pytest.raises(BackendError) as refused:
            await _generate(backend)
        assert refused.value.status == 503 and refused.value.retry_after_s
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_over_http_the_held_count_is_a_metric_and_a_leaving_client_leaves_no_hold(tmp_path, tok):
    backend = await _backend(tmp_path, WakeLimits(8, 30))
    app = create_app(backend, tok, "tiny")
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
            body = {"model": "tiny", "prompt": "hi", "max_tokens": 4}
            request = asyncio.ensure_future(c.post("/v1/completions", json=body))
            await _until(lambda: len(backend.wake_queue) == 1)
            metrics = (await c.get("/metrics")).text
            assert (
                f'{names.ROUTER_HELD_REQUESTS}{{pool="router",role="decode",service="default"}} 1.0'
                in metrics
            )
            request.cancel()  # the client gives up
            await asyncio.gather(request, return_exceptions=True)
            await _until(lambda: len(backend.wake_queue) == 0)
            metrics = (await c.get("/metrics")).text
            assert (
                f'{names.ROUTER_HELD_REQUESTS}{{pool="router",role="decode",service="default"}} 0.0'
                in metrics
            )
            assert backend.inflight == 0 and app.state.admission.in_flight == 0
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_the_queue_on_its_own_counts_each_pool_and_forgets_a_cancelled_hold():
    queue, up = WakeQueue(WakeLimits(4, 30)), set()
    a = asyncio.ensure_future(queue.hold(["decode", "prefill"], up.__contains__))
    b = asyncio.ensure_future(queue.hold(["decode"], up.__contains__))
    await _until(lambda: len(queue) == 2)
    assert (queue.held("decode"), queue.held("prefill"), queue.held("colocated")) == (2, 1, 0)
    up.add("decode")
    assert await asyncio.wait_for(b, 2) > 0
    assert queue.held("decode") == 1 and not a.done()  # still waits for prefill
    a.cancel()
    await asyncio.gather(a, return_exceptions=True)
    assert len(queue) == 0 and queue.oldest_s("decode") == 0.0
    assert await queue.hold(["decode"], up.__contains__) == 0.0  # nothing to wait for: no hold at all


@pytest.mark.asyncio
async def test_a_full_queue_says_come_back_when_the_oldest_hold_ends_at_the_latest():
    now = [0.0]
    queue = WakeQueue(WakeLimits(1, 30), clock=lambda: now[0])
    held = asyncio.ensure_future(queue.hold(["decode"], lambda role: False))
    await _until(lambda: len(queue) == 1)
    now[0] = 28.2
    with pytest.raises(BackendError) as refused:
        await queue.hold(["decode"], lambda role: False)
    assert refused.value.retry_after_s == 2  # the oldest hold gives up within 1.8 s
    held.cancel()
    await asyncio.gather(held, return_exceptions=True)
    assert len(queue) == 0

"""The router's gRPC backend tells the decode worker at once when a request ends early (the client left,
or prefill failed), over real gRPC on loopback to scripted workers that never answer on their own."""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures

import grpc
import pytest

from tandem.v1 import common_pb2, decode_pb2, decode_pb2_grpc, prefill_pb2_grpc
from tandem.worker.api.params import SamplingParams
from tandem.worker.router.backend import Timing
from tandem.worker.router.dispatch import GrpcBackend
from tests.scripted_workers import INFO, ScriptedDecode


class StuckDecode(ScriptedDecode):
    """Reserves, then streams nothing until its stream is cancelled; records aborts."""

    def __init__(self) -> None:
        self.aborts: list[decode_pb2.AbortRequest] = []
        self.aborted = threading.Event()

    def Reserve(self, request, context):
        return decode_pb2.ReserveReply(block_ids=[1, 2], epoch=1)

    def StreamTokens(self, request, context):
        while context.is_active():
            yield from ()
            threading.Event().wait(0.05)

    def Abort(self, request, context):
        self.aborts.append(request)
        self.aborted.set()
        return decode_pb2.AbortReply(found=True, blocks_freed=2)


class StuckPrefill(prefill_pb2_grpc.PrefillServiceServicer):
    def __init__(self) -> None:
        self.called = threading.Event()

    def Handshake(self, request, context):
        info = common_pb2.WorkerInfo(worker_id="p", role=common_pb2.WORKER_ROLE_PREFILL, **INFO)
        return common_pb2.HandshakeReply(worker=info)

    def Load(self, request, context):
        return common_pb2.LoadReport(worker_id="p")

    def Prefill(self, request, context):
        self.called.set()
        while context.is_active():
            threading.Event().wait(0.05)
        context.abort(grpc.StatusCode.CANCELLED, "cancelled")


@pytest.fixture
def workers():
    decode, prefill = StuckDecode(), StuckPrefill()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    decode_pb2_grpc.add_DecodeServiceServicer_to_server(decode, server)
    d_port = server.add_insecure_port("127.0.0.1:0")
    p_server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    prefill_pb2_grpc.add_PrefillServiceServicer_to_server(prefill, p_server)
    p_port = p_server.add_insecure_port("127.0.0.1:0")
    server.start()
    p_server.start()
    yield decode, prefill, f"127.0.0.1:{d_port}", f"127.0.0.1:{p_port}"
    server.stop(0)
    p_server.stop(0)


@pytest.mark.asyncio
async def test_a_request_closed_before_its_first_token_aborts_the_decode_reservation(workers):
    decode, prefill, d_addr, p_addr = workers
    backend = GrpcBackend("disaggregated", {"prefill": [p_addr], "decode": [d_addr]}, poll_interval_s=60)
    await backend.start()
    try:
        tokens = backend.generate("req-1", [1, 2, 3], SamplingParams(max_tokens=4), Timing())
        first = asyncio.ensure_future(anext(tokens))
        assert await asyncio.to_thread(prefill.called.wait, 10), "the prefill worker was never asked"
        first.cancel()  # the client went away while the prompt is being prefilled
        with pytest.raises(asyncio.CancelledError):
            await first
        await tokens.aclose()
        assert await asyncio.to_thread(decode.aborted.wait, 5), "the decode worker was not told"
        assert [a.request_id for a in decode.aborts] == ["req-1"] and decode.aborts[0].transfer_id
    finally:
        await backend.close()

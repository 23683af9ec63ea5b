"""A worker's gRPC bounds: sized from the engine's batch, work RPCs past them refused at once with
RESOURCE_EXHAUSTED while control RPCs still answer, and every slot given back however its RPC ends; over a
real gRPC server on loopback."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from tandem.v1 import common_pb2, decode_pb2, decode_pb2_grpc
from tandem.worker.serve.rpc_limits import RpcLimiter, RpcLimits, rpc_class, rpc_limits


def test_bounds_follow_the_engine_batch():
    assert rpc_limits(64) == RpcLimits(streams=128, transfers=64)
    assert rpc_limits(1) == RpcLimits(streams=2, transfers=4)
    assert rpc_limits(64, streams=10, transfers=3).threads == 10 + 10 + 3 + RpcLimits(1, 1).control
    assert rpc_class("/tandem.v1.DecodeService/StreamTokens") == "streams"
    assert rpc_class("/tandem.v1.ColocatedService/Generate") == "streams"
    assert (
        rpc_class("/tandem.v1.DecodeService/PushKv") == "pushes"
    )  # after a Reserve, never refused for a Reserve
    assert rpc_class("/tandem.v1.PrefillService/Prefill") == "transfers"
    for control in ("Load", "Abort", "Handshake", "Drain", "Check"):
        assert rpc_class(f"/x.S/{control}") is None


class Streaming(decode_pb2_grpc.DecodeServiceServicer):
    """Token streams that send one event, then hold until released; Reserve that fails or succeeds on
    demand."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def StreamTokens(self, request, context):
        yield common_pb2.TokenEvent(request_id=request.request_id, has_token=True)
        self.release.wait(30)

    def Reserve(self, request, context):
        if request.request_id == "bad":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad request")
        return decode_pb2.ReserveReply(epoch=1)

    def Load(self, request, context):
        return common_pb2.LoadReport(worker_id="w")

    def Handshake(self, request, context):  # a slow control call, to keep every pool thread busy
        self.release.wait(30)
        return common_pb2.HandshakeReply()


@pytest.fixture
def served():
    limits = RpcLimits(streams=3, transfers=2, control=2)
    limiter = RpcLimiter(limits)
    servicer = Streaming()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=limits.threads), interceptors=[limiter])
    decode_pb2_grpc.add_DecodeServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield decode_pb2_grpc.DecodeServiceStub(channel), limiter, servicer
    servicer.release.set()
    channel.close()
    server.stop(0)


def _wait(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_streams_past_the_bound_are_refused_and_control_still_answers(served):
    stub, limiter, servicer = served
    calls = [
        stub.StreamTokens(decode_pb2.StreamTokensRequest(request_id=f"r{i}"), timeout=30) for i in range(3)
    ]
    for call in calls:
        next(call)  # each one holds a slot and a thread
    with pytest.raises(grpc.RpcError) as refused:
        next(stub.StreamTokens(decode_pb2.StreamTokensRequest(request_id="r3"), timeout=5))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limit of 3 concurrent streams" in refused.value.details()
    started = time.monotonic()
    for _ in range(10):  # more control calls than control threads, one after another, none queued
        assert stub.Load(common_pb2.LoadRequest(), timeout=5).worker_id == "w"
    assert time.monotonic() - started < 5
    assert stub.Reserve(decode_pb2.ReserveRequest(request_id="ok"), timeout=5).epoch == 1  # its own class
    calls[0].cancel()  # a client leaving gives its slot back
    _wait(lambda: limiter.slots["streams"].in_use == 2)
    servicer.release.set()  # the others end normally
    for call in calls[1:]:
        list(call)
    _wait(lambda: limiter.slots["streams"].in_use == 0)


def test_a_failing_rpc_gives_its_slot_back(served):
    stub, limiter, _ = served
    for _ in range(5):  # more failures than slots: each one gave its slot back
        with pytest.raises(grpc.RpcError) as e:
            stub.Reserve(decode_pb2.ReserveRequest(request_id="bad"), timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    _wait(lambda: limiter.slots["transfers"].in_use == 0)


def test_streams_cancelled_while_waiting_for_a_thread_hold_no_slot(served):
    stub, limiter, servicer = served
    threads = limiter.limits.threads
    busy = [stub.Handshake.future(common_pb2.HandshakeRequest(), timeout=30) for _ in range(threads)]
    time.sleep(0.5)  # every pool thread is taken
    queued = [
        stub.StreamTokens(decode_pb2.StreamTokensRequest(request_id=f"q{i}"), timeout=30) for i in range(5)
    ]
    time.sleep(0.5)  # they arrived and wait for a thread
    for call in queued:
        call.cancel()
    time.sleep(0.3)
    servicer.release.set()
    for f in busy:
        f.result(timeout=30)
    servicer.release.clear()
    _wait(lambda: limiter.slots["streams"].in_use == 0)
    calls = [
        stub.StreamTokens(decode_pb2.StreamTokensRequest(request_id=f"r{i}"), timeout=30) for i in range(3)
    ]
    for call in calls:  # the whole bound is free again
        next(call)
    servicer.release.set()
    for call in calls:
        list(call)

"""A Reserve whose StreamTokens never comes (the router crashed or gave up between the two) expires with its
lease: blocks, reservation and token queue go, and a drain that began meanwhile finishes instead of waiting
out its deadline. A decode worker with a real engine, over real gRPC on loopback."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health

from tandem.v1 import common_pb2 as C
from tandem.v1 import decode_pb2, decode_pb2_grpc
from tandem.worker.api.params import SamplingParams
from tandem.worker.api.wire import params_to_proto
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.runner.engine_loop import EngineLoop
from tandem.worker.serve.decode import DecodeServicer, add_to_server
from tandem.worker.serve.drain import Drainer
from tandem.worker.serve.wire import worker_info

LEASE_MS = 600


@pytest.fixture
def decode_worker(tiny_model_dir):
    engine = Engine(load_model(tiny_model_dir), EngineConfig(block_size=16, num_kv_blocks=32))
    loop = EngineLoop(engine).start()
    servicer = DecodeServicer(
        loop, worker_info(engine, "decode-0", "decode", "tiny", [C.KV_TRANSPORT_GRPC]), expire_every_s=0.05
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add_to_server(server, servicer)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield decode_pb2_grpc.DecodeServiceStub(channel), servicer
    finally:
        channel.close()
        server.stop(None)
        servicer.close()
        loop.stop()


def _reserve(stub, n: int) -> decode_pb2.ReserveReply:
    return stub.Reserve(
        decode_pb2.ReserveRequest(
            transfer_id=f"t{n}",
            request_id=f"r{n}",
            prompt_token_ids=list(range(1, 40)),
            sampling=params_to_proto(SamplingParams(max_tokens=4)),
            lease_ms=LEASE_MS,
            transports=[C.KV_TRANSPORT_GRPC],
        ),
        timeout=10,
    )


def test_unclaimed_token_queues_expire_at_their_deadline():
    from tandem.worker.serve.decode import Output, unclaimed_expired

    outputs = {"a": Output(None, 5.0), "b": Output(None, None), "c": Output(None, 9.0)}  # type: ignore[arg-type]
    assert unclaimed_expired(outputs, 4.9) == []
    assert unclaimed_expired(outputs, 5.0) == ["a"]
    assert unclaimed_expired(outputs, 100.0) == ["a", "c"]  # a stream reads b: only its end drops it


def test_a_reservation_never_streamed_expires_and_does_not_hold_the_drain(decode_worker):
    stub, servicer = decode_worker
    for n in range(3):
        assert _reserve(stub, n).block_ids
    assert servicer.busy() > 0 and servicer.loop.call(lambda e: e.blocks.num_used) > 0
    drainer = Drainer(servicer, health.HealthServicer(), timeout_s=60)
    drainer.begin("test")
    started = time.monotonic()
    drained = threading.Event()
    threading.Thread(target=lambda: drainer.wait_drained(poll_s=0.02) and drained.set(), daemon=True).start()
    assert drained.wait(LEASE_MS / 1000 + 10), f"still held: {servicer.busy()}"
    assert time.monotonic() - started < LEASE_MS / 1000 + 10
    assert servicer.busy() == 0 and servicer.loop.call(lambda e: e.blocks.num_used) == 0
    assert servicer.receiver.table.reserved_blocks() == 0
    with pytest.raises(grpc.RpcError) as e:  # the router came back too late: told so, not left waiting
        next(stub.StreamTokens(decode_pb2.StreamTokensRequest(request_id="r0"), timeout=5))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_an_abort_before_the_stream_opens_drops_the_token_queue(decode_worker):
    stub, servicer = decode_worker
    _reserve(stub, 7)
    reply = stub.Abort(
        decode_pb2.AbortRequest(transfer_id="t7", request_id="r7", reason="client left"), timeout=5
    )
    assert reply.found and reply.blocks_freed > 0
    assert servicer.busy() == 0 and servicer.loop.call(lambda e: e.blocks.num_used) == 0

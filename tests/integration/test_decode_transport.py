"""The decode worker grants the KV transport `reserve_transport` decides, over real gRPC on loopback: forced
transports are honoured, and a reservation with no transport in common is refused with its blocks freed."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from tandem.v1 import common_pb2 as C
from tandem.v1 import decode_pb2, decode_pb2_grpc
from tandem.worker.api.params import SamplingParams
from tandem.worker.api.wire import params_to_proto
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.runner.engine_loop import EngineLoop
from tandem.worker.kv_transport.grpc_stream import BULK_CHANNEL_OPTIONS
from tandem.worker.kv_transport.staging import StagingPool, StagingRing
from tandem.worker.serve.decode import DecodeServicer, add_to_server
from tandem.worker.serve.wire import offered_transports, worker_info

NUM_BLOCKS = 32


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return load_model(tiny_model_dir)


@pytest.fixture
def decode_worker(tiny_model, request):
    """A decode worker started with `--kv-transport <param>`; yields (stub, servicer)."""
    engine = Engine(tiny_model, EngineConfig(block_size=16, num_kv_blocks=NUM_BLOCKS))
    loop = EngineLoop(engine).start()
    transports = offered_transports(request.param, "cpu")
    info = worker_info(engine, "decode-0", "decode", "tiny", transports)
    staging = (
        {C.KV_TRANSPORT_SHM: StagingPool([StagingRing.create_shm(1 << 20)])}
        if C.KV_TRANSPORT_SHM in transports
        else None
    )
    servicer = DecodeServicer(loop, info, staging)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=BULK_CHANNEL_OPTIONS)
    add_to_server(server, servicer)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield decode_pb2_grpc.DecodeServiceStub(channel), servicer
    finally:
        channel.close()
        server.stop(None)
        servicer.close()  # unlinks the staging rings too
        loop.stop()


def _reserve(stub, transfer_id: str, transports: list[int], same_host: bool, servicer: DecodeServicer):
    host = servicer.info.host_id if same_host else "another-host"
    return stub.Reserve(
        decode_pb2.ReserveRequest(
            transfer_id=transfer_id,
            request_id="r-" + transfer_id,
            prompt_token_ids=list(range(1, 40)),
            sampling=params_to_proto(SamplingParams(max_tokens=4)),
            lease_ms=5000,
            transports=transports,
            prefill_host_id=host,
        ),
        timeout=10,
    )


def _used_blocks(servicer: DecodeServicer) -> int:
    return servicer.loop.call(lambda e: e.blocks.num_used)


AUTO = [C.KV_TRANSPORT_SHM, C.KV_TRANSPORT_GRPC]


def _handshake(stub, servicer: DecodeServicer, transports: list[int]) -> C.HandshakeReply:
    """What the decode worker says to a prefill worker on its host that offers `transports`."""
    peer = C.WorkerInfo()
    peer.CopyFrom(servicer.info)
    peer.role, peer.worker_id = C.WORKER_ROLE_PREFILL, "prefill-0"
    del peer.transports[:]
    peer.transports.extend(transports)
    peer.shm_capable = C.KV_TRANSPORT_SHM in transports
    return stub.Handshake(C.HandshakeRequest(peer=peer), timeout=10)


@pytest.mark.parametrize("decode_worker", ["auto"], indirect=True)
def test_auto_grants_shared_memory_on_one_host_and_the_stream_across_hosts(decode_worker):
    stub, servicer = decode_worker
    reply = _handshake(stub, servicer, AUTO)
    assert (reply.transport, list(reply.problems)) == (C.KV_TRANSPORT_SHM, [])
    assert _reserve(stub, "t1", AUTO, True, servicer).transport == C.KV_TRANSPORT_SHM
    assert _reserve(stub, "t2", AUTO, False, servicer).transport == C.KV_TRANSPORT_GRPC
    # the only ring is lent to t1: a prefill worker that also speaks gRPC gets the stream
    assert _reserve(stub, "t3", AUTO, True, servicer).transport == C.KV_TRANSPORT_GRPC


@pytest.mark.parametrize("decode_worker", ["grpc"], indirect=True)
def test_forced_grpc_never_grants_shared_memory(decode_worker):
    stub, servicer = decode_worker
    assert _handshake(stub, servicer, AUTO).transport == C.KV_TRANSPORT_GRPC
    reply = _handshake(stub, servicer, [C.KV_TRANSPORT_SHM])
    assert reply.transport == C.KV_TRANSPORT_UNSPECIFIED and "no KV transport in common" in reply.problems[0]
    assert _reserve(stub, "t1", AUTO, True, servicer).transport == C.KV_TRANSPORT_GRPC
    with pytest.raises(grpc.RpcError) as e:
        _reserve(stub, "t2", [C.KV_TRANSPORT_SHM], True, servicer)  # a prefill worker forced to shm
    assert (
        e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        and "no KV transport in common" in e.value.details()
    )
    assert _used_blocks(servicer) == 3  # t1's blocks only: the refused reservation gave its blocks back


@pytest.mark.parametrize("decode_worker", ["shm"], indirect=True)
def test_forced_shm_is_granted_on_one_host_only_and_never_falls_back(decode_worker):
    stub, servicer = decode_worker
    assert _reserve(stub, "t1", AUTO, True, servicer).transport == C.KV_TRANSPORT_SHM
    with pytest.raises(grpc.RpcError) as e:
        _reserve(stub, "t2", AUTO, False, servicer)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as e:  # the one ring is lent: no stream to fall back to
        _reserve(stub, "t3", AUTO, True, servicer)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _used_blocks(servicer) == 3 and servicer.num_pending == 1

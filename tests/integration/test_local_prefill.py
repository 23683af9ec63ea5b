"""A decode worker prefills a prompt itself (DecodeService.Generate) over real gRPC on loopback: its greedy
tokens are the engine's, and an Abort, a client that goes away or a drain free or refuse it as tightly as
the disaggregated path."""

from __future__ import annotations

import time
from concurrent import futures

import grpc
import pytest

from tandem import names
from tandem.v1 import common_pb2 as C
from tandem.v1 import decode_pb2, decode_pb2_grpc
from tandem.worker.api.params import SamplingParams
from tandem.worker.api.wire import params_to_proto
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.runner.engine_loop import EngineLoop
from tandem.worker.serve.decode import DecodeServicer, add_to_server
from tandem.worker.serve.wire import offered_transports, worker_info

NUM_BLOCKS = 64
LONG_PROMPT = [10 + i % 400 for i in range(600)]  # 38 blocks, prefilled 16 tokens a step


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return load_model(tiny_model_dir)


@pytest.fixture
def decode_worker(tiny_model):
    engine = Engine(
        tiny_model, EngineConfig(block_size=16, num_kv_blocks=NUM_BLOCKS, prefill_chunk_tokens=16)
    )
    loop = EngineLoop(engine).start()
    info = worker_info(engine, "decode-0", "decode", "tiny", offered_transports("grpc", "cpu"))
    servicer = DecodeServicer(loop, info)
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


def _generate(stub, request_id: str, prompt: list[int], max_tokens: int):
    sampling = params_to_proto(SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    return stub.Generate(
        C.GenerateRequest(request_id=request_id, prompt_token_ids=prompt, sampling=sampling), timeout=60
    )


def _used_blocks(servicer: DecodeServicer) -> int:
    return servicer.loop.call(lambda e: e.blocks.num_used)


def _until(check, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_local_prefill_streams_the_engines_greedy_tokens(decode_worker, tiny_model):
    stub, servicer = decode_worker
    prompt = LONG_PROMPT[:100]
    events = list(_generate(stub, "r1", prompt, 12))
    tokens = [e.token_id for e in events if e.has_token]
    reference = Engine(tiny_model, EngineConfig(block_size=16, num_kv_blocks=NUM_BLOCKS))
    reference.add_request(prompt, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True), "ref")
    expected: list[int] = []
    while reference.has_work():
        expected += [o.token_id for o in reference.step() if o.request_id == "ref"]
    assert tokens == expected and len(tokens) == 12
    assert [e.index for e in events if e.has_token] == list(range(12))
    assert events[-1].finish_reason == C.FINISH_REASON_LENGTH
    _until(lambda: _used_blocks(servicer) == 0 and servicer.busy() == 0, "blocks held after the stream ended")


def test_abort_of_a_local_prefill_frees_its_blocks(decode_worker):
    stub, servicer = decode_worker
    call = _generate(stub, "r-abort", LONG_PROMPT, 200)
    _until(lambda: _used_blocks(servicer) > 0, "the prompt never took blocks")
    reply = stub.Abort(decode_pb2.AbortRequest(request_id="r-abort", reason="client went away"), timeout=10)
    assert reply.found
    events = list(call)
    assert events[-1].finish_reason == C.FINISH_REASON_ABORT
    _until(
        lambda: _used_blocks(servicer) == 0 and servicer.busy() == 0,
        "an aborted local prefill kept its blocks",
    )


def test_a_caller_that_goes_away_mid_prefill_frees_the_blocks(decode_worker):
    stub, servicer = decode_worker
    call = _generate(stub, "r-gone", LONG_PROMPT, 200)
    _until(lambda: _used_blocks(servicer) > 0, "the prompt never took blocks")
    call.cancel()  # what the router does when its client leaves
    _until(
        lambda: _used_blocks(servicer) == 0 and servicer.busy() == 0,
        "a cancelled local prefill kept its blocks",
    )


def test_a_draining_decode_worker_refuses_local_prefills_with_the_draining_marker(decode_worker):
    stub, servicer = decode_worker
    servicer.draining = True
    with pytest.raises(grpc.RpcError) as e:
        list(_generate(stub, "r-late", LONG_PROMPT[:20], 4))
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (names.DRAINING_METADATA_KEY, "1") in tuple(e.value.trailing_metadata() or ())
    assert _used_blocks(servicer) == 0

"""Liveness follows the engine itself: a worker whose engine steps fail one after another (a broken device) or
whose loop has stopped is NOT_SERVING on the liveness service, so the kubelet restarts it; one bad step is
not enough. A real engine loop behind a real health server on loopback."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tandem import names
from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.loading import load_model
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.runner.engine_loop import EngineLoop
from tandem.worker.serve.health import FAILED_STEPS_LIMIT, HealthWatch, engine_problem

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_engine_problem():
    assert engine_problem(True, 0.4, 0) is None
    assert engine_problem(True, 0.4, FAILED_STEPS_LIMIT - 1) is None  # one bad request is not a broken device
    assert "failed" in engine_problem(True, 0.4, FAILED_STEPS_LIMIT)
    assert "stopped" in engine_problem(False, 0.0, 0)
    assert "come round" in engine_problem(True, 121.0, 0, stall_s=120)


@pytest.fixture
def watched(tiny_model_dir):
    engine = Engine(load_model(tiny_model_dir), EngineConfig(block_size=16, num_kv_blocks=64))
    loop = EngineLoop(engine).start()
    servicer = health.HealthServicer()
    draining = [False]
    watch = HealthWatch(loop, servicer, lambda: draining[0], every_s=60)  # checked by hand below
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = health_pb2_grpc.HealthStub(channel)

    def status(service: str = names.WORKER_LIVENESS_SERVICE) -> int:
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status

    yield loop, watch, status, draining
    channel.close()
    server.stop(0)
    loop.stop()


def test_failing_steps_turn_liveness_off(watched):
    loop, watch, status, _ = watched
    watch.start()
    assert status() == SERVING and status("") == SERVING

    def broken_step():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    loop.engine.step = broken_step  # the device is gone: every step fails from now on
    for i in range(FAILED_STEPS_LIMIT):
        stream = loop.submit([1, 2, 3], SamplingParams(max_tokens=4), f"r{i}")
        end = next(EngineLoop.iterate(stream, timeout_s=30))
        assert getattr(end, "error", "").startswith("engine step failed")
        watch.check()
        expected = NOT_SERVING if i + 1 >= FAILED_STEPS_LIMIT else SERVING
        assert status() == expected, f"after {i + 1} failed steps"
    assert status("") == NOT_SERVING


def test_a_stopped_loop_is_not_live_and_a_drain_is_not_ready(watched):
    loop, watch, status, draining = watched
    watch.start()
    draining[0] = True
    watch.check()
    assert status("") == NOT_SERVING and status() == SERVING  # draining: finishing its work, not dead
    loop.stop()
    watch.check()
    assert status() == NOT_SERVING

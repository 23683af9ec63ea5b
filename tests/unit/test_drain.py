"""Drain-safe exit, the pure and in-process parts: the Drain RPC over a real loopback gRPC server, health
turning NOT_SERVING at once, waiting for held work, the deadline; and which local worker is removed."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tandem import names
from tandem.launch import drain_timeout_seconds, termination_grace_seconds
from tandem.operator.local.scale import pick_victims
from tandem.spec import InferenceServiceSpec
from tandem.v1 import lifecycle_pb2, lifecycle_pb2_grpc
from tandem.worker.serve.drain import Drainer, add_to_server


class Held:
    """A servicer holding `n` pieces of work."""

    def __init__(self, n: int):
        self.draining, self.n = False, n

    def busy(self) -> int:
        return self.n


@pytest.fixture
def served():
    servicer, health_servicer = Held(2), health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(names.WORKER_LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    drainer = Drainer(servicer, health_servicer, timeout_s=30)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add_to_server(server, drainer)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield servicer, drainer, channel
    channel.close()
    server.stop(0)


def _health(channel, service: str = "") -> int:
    request = health_pb2.HealthCheckRequest(service=service)
    return health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status


def test_drain_rpc_turns_not_serving_at_once_and_waits_for_held_work(served):
    servicer, drainer, channel = served
    assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
    reply = lifecycle_pb2_grpc.LifecycleServiceStub(channel).Drain(
        lifecycle_pb2.DrainRequest(reason="test"), timeout=5
    )
    assert reply.draining and reply.busy == 2 and 0 < reply.deadline_s <= 30
    assert servicer.draining
    assert _health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
    # liveness stays up: the kubelet must not restart a worker that is finishing its requests
    assert _health(channel, names.WORKER_LIVENESS_SERVICE) == health_pb2.HealthCheckResponse.SERVING
    done = threading.Event()
    threading.Thread(target=lambda: drainer.wait_drained(poll_s=0.01) and done.set(), daemon=True).start()
    assert not done.wait(0.3), "exited while work was still held"
    servicer.n = 0
    assert done.wait(5)


def test_second_drain_reports_progress_and_keeps_the_first_deadline(served):
    servicer, drainer, channel = served
    stub = lifecycle_pb2_grpc.LifecycleServiceStub(channel)
    first = stub.Drain(lifecycle_pb2.DrainRequest(), timeout=5)
    servicer.n = 1
    second = stub.Drain(lifecycle_pb2.DrainRequest(), timeout=5)
    assert second.busy == 1 and second.deadline_s <= first.deadline_s


def test_deadline_cuts_a_drain_short():
    now = [100.0]
    servicer = Held(1)
    drainer = Drainer(servicer, health.HealthServicer(), timeout_s=5, clock=lambda: now[0])
    drainer.begin("SIGTERM")
    now[0] = 105.0
    assert drainer.wait_drained(poll_s=0) is False
    assert servicer.busy() == 1


@pytest.mark.parametrize(
    "running, count, expected",
    [
        ({"decode-0": 3, "decode-1": 1, "decode-2": 2}, 1, ["decode-1"]),
        ({"decode-0": 2, "decode-1": 2}, 1, ["decode-1"]),  # equals: the newest goes
        ({"decode-0": 0, "decode-1": None}, 1, ["decode-1"]),  # not answering (starting) goes first
        ({"prefill-9": 0, "prefill-10": 0}, 1, ["prefill-10"]),  # numeric, not lexical, order
        ({"decode-0": 5, "decode-1": 0, "decode-2": 1}, 2, ["decode-1", "decode-2"]),
        ({"decode-0": 1}, 0, []),
    ],
)
def test_pick_victims_prefers_the_emptiest_worker(running, count, expected):
    assert pick_victims(running, count) == expected


def test_drain_timeout_covers_the_longest_generation_the_spec_allows():
    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"source": {"path": "m"}, "servedName": "m", "maxContextLength": 1000},
            "slo": {"tpotMs": 20, "ttftMs": 500},
        }
    )
    # 1000 tokens x 100 ms = 100 s, + 30 s lease
    assert drain_timeout_seconds(spec) == 130
    assert drain_timeout_seconds(spec) * 1000 > spec.model.max_context_length * spec.slo.tpot_ms
    assert termination_grace_seconds(spec) > drain_timeout_seconds(spec)
    longer = spec.model_copy(update={"model": spec.model.model_copy(update={"max_context_length": 2000})})
    assert drain_timeout_seconds(longer) > drain_timeout_seconds(spec)


SIGNAL_ON_ANOTHER_THREAD = """
import signal, sys, threading, time
from grpc_health.v1 import health
from tandem.worker.serve.drain import Drainer

class Idle:
    draining = False
    def busy(self):
        return 0

drainer = Drainer(Idle(), health.HealthServicer(), timeout_s=5)
signal.signal(signal.SIGTERM, lambda signum, frame: drainer.begin("SIGTERM"))
# the kernel may hand a process-directed SIGTERM to any thread: here, on purpose, to one that is not main
threading.Thread(
    target=lambda: (time.sleep(0.3), signal.pthread_kill(threading.get_ident(), signal.SIGTERM))
).start()
print("drained" if drainer.wait_drained() else "deadline", flush=True)
"""


def test_sigterm_taken_by_another_thread_still_starts_the_drain():
    """A worker's main thread waits for the drain; a SIGTERM the kernel delivers to one of its gRPC or torch
    threads must still run the handler, or the worker never drains and never exits."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", SIGNAL_ON_ANOTHER_THREAD], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "drained"

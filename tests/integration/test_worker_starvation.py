"""A worker holding as many token streams as clients open still answers its probes and load reports at once:
work RPCs past the worker's bound are refused with RESOURCE_EXHAUSTED instead of queueing for a thread, and
health has its own server. A real `tandem worker` process on loopback, more streams than the 64 threads it
used to serve everything from.

"At once" is judged by what the worker holds, not by a clock: every probe and load report is answered while
every stream it took is still held (none ended, so no queued stream started). A probe queued behind the
streams would be answered only once one ended, or not within its generous deadline."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem import names
from tandem.operator.local.stack import free_port_block
from tandem.v1 import common_pb2, decode_pb2_grpc
from tandem.worker.api.params import SamplingParams
from tandem.worker.api.wire import params_to_proto

pytestmark = pytest.mark.slow

CLIENTS = 80  # more than the 64 threads a worker used to serve everything from
MAX_RUNNING = 4  # so the worker takes 8 token streams at once
ANSWER_TIMEOUT_S = 30.0  # a hang, not slowness: a starved probe waits for a stream to end


@pytest.fixture
def decode_worker(tiny_model_dir, tmp_path):
    port = free_port_block(4)
    log = open(tmp_path / "worker.log", "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tandem",
            "worker",
            "--role",
            "decode",
            "--model-dir",
            str(tiny_model_dir),
            "--served-name",
            "tiny",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--num-kv-blocks",
            "512",
            "--max-running",
            str(MAX_RUNNING),
            "--kv-transport",
            "grpc",
            "--port",
            str(port),
            "--health-port",
            str(port + 1),
            "--drain-timeout",
            "2",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 600  # a hang, not slowness: a busy host starts a worker slowly
        while "READY" not in (tmp_path / "worker.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.1)
        yield f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"
    finally:
        proc.kill()
        proc.wait()
        log.close()


def _generate(stub, i: int, opened: list, refused: list, stop: threading.Event) -> None:
    request = common_pb2.GenerateRequest(
        request_id=f"r{i}",
        prompt_token_ids=[1, 2, 3, 4 + i],
        sampling=params_to_proto(SamplingParams(max_tokens=4000, ignore_eos=True)),
    )
    call = stub.Generate(request, timeout=120)
    try:
        for _ in call:
            opened.append(i)
            stop.wait()
            break
    except grpc.RpcError as e:
        refused.append((e.code(), e.details()))
    finally:
        call.cancel()


def test_probes_and_load_reports_answer_at_once_with_every_stream_taken(decode_worker):
    address, health_address = decode_worker
    channel, probe_channel = grpc.insecure_channel(address), grpc.insecure_channel(health_address)
    stub = decode_pb2_grpc.DecodeServiceStub(channel)
    opened: list[int] = []
    refused: list[tuple] = []
    stop = threading.Event()
    pool = futures.ThreadPoolExecutor(CLIENTS)
    try:
        for i in range(CLIENTS):
            pool.submit(_generate, stub, i, opened, refused, stop)
        taken = 2 * MAX_RUNNING  # streams the worker holds: the running batch, and as many queued
        deadline = time.monotonic() + 60
        while (len(opened) < MAX_RUNNING or len(refused) < CLIENTS - taken) and time.monotonic() < deadline:
            time.sleep(0.05)
        health = health_pb2_grpc.HealthStub(probe_channel)
        same_port = health_pb2_grpc.HealthStub(channel)
        held = (MAX_RUNNING, taken - MAX_RUNNING)  # (running, queued) while no stream has ended
        report = stub.Load(common_pb2.LoadRequest(), timeout=ANSWER_TIMEOUT_S)
        assert (report.running_sequences, report.waiting_sequences) == held
        for _ in range(5):
            for probe, service in ((health, ""), (health, names.WORKER_LIVENESS_SERVICE), (same_port, "")):
                reply = probe.Check(health_pb2.HealthCheckRequest(service=service), timeout=ANSWER_TIMEOUT_S)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
            report = stub.Load(common_pb2.LoadRequest(), timeout=ANSWER_TIMEOUT_S)
            # answered while the worker still holds every stream: no stream ended to free a thread for it
            assert (report.running_sequences, report.waiting_sequences) == held
        # a client past the bound is refused at once, naming the limit (the router tries another worker)
        assert len(opened) == MAX_RUNNING and len(refused) == CLIENTS - taken, (
            f"{opened} streaming, {len(refused)} refused"
        )
        assert {code for code, _ in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert all("try another worker" in details for _, details in refused)
    finally:
        stop.set()
        pool.shutdown(wait=True)
        channel.close()
        probe_channel.close()

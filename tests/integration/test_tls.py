"""Mutual TLS on every gRPC hop, with real handshakes on loopback: a stack whose router, prefill and decode
workers share one CA serves requests, and every worker port refuses a plaintext client, a TLS client
without a certificate, and a client whose certificate another CA signed."""

from __future__ import annotations

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.v1 import common_pb2, decode_pb2_grpc, prefill_pb2_grpc
from tests.integration.stacks import running_stack, spec
from tests.tls_certs import Ca

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tls")
    ca, rogue = Ca(), Ca("someone else's CA")
    return {
        "stack": ca.write_dir(root / "stack", "tandem"),
        "client": ca.write_dir(root / "client", "a client of ours"),
        "rogue": rogue.write_dir(root / "rogue", "a client of theirs"),
        "ca": ca.pem,
    }


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory, certs):
    obj = spec("tls", tiny_model_dir)
    obj["spec"]["security"] = {"tls": {"dir": str(certs["stack"])}}
    with running_stack(obj, tmp_path_factory.mktemp("tls-stack")) as s:
        yield s


def _worker_addresses(stack) -> list[tuple[str, str]]:
    return [(p.role, p.address) for p in stack[0].plans if p.role in ("prefill", "decode")]


def _creds(d) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        (d / "ca.crt").read_bytes(), (d / "tls.key").read_bytes(), (d / "tls.crt").read_bytes()
    )


def _load(role: str, channel: grpc.Channel) -> common_pb2.LoadReport:
    stub = (prefill_pb2_grpc.PrefillServiceStub if role == "prefill" else decode_pb2_grpc.DecodeServiceStub)(channel)
    return stub.Load(common_pb2.LoadRequest(), timeout=5)


def test_requests_flow_over_mutual_tls(stack):
    _, url = stack
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": "tiny", "prompt": "Hello over TLS " * 8, "max_tokens": 8, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 200, r.text  # router -> decode (Reserve), router -> prefill, prefill -> decode (KV)
    assert r.json()["usage"]["completion_tokens"] >= 1


def test_a_client_with_a_certificate_of_our_ca_is_served(stack, certs):
    for role, address in _worker_addresses(stack):
        with grpc.secure_channel(address, _creds(certs["client"])) as ch:
            assert _load(role, ch).total_kv_blocks > 0


@pytest.mark.parametrize("client", ["plaintext", "no-certificate", "rogue-ca"])
def test_every_worker_port_refuses_a_client_without_a_valid_certificate(stack, certs, client):
    def dial(address: str) -> grpc.Channel:
        if client == "plaintext":
            return grpc.insecure_channel(address)
        if client == "no-certificate":
            return grpc.secure_channel(address, grpc.ssl_channel_credentials(certs["ca"]))
        return grpc.secure_channel(address, _creds(certs["rogue"]))

    for role, address in _worker_addresses(stack):
        with dial(address) as ch, pytest.raises(grpc.RpcError) as err:
            _load(role, ch)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, (role, client, err.value)
        with dial(address) as ch, pytest.raises(grpc.RpcError):
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)


def test_the_plaintext_probe_port_serves_health_and_nothing_else(tiny_model_dir, certs, tmp_path):
    import subprocess
    import sys
    import time

    from tandem.operator.local.up import free_port_block

    port = free_port_block(2)
    argv = [sys.executable, "-m", "tandem", "worker", "--role", "decode", "--model-dir", str(tiny_model_dir),
            "--host", "127.0.0.1", "--port", str(port), "--health-port", str(port + 1), "--num-kv-blocks", "64",
            "--threads", "1", "--tls-dir", str(certs["stack"])]
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "READY" not in (tmp_path / "worker.log").read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.3)
        with grpc.insecure_channel(f"127.0.0.1:{port + 1}") as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as err:
                _load("decode", ch)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch, pytest.raises(grpc.RpcError):
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

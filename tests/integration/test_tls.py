"""Mutual TLS on every gRPC hop, on by default, with real handshakes on loopback: `tandem up` of a spec that
says nothing about security issues its own CA and per-role certificates, serves requests over them, and every
worker port refuses a plaintext client, a TLS client without a certificate, and one whose certificate another
CA signed; each caller may call only what its role needs (PERMISSION_DENIED otherwise)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem import names
from tandem.identity import Identity, peer_name
from tandem.operator.certs import Authority, write_dir, write_local
from tandem.operator.local.flip import dial_worker
from tandem.v1 import (
    common_pb2,
    decode_pb2,
    decode_pb2_grpc,
    lifecycle_pb2,
    lifecycle_pb2_grpc,
    prefill_pb2,
    prefill_pb2_grpc,
)
from tests.integration.stacks import metric, running_stack, spec

pytestmark = pytest.mark.slow
SERVICE = "tls"


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    state = tmp_path_factory.mktemp("tls-stack")
    with running_stack(spec(SERVICE, tiny_model_dir), state) as s:
        yield s[0], s[1], state / "tls"


def _workers(stack) -> list[tuple[str, str]]:
    return [(p.role, p.address) for p in stack[0].plans if p.role in ("prefill", "decode")]


def _dial(address: str, certs, as_role: str, to_role: str) -> grpc.Channel:
    """A channel with the run's certificate of `as_role`, asking the server for `to_role`'s."""
    return dial_worker(address, to_role, SERVICE, certs, as_role)


def _load(role: str, channel: grpc.Channel) -> common_pb2.LoadReport:
    stub = (prefill_pb2_grpc.PrefillServiceStub if role == "prefill" else decode_pb2_grpc.DecodeServiceStub)(
        channel
    )
    return stub.Load(common_pb2.LoadRequest(), timeout=5)


def test_every_connection_a_first_request_takes_is_open_before_it(stack):
    """Once the router routes to a worker, before any request: its channel to each worker is connected (TLS
    handshake done), and the prefill worker's KV channel to the decode worker too (the router named one to the
    other before either was routable). First in this module: the stack has served nothing yet."""
    _, url, _ = stack
    deadline = time.monotonic() + 60
    while not all(metric(url, names.ROUTER_ROUTABLE_WORKERS, role=r) == 1 for r in ("prefill", "decode")):
        assert time.monotonic() < deadline, "the router never routed to both workers"
        time.sleep(0.2)
    assert metric(url, names.ROUTER_KV_PAIRS_CONNECTED) == 1
    assert metric(url, names.REQUEST_ARRIVALS_TOTAL) == 0
    for role in ("prefill", "decode"):
        assert metric(url, names.ROUTER_CONNECTED_WORKERS, role=role) == 1


def test_only_the_router_names_a_decode_worker_for_a_prefill_worker_to_dial(stack):
    certs = stack[2]
    addresses = dict(_workers(stack))
    named = common_pb2.HandshakeRequest(peer_address=addresses["decode"])
    for who in ("decode", "prefill", "operator"):
        with _dial(addresses["prefill"], certs, who, "prefill") as ch:
            _denied(lambda: prefill_pb2_grpc.PrefillServiceStub(ch).Handshake(named, timeout=10))
    with _dial(addresses["prefill"], certs, "router", "prefill") as ch:
        stub = prefill_pb2_grpc.PrefillServiceStub(ch)
        assert stub.Handshake(named, timeout=10).peer_connected
        assert not stub.Handshake(common_pb2.HandshakeRequest(), timeout=10).peer_connected  # none named
        with pytest.raises(grpc.RpcError) as err:  # a gRPC scheme, not a worker's host:port
            stub.Handshake(common_pb2.HandshakeRequest(peer_address="unix:/tmp/x"), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_requests_flow_over_mutual_tls_by_default(stack):
    _, url, certs = stack
    assert {d.name for d in certs.iterdir()} >= {"router", "prefill", "decode", "operator"}
    assert all("--tls-dir" in p.argv for p in stack[0].plans)
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": "tiny", "prompt": "Hello over TLS " * 8, "max_tokens": 8, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 200, (
        r.text
    )  # router -> decode (Reserve), router -> prefill, prefill -> decode (KV)
    assert r.json()["usage"]["completion_tokens"] >= 1


def test_the_stacks_own_identity_reads_load(stack):
    for role, address in _workers(stack):
        with _dial(address, stack[2], "operator", role) as ch:
            assert _load(role, ch).total_kv_blocks > 0


@pytest.mark.parametrize("client", ["plaintext", "no-certificate", "rogue-ca"])
def test_every_worker_port_refuses_a_client_without_a_valid_certificate(stack, tmp_path, client):
    certs = stack[2]
    rogue = write_dir(tmp_path / "rogue", Authority("someone else's CA").issue(Identity("router", SERVICE)))

    def dial(address: str, role: str) -> grpc.Channel:
        name = [("grpc.ssl_target_name_override", peer_name(role, SERVICE))]
        if client == "plaintext":
            return grpc.insecure_channel(address)
        if client == "no-certificate":
            return grpc.secure_channel(
                address, grpc.ssl_channel_credentials((certs / "router" / "ca.crt").read_bytes()), name
            )
        return grpc.secure_channel(
            address,
            grpc.ssl_channel_credentials(
                (certs / "router" / "ca.crt").read_bytes(),
                (rogue / "tls.key").read_bytes(),
                (rogue / "tls.crt").read_bytes(),
            ),
            name,
        )

    for role, address in _workers(stack):
        with dial(address, role) as ch, pytest.raises(grpc.RpcError) as err:
            _load(role, ch)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, (role, client, err.value)
        with dial(address, role) as ch, pytest.raises(grpc.RpcError):
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)


def test_a_client_refuses_a_server_with_another_roles_certificate(stack):
    """What stops a prefill worker (or anything holding its key) posing as a decode worker to the router."""
    (address,) = [a for r, a in _workers(stack) if r == "prefill"]
    with _dial(address, stack[2], "router", "decode") as ch, pytest.raises(grpc.RpcError) as err:
        _load("prefill", ch)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def _denied(call) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value


def test_each_role_may_call_only_what_it_needs(stack):
    certs = stack[2]
    addresses = dict(_workers(stack))
    prefill_request = prefill_pb2.PrefillRequest(
        request_id="x", prompt_token_ids=[1, 2, 3], decode_address=addresses["decode"]
    )
    reserve = decode_pb2.ReserveRequest(request_id="x", transfer_id="t", prompt_token_ids=[1, 2, 3])
    for who in ("decode", "prefill", "operator"):  # only the router asks for a prefill
        with _dial(addresses["prefill"], certs, who, "prefill") as ch:
            _denied(lambda: prefill_pb2_grpc.PrefillServiceStub(ch).Prefill(prefill_request, timeout=5))
    for who in ("prefill", "decode", "operator"):  # only the router reserves, streams, aborts
        with _dial(addresses["decode"], certs, who, "decode") as ch:
            stub = decode_pb2_grpc.DecodeServiceStub(ch)
            _denied(lambda s=stub: s.Reserve(reserve, timeout=5))
            _denied(
                lambda s=stub: next(s.StreamTokens(decode_pb2.StreamTokensRequest(request_id="x"), timeout=5))
            )
            _denied(lambda s=stub: s.Abort(decode_pb2.AbortRequest(request_id="x"), timeout=5))
    for who in ("router", "decode"):  # only a prefill worker pushes KV (and commits)
        with _dial(addresses["decode"], certs, who, "decode") as ch:
            push = ch.stream_unary(
                "/tandem.v1.DecodeService/PushKv", request_serializer=bytes, response_deserializer=bytes
            )
            _denied(lambda push=push: push(iter([b""]), timeout=5))
    for who, role in (
        ("router", "decode"),
        ("prefill", "decode"),
        ("decode", "prefill"),
    ):  # Drain: operator or self
        with _dial(addresses[role], certs, who, role) as ch:
            _denied(
                lambda: lifecycle_pb2_grpc.LifecycleServiceStub(ch).Drain(
                    lifecycle_pb2.DrainRequest(), timeout=5
                )
            )
    with _dial(addresses["decode"], certs, "router", "decode") as ch:  # and the router still may
        assert (
            decode_pb2_grpc.DecodeServiceStub(ch)
            .Abort(decode_pb2.AbortRequest(request_id="x"), timeout=5)
            .found
            is False
        )


def _start_worker(tiny_model_dir, tmp_path, tls_dir, port):
    argv = [
        sys.executable,
        "-m",
        "tandem",
        "worker",
        "--role",
        "decode",
        "--model-dir",
        str(tiny_model_dir),
        "--service",
        "solo",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--health-port",
        str(port + 1),
        "--num-kv-blocks",
        "64",
        "--threads",
        "1",
        "--tls-dir",
        str(tls_dir),
    ]
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while "READY" not in (tmp_path / "worker.log").read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
        time.sleep(0.3)
    return proc, log


def test_the_plaintext_probe_port_serves_health_and_a_worker_drains_only_for_itself(tiny_model_dir, tmp_path):
    from tandem.operator.local.stack import free_port_block

    certs = write_local(tmp_path / "tls", "solo", ("decode", "router"))
    port = free_port_block(2)
    proc, log = _start_worker(tiny_model_dir, tmp_path, certs / "decode", port)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port + 1}") as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as err:
                _load("decode", ch)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch, pytest.raises(grpc.RpcError):
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        # the preStop hook: `tandem drain` in the pod, with the pod's own certificate, over loopback
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "tandem",
                "drain",
                "--address",
                f"127.0.0.1:{port}",
                "--tls-dir",
                str(certs / "decode"),
                "--tls-server-name",
                peer_name("decode", "solo"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0 and "drain" in out.stdout, out.stdout + out.stderr
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()


def test_a_renewed_certificate_is_served_without_a_restart_and_streams_go_on(tiny_model_dir, tmp_path):
    """cert-manager renews a worker's certificate in place: new connections get the new one, while requests
    keep flowing and a stream open across the renewal finishes."""
    import ssl
    import threading

    from cryptography import x509

    ca = Authority("renewing CA")
    certs = tmp_path / "certs"
    for role in ("router", "prefill", "decode"):
        write_dir(certs / role, ca.issue(Identity(role, "renew"), ("127.0.0.1",)))
    obj = spec("renew", tiny_model_dir)
    obj["spec"]["security"] = {"tls": {"dir": str(certs)}}

    def served_serial(address: str) -> int:
        ctx = ssl.create_default_context(cafile=str(certs / "router" / "ca.crt"))
        ctx.load_cert_chain(certs / "router" / "tls.crt", certs / "router" / "tls.key")
        ctx.set_alpn_protocols(["h2"])
        host, port = address.rsplit(":", 1)
        with (
            socket.create_connection((host, int(port)), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname=peer_name("decode", "renew")) as tls,
        ):
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number

    with running_stack(obj, tmp_path / "stack") as (stack, url):
        decode = next(p.address for p in stack.plans if p.role == "decode")
        before = served_serial(decode)
        codes: list[int] = []
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(timeout=60) as c:
                while not stop.is_set():
                    codes.append(
                        c.post(
                            f"{url}/v1/completions",
                            json={"model": "tiny", "prompt": "renew " * 20, "max_tokens": 4},
                        ).status_code
                    )

        with httpx.stream(
            "POST",
            f"{url}/v1/completions",
            timeout=120,
            json={
                "model": "tiny",
                "prompt": "a long answer",
                "max_tokens": 48,
                "stream": True,
                "ignore_eos": True,
            },
        ) as streaming:
            lines = streaming.iter_lines()
            assert next(lines).startswith("data: ")  # the stream is open
            worker = threading.Thread(target=load)
            worker.start()
            renewed = ca.issue(Identity("decode", "renew"), ("127.0.0.1",))
            write_dir(certs / "decode", renewed)
            after = x509.load_pem_x509_certificate(renewed.cert).serial_number
            deadline = time.monotonic() + 30
            while served_serial(decode) != after:
                assert time.monotonic() < deadline, "the worker still serves the old certificate"
                time.sleep(0.2)
            rest = [line for line in lines if line.startswith("data: ")]
            served_before = len(codes)
            while len(codes) <= served_before:  # at least one request served wholly after the renewal
                assert time.monotonic() < deadline + 60 and worker.is_alive(), codes
                time.sleep(0.1)
            stop.set()
            worker.join(timeout=120)
        assert before != after and rest[-1] == "data: [DONE]"
        assert codes and set(codes) == {200}, codes

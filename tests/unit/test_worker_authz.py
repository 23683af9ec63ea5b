"""Who may call what on a worker (pure): the router starts work, a prefill worker pushes KV, Drain comes from
the operator or the worker's own pod, and a caller of another service or without an identity gets nothing."""

from __future__ import annotations

import pytest

from tandem.identity import Identity, from_sans, parse_uri
from tandem.worker.serve.authz import CALLERS, allowed, is_loopback

DECODE = Identity("decode", "llama")
PREFILL = Identity("prefill", "llama")
ROUTER = Identity("router", "llama")
OPERATOR = Identity("operator")


@pytest.mark.parametrize("method", ["Reserve", "StreamTokens", "Generate", "Abort"])
def test_only_the_router_starts_or_stops_work_on_a_decode_worker(method):
    m = f"/tandem.v1.DecodeService/{method}"
    assert allowed(m, ROUTER, DECODE, loopback=False)
    for caller in (PREFILL, Identity("decode", "llama"), OPERATOR, Identity("router", "other"), None):
        assert not allowed(m, caller, DECODE, loopback=True), caller


def test_only_a_prefill_worker_of_the_same_service_pushes_kv():
    m = "/tandem.v1.DecodeService/PushKv"
    assert allowed(m, PREFILL, DECODE, loopback=False)
    for caller in (ROUTER, OPERATOR, Identity("prefill", "other"), None):
        assert not allowed(m, caller, DECODE, loopback=False), caller


def test_drain_from_the_operator_or_the_workers_own_pod():
    m = "/tandem.v1.LifecycleService/Drain"
    assert allowed(m, OPERATOR, DECODE, loopback=False)
    assert allowed(m, DECODE, DECODE, loopback=True)  # preStop, with the pod's own certificate
    assert not allowed(m, DECODE, DECODE, loopback=False)  # another decode pod
    assert not allowed(m, ROUTER, DECODE, loopback=True)
    assert not allowed(m, PREFILL, DECODE, loopback=True)


def test_every_identity_of_the_service_reads_load_and_health_and_unknown_methods_are_refused():
    for m in (
        "/tandem.v1.DecodeService/Load",
        "/grpc.health.v1.Health/Check",
        "/tandem.v1.DecodeService/Handshake",
    ):
        assert all(allowed(m, c, DECODE, loopback=False) for c in (ROUTER, PREFILL, OPERATOR))
        assert not allowed(m, Identity("router", "other"), DECODE, loopback=False)
    assert not allowed(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", ROUTER, DECODE, False
    )
    assert "/tandem.v1.PrefillService/Prefill" in CALLERS


def test_identities_parse_from_certificate_names_only_when_unambiguous():
    assert parse_uri(ROUTER.uri) == ROUTER and parse_uri(OPERATOR.uri) == OPERATOR
    assert parse_uri("spiffe://tandem.internal/service/x/role/admin") is None
    assert parse_uri("spiffe://elsewhere/service/x/role/router") is None
    assert from_sans([ROUTER.uri, "router.llama.tandem.internal"]) == ROUTER
    assert from_sans([ROUTER.uri, PREFILL.uri]) is None  # a certificate naming two roles is neither


@pytest.mark.parametrize(
    ("peer", "local"),
    [
        ("ipv4:127.0.0.1:5000", True),
        ("ipv6:[::1]:5000", True),
        ("ipv4:10.0.0.7:5000", False),
        ("unix:/tmp/s", False),
    ],
)
def test_loopback_peers(peer, local):
    assert is_loopback(peer) is local

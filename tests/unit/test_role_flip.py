"""A worker's role as state, the pure and in-process parts: identities naming every flippable role, who may
call SetRole, the switch draining the old role's work before opening the new one (over a real loopback gRPC
server), the router placing a worker by the role it reports, and metrics following the pool."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tandem import names
from tandem.identity import FLIPPABLE, Identity, from_sans
from tandem.operator.certs import Authority, worker_identity
from tandem.v1 import common_pb2, lifecycle_pb2, lifecycle_pb2_grpc
from tandem.worker.api.tls import TlsConfig
from tandem.worker.router.membership import Pools, placed_role
from tandem.worker.serve.authz import allowed
from tandem.worker.serve.drain import Drainer, add_to_server
from tandem.worker.serve.roles import DrainTimedOut, RoleRefused, RoleSwitch, refusal
from tandem.worker.serve.wire import ROLES

FLIP = Identity.of(FLIPPABLE, "llama")
PREFILL, DECODE, ROUTER, OPERATOR = (
    Identity("prefill", "llama"),
    Identity("decode", "llama"),
    Identity("router", "llama"),
    Identity("operator"),
)
SET_ROLE = "/tandem.v1.LifecycleService/SetRole"


def test_one_certificate_names_the_worker_roles_of_one_service_and_no_other_mix():
    assert FLIP.roles == {"prefill", "decode", "colocated"}
    assert FLIP == Identity("decode", "llama", frozenset({"prefill", "colocated"}))
    assert from_sans([*FLIP.uris, *FLIP.dns_names]) == FLIP
    older = Identity.of({"prefill", "decode"}, "llama")  # issued before a worker could flip to colocated
    assert from_sans(older.uris) == older
    assert from_sans([PREFILL.uri, Identity("decode", "other").uri]) is None  # two services: neither
    assert from_sans([ROUTER.uri, PREFILL.uri]) is None  # the router never flips
    assert from_sans([PREFILL.uri, DECODE.uri, ROUTER.uri]) is None
    assert from_sans([OPERATOR.uri, PREFILL.uri]) is None


def test_a_flippable_workers_certificate_is_read_back_as_both_roles():
    leaf = Authority("test").issue(worker_identity("prefill", "llama", flippable=True))
    assert TlsConfig(leaf.cert, leaf.key, leaf.ca).identity() == FLIP
    one = Authority("test").issue(worker_identity("prefill", "llama", flippable=False))
    assert TlsConfig(one.cert, one.key, one.ca).identity() == PREFILL
    assert worker_identity("router", "llama", flippable=True) == ROUTER


def test_set_role_from_the_operator_or_the_workers_own_pod_only():
    assert allowed(SET_ROLE, OPERATOR, FLIP, loopback=False)
    assert allowed(SET_ROLE, FLIP, FLIP, loopback=True)  # its own pod, with its own certificate
    assert not allowed(SET_ROLE, FLIP, FLIP, loopback=False)  # another flippable worker
    for caller in (ROUTER, PREFILL, DECODE, Identity.of(FLIPPABLE, "other"), None):
        assert not allowed(SET_ROLE, caller, FLIP, loopback=True), caller


def test_a_caller_naming_both_roles_may_do_what_either_may():
    assert allowed("/tandem.v1.DecodeService/PushKv", FLIP, FLIP, loopback=False)
    assert not allowed("/tandem.v1.DecodeService/PushKv", DECODE, FLIP, loopback=False)
    assert not allowed(
        "/tandem.v1.DecodeService/Reserve", FLIP, FLIP, loopback=False
    )  # still only the router


def test_why_a_role_is_refused():
    both = {"prefill": 0, "decode": 0}
    assert refusal("decode", "prefill", both, frozenset(FLIPPABLE), exiting=False) is None
    assert refusal("decode", "prefill", both, None, exiting=False) is None  # plaintext: nothing to check
    assert "certificate does not name" in (
        refusal("decode", "prefill", both, frozenset({"prefill"}), False) or ""
    )
    assert "draining to exit" in (refusal("decode", "prefill", both, None, exiting=True) or "")
    assert "cannot take" in (refusal("decode", "colocated", {"colocated": 0}, None, False) or "")
    assert refusal("colocated", "decode", {**both, "colocated": 0}, frozenset(FLIPPABLE), False) is None


class Service:
    """One role's service holding `held` pieces of work, with its own load report."""

    def __init__(self, role: str, held: int = 0):
        self.role, self.held, self.draining, self.active = role, held, False, False

    def busy(self) -> int:
        return self.held

    def own_load(self) -> common_pb2.LoadReport:
        return common_pb2.LoadReport(role=ROLES[self.role], draining=self.draining)

    def activate(self, active: bool) -> None:
        self.active = active


def switch(
    prefill_held: int = 0, certified=None, **kw
) -> tuple[RoleSwitch, Service, Service, health.HealthServicer]:
    p, d, h = Service("prefill", prefill_held), Service("decode"), health.HealthServicer()
    info = common_pb2.WorkerInfo(role=common_pb2.WORKER_ROLE_PREFILL)
    return RoleSwitch({"prefill": p, "decode": d}, "prefill", info, h, certified, **kw), p, d, h


def status(h: health.HealthServicer, role: str) -> int:
    return h.Check(
        health_pb2.HealthCheckRequest(service=names.WORKER_ROLE_SERVICE_PREFIX + role), None
    ).status


def test_a_flip_waits_for_the_old_roles_work_then_opens_the_new_role():
    roles, p, d, h = switch(prefill_held=1)
    assert (p.draining, d.draining, p.active, d.active) == (False, True, True, False)
    done: list = []
    t = threading.Thread(target=lambda: done.append(roles.set_role("decode")))
    t.start()
    time.sleep(0.2)
    assert p.draining and not done and roles.role == "prefill"  # no new prefills; the held one finishes
    assert roles.load().draining and roles.load().role == common_pb2.WORKER_ROLE_PREFILL
    p.held = 0
    t.join(5)
    (flip,) = done
    assert (flip.previous, flip.role, roles.role) == ("prefill", "decode", "decode") and flip.drain_s >= 0.2
    assert (p.draining, d.draining, p.active, d.active) == (True, False, False, True)
    assert (
        roles.info.role == common_pb2.WORKER_ROLE_DECODE
        and roles.load().role == common_pb2.WORKER_ROLE_DECODE
    )
    assert status(h, "decode") == health_pb2.HealthCheckResponse.SERVING
    assert status(h, "prefill") == health_pb2.HealthCheckResponse.NOT_SERVING
    assert roles.set_role("decode").drain_s == 0  # already: at once


def test_a_drain_past_its_deadline_keeps_the_old_role_taking_work():
    roles, p, d, _ = switch(prefill_held=1)
    with pytest.raises(DrainTimedOut, match="stays prefill"):
        roles.set_role("decode", drain_timeout_s=0.1)
    assert roles.role == "prefill" and not p.draining and d.draining


def test_a_worker_moves_to_colocated_and_back_draining_each_role_it_leaves():
    p, d, c = Service("prefill"), Service("decode", held=1), Service("colocated")
    info = common_pb2.WorkerInfo(role=common_pb2.WORKER_ROLE_DECODE)
    roles = RoleSwitch({"prefill": p, "decode": d, "colocated": c}, "decode", info, health.HealthServicer())
    with pytest.raises(DrainTimedOut, match="stays decode"):
        roles.set_role("colocated", drain_timeout_s=0.1)  # the decode role's held sequence is not done
    d.held = 0
    flip = roles.set_role("colocated")
    assert (flip.previous, flip.role) == (
        "decode",
        "colocated",
    ) and roles.load().role == common_pb2.WORKER_ROLE_COLOCATED
    assert (p.draining, d.draining, c.draining, c.active) == (True, True, False, True)
    c.held = 0
    assert roles.set_role("decode").previous == "colocated" and not d.draining and c.draining
    assert roles.busy() == 0


def test_no_flip_once_the_worker_drains_to_exit_and_the_exit_drain_covers_both_roles():
    roles, p, d, _ = switch(certified=frozenset({"prefill"}))
    with pytest.raises(RoleRefused, match="certificate"):
        roles.set_role("decode")
    roles.draining = True
    assert p.draining and d.draining
    with pytest.raises(RoleRefused, match="exit"):
        roles.set_role("prefill")


@pytest.fixture
def lifecycle():
    roles, p, d, h = switch()
    every = {r: Service(r) for r in ROLES}  # what a worker serves, whatever role it started in
    colocated = RoleSwitch(
        every, "colocated", common_pb2.WorkerInfo(), h, certified=frozenset({"colocated"})
    )  # a colocated worker whose certificate names one role
    servers, stubs = [], []
    for held in (roles, colocated):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        add_to_server(server, Drainer(roles, h, timeout_s=30), held)
        health_pb2_grpc.add_HealthServicer_to_server(h, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        stubs.append(lifecycle_pb2_grpc.LifecycleServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}")))
    yield roles, stubs
    for server in servers:
        server.stop(0)


def test_set_role_rpc_switches_and_refuses_with_a_reason(lifecycle):
    roles, (stub, colocated) = lifecycle
    reply = stub.SetRole(
        lifecycle_pb2.SetRoleRequest(role=common_pb2.WORKER_ROLE_DECODE, reason="test"), timeout=5
    )
    assert (reply.role, reply.previous_role) == (
        common_pb2.WORKER_ROLE_DECODE,
        common_pb2.WORKER_ROLE_PREFILL,
    )
    assert roles.role == "decode"
    with pytest.raises(grpc.RpcError) as err:
        stub.SetRole(lifecycle_pb2.SetRoleRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        colocated.SetRole(lifecycle_pb2.SetRoleRequest(role=common_pb2.WORKER_ROLE_DECODE), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "certificate does not name" in (err.value.details() or "")


def test_the_router_places_a_worker_by_the_role_it_reports():
    assert placed_role("prefill", "decode") == "decode"
    assert placed_role("prefill", None) == "prefill"
    assert (
        placed_role("decode", "colocated") == "colocated" and placed_role("colocated", "decode") == "decode"
    )
    pools = Pools({"prefill": ["a:1", "b:1"], "decode": ["c:1"]})
    pools.reported = {"b:1": "decode", "gone:1": "decode"}
    placed = pools._placed(pools._wanted())
    assert placed["prefill"] == ["a:1"] and placed["decode"] == ["b:1", "c:1"]
    assert pools.reported == {"b:1": "decode"}  # a worker no list names is forgotten


def test_metrics_follow_the_worker_to_its_new_pool():
    from tandem.worker.serve.metrics import WorkerMetrics

    m = WorkerMetrics("svc", "prefill")
    m.watch_held(lambda: 3)
    m.prefill_tokens.inc(5)
    m.set_pool("decode")
    m.prefill_tokens.inc(2)
    sample = m.registry.get_sample_value
    assert sample(names.WORKER_HELD_REQUESTS, {"service": "svc", "pool": "decode"}) == 3
    assert sample(names.WORKER_HELD_REQUESTS, {"service": "svc", "pool": "prefill"}) is None
    assert sample(names.PREFILL_TOKENS_TOTAL, {"service": "svc", "pool": "decode"}) == 2


def test_a_pod_follows_its_role_label_file(tmp_path):
    from tandem.worker.serve.role_label import RoleLabelWatch, role_from_labels

    text = f'app.kubernetes.io/name="tandem"\n{names.LABEL_ROLE}="decode"\n{names.LABEL_POOL}="prefill"\n'
    assert role_from_labels(text) == "decode" and role_from_labels('a="b"') is None
    labels = tmp_path / "labels"
    labels.write_text(text.replace('"decode"', '"prefill"'))
    roles, p, d, _ = switch()
    watch = RoleLabelWatch(labels, roles)
    assert watch.check() == "prefill" and roles.role == "prefill"
    labels.write_text(text)  # the operator moved the label; the kubelet rewrote the file
    assert watch.check() == "decode" and roles.role == "decode" and p.draining and not d.draining
    missing = RoleLabelWatch(tmp_path / "absent", roles)
    assert missing.check() is None and roles.role == "decode"


def test_the_local_flip_picks_the_least_busy_answering_workers_and_lists_them_under_their_new_role():
    from tandem.operator.local.flip import fewest_running, moved, with_role

    assert fewest_running({"a": 3, "b": None, "c": 0, "d": 1}, 2) == [
        "c",
        "d",
    ]  # b is starting: not flippable
    assert fewest_running({"a": None}, 1) == []
    assert with_role(["worker", "--role", "prefill", "--port", "1"], "decode") == [
        "worker",
        "--role",
        "decode",
        "--port",
        "1",
    ]
    doc = {"prefill": ["p0", "p1"], "decode": ["d0"], "colocated": []}
    assert moved(doc, ["p1"], "decode") == {"prefill": ["p0"], "decode": ["d0", "p1"], "colocated": []}


def test_a_flip_never_empties_a_pool_flips_that_would_are_ordered_after_an_arrival_or_refused():
    from tandem.operator.autoscale.core.flip import flip_waves

    roles = {"p0": "prefill", "p1": "prefill", "d0": "decode"}
    assert flip_waves(roles, {"p1": "decode"}) == ([["p1"]], [])
    assert flip_waves(roles, {"p0": "decode", "p1": "decode"}) == ([["p0"]], ["p1"])  # prefill keeps one
    assert flip_waves(roles, {"d0": "prefill"}) == ([], ["d0"])  # the only decode worker stays
    # a swap: d0 leaves only once p1 serves decode (the wave before), never in the same wave
    assert flip_waves(roles, {"d0": "prefill", "p1": "decode"}) == ([["p1"], ["d0"]], [])
    one_each = {"p0": "prefill", "d0": "decode"}
    assert flip_waves(one_each, {"p0": "decode", "d0": "prefill"}) == (
        [],
        ["p0", "d0"],
    )  # either would empty its pool
    assert flip_waves(roles, {"d0": "decode", "gone": "decode"}) == (
        [["gone"]],
        [],
    )  # already there / in no pool
    # a colocated worker stands in for a decode worker: either may leave while the other serves
    beside = {"p0": "prefill", "d0": "decode", "d1": "colocated"}
    assert flip_waves(beside, {"d1": "decode"}) == ([["d1"]], [])
    assert flip_waves(beside, {"d0": "colocated"}) == ([["d0"]], [])
    assert flip_waves({"p0": "prefill", "d0": "decode"}, {"d0": "colocated"}) == ([], ["d0"])


def test_flip_cli_refuses_a_spec_without_its_run_directory(capsys):
    from tandem import flip_cli

    with pytest.raises(SystemExit):
        flip_cli.main(["--to", "decode", "-f", "spec.yaml"])
    assert "--log-dir" in capsys.readouterr().err

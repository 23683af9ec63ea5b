"""The operator killed (SIGKILL) in the middle of reconciling and in the middle of a scale, and the API server
restarted under a running operator (etcd stays): each converges with no duplicate or recreated children,
status kept, and replicas as desired."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import pytest
import yaml

from tandem import names
from tandem.operator.autoscale.backends.kube.actuator import KubeActuator
from tandem.operator.autoscale.core.types import Decision, Pool
from tandem.operator.runtime.kube import Kube
from tandem.testing.operator_process import Operator
from tests.k8s.conftest import get_json, wait_for
from tests.k8s.test_careless import obj, pool
from tests.k8s.test_operator_lifecycle import condition, ready_at_current_generation

# Extra seconds the API stays down. 60 outlasts kopf's default request retries (about a minute), which
# stopped a riding-out operator with a traceback before handlers.API_RETRY_BACKOFFS; 0 keeps the suite short.
DOWN_SECONDS = float(os.environ.get("TANDEM_TEST_API_DOWN_SECONDS", "0"))
KINDS = ("Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "TandemPool")


def admin(cp) -> Kube:
    return Kube.from_kubeconfig(str(cp.kubeconfig("admin")))


def children(kube: Kube, ns: str, name: str) -> dict[str, str]:
    """kind/name -> uid of every object labelled as this InferenceService's (a duplicate or a recreated child
    shows as a new key or a new uid)."""
    return {
        f"{kind}/{item['metadata']['name']}": item["metadata"]["uid"]
        for kind in KINDS
        for item in kube.list(kind, ns, f"{names.LABEL_SERVICE}={name}")
    }


def replica_sets(cp, ns: str, name: str, pool_: str) -> int:
    """ReplicaSets of one pool: 1 unless its pod template changed (a rollout nobody asked for)."""
    out = get_json(
        cp, "replicasets", "-l", f"{names.LABEL_SERVICE}={name},{names.LABEL_POOL}={pool_}", namespace=ns
    )
    return len(out["items"])


def serving(cp, ns: str, name: str, pool_: str, replicas: int) -> dict | None:
    """Ready at its generation with `replicas` ready pods in the pool, as the status and the Deployment
    say."""
    isvc = ready_at_current_generation(cp, ns, name)
    dep = get_json(cp, "deployment", f"{name}-{pool_}", namespace=ns)
    ok = (
        isvc
        and isvc["status"]["pools"][pool_]["readyReplicas"] == replicas
        and dep["spec"]["replicas"] == replicas
        and dep["status"].get("readyReplicas") == replicas
    )
    return isvc if ok else None


@contextmanager
def restored(operator):
    """Whatever the test does to the session's operator, the next test finds one leading."""
    try:
        yield
    finally:
        if operator.proc is None or operator.proc.poll() is not None:
            operator.proc = None
            operator.start().wait_leading()


def _apply(cp, ns: str, *objs: dict) -> None:
    cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(objs))


def test_killed_mid_reconcile_converges_without_duplicates_and_keeps_status(
    control_plane, operator, namespace
):
    cp, ns, kube = control_plane, namespace, admin(control_plane)
    _apply(cp, ns, obj("steady"))
    wait_for(lambda: ready_at_current_generation(cp, ns, "steady"), 90, "steady Ready")
    steady, steady_status = (
        children(kube, ns, "steady"),
        get_json(cp, "tsvc", "steady", namespace=ns)["status"],
    )
    burst = [f"burst-{i}" for i in range(4)]
    with restored(operator):
        _apply(cp, ns, *(obj(n) for n in burst))
        # the first child of the burst exists: the operator is writing the rest of them right now
        wait_for(
            lambda: any(kube.list("Deployment", ns, f"{names.LABEL_SERVICE}={n}") for n in burst),
            30,
            "the first child of the burst",
            interval=0.01,
        )
        operator.kill()
        at_kill = {n: children(kube, ns, n) for n in burst}
        operator.start().wait_leading()
        for n in burst:
            wait_for(lambda n=n: ready_at_current_generation(cp, ns, n), 120, f"{n} Ready after the restart")
    wanted = {key.replace("steady", "{}") for key in steady}
    assert sum(map(len, at_kill.values())) < len(wanted) * len(burst), "killed after the burst was complete"
    for n in burst:
        after = children(kube, ns, n)
        assert set(after) == {key.format(n) for key in wanted}, n
        assert all(after[key] == uid for key, uid in at_kill[n].items()), f"{n}: a child was recreated"
        assert all(replica_sets(cp, ns, n, p) == 1 for p in ("prefill", "decode", "router")), n
        assert get_json(cp, "tpool", f"{n}-decode", namespace=ns)["spec"]["replicas"] == 1
    assert children(kube, ns, "steady") == steady
    assert get_json(cp, "tsvc", "steady", namespace=ns)["status"] == steady_status


def test_killed_mid_scale_converges_to_the_written_replicas(control_plane, operator, namespace):
    """The autoscaler's actuator writes the pool's replicas; the operator dies before or while it rolls them
    out."""
    cp, ns, kube = control_plane, namespace, admin(control_plane)
    _apply(cp, ns, obj("grow", decode=pool(maxReplicas=4)))
    wait_for(lambda: serving(cp, ns, "grow", "decode", 1), 90, "grow Ready with 1 decode")
    before = children(kube, ns, "grow")
    owner = get_json(cp, "tsvc", "grow", namespace=ns)
    actuator = KubeActuator(
        kube, owner, (Pool.prefill, Pool.decode), lambda pods: {p["metadata"]["name"]: 0.0 for p in pods}
    )  # nothing runs on kwok
    with restored(operator):
        for current, desired in ((1, 3), (3, 2)):
            actuator.refresh()
            actuator.apply(
                Decision(
                    Pool.decode,
                    current,
                    desired,
                    f"decode {current}->{desired}: test",
                    "ScaleUp" if desired > current else "ScaleDown",
                )
            )
            operator.kill()
            operator.start().wait_leading()
            isvc = wait_for(
                lambda desired=desired: serving(cp, ns, "grow", "decode", desired),
                120,
                f"decode at {desired} after the restart",
            )
            assert isvc["status"]["pools"]["decode"]["desiredReplicas"] == desired
            live = get_json(cp, "tpool", "grow-decode", namespace=ns)
            assert live["spec"]["replicas"] == desired
            wait_for(
                lambda desired=desired: (
                    get_json(cp, "tpool", "grow-decode", namespace=ns)["status"].get("readyReplicas")
                    == desired
                ),
                30,
                "the pool's scale subresource status",
            )
    assert children(kube, ns, "grow") == before, "children recreated or duplicated"
    assert replica_sets(cp, ns, "grow", "decode") == 1, "a scale must not roll the pods"
    assert condition(get_json(cp, "tsvc", "grow", namespace=ns), "Degraded")["status"] == "False"


@pytest.mark.slow  # an API server restart and the operator's lease ride-out: about 50 s quiet, 120 s loaded
@pytest.mark.parametrize("lease", ["exits", "rides-out"])
def test_api_server_restart_under_a_running_operator_converges(control_plane, operator, namespace, lease):
    """`exits`: the test's 6 s lease runs out while the API is down, so the leader exits by the lease rule
    (client-go's too) and is started again, as the kubelet would. `rides-out`: a lease longer than the outage,
    so the same process must pick its watches up again once the API answers."""
    cp, ns, kube = control_plane, namespace, admin(control_plane)
    _apply(cp, ns, obj("calm"))
    wait_for(lambda: serving(cp, ns, "calm", "decode", 1), 90, "calm Ready")
    before, status = children(kube, ns, "calm"), get_json(cp, "tsvc", "calm", namespace=ns)["status"]
    op = operator
    if lease == "rides-out":
        operator.stop()  # releases the lease
        op = Operator(
            cp,
            name="patient",
            args=[
                "--lease-namespace",
                "default",
                "--lease-seconds",
                "600",
                "--renew-seconds",
                "500",
                "--retry-seconds",
                "1",
            ],
        )
        op.start().wait_leading()
    try:
        with restored(operator if op is operator else op):
            down = cp.restart_apiserver(down_seconds=DOWN_SECONDS)
            time.sleep(3)  # past one lease retry: a renewal that was due has either worked or given up
            if lease == "exits":
                assert op.proc.poll() == 1, op.log()[-3000:]
                assert "lost the lease, exiting" in op.log(), op.log()[-3000:]
                op.proc = None
                op.start().wait_leading()
            else:
                assert op.proc.poll() is None, op.log()[-3000:]
            assert get_json(cp, "tsvc", "calm", namespace=ns)["status"] == status
            cp.kubectl("scale", "tpool", "calm-decode", "-n", ns, "--replicas=2")
            wait_for(
                lambda: serving(cp, ns, "calm", "decode", 2),
                120,
                f"decode at 2 after {down:.0f} s without API",
            )
            assert op.proc is not None and op.proc.poll() is None, "the operator died after the API came back"
    finally:
        if op is not operator:
            op.stop()
            operator.start().wait_leading()
    assert children(kube, ns, "calm") == before
    assert replica_sets(cp, ns, "calm", "decode") == 1

"""Role flips on a real control plane: with spec.roleFlip, the operator's flip moves a pod's
`serving.tandem.dev/role` label (the patch the autoscaler's actuator writes; the worker following it is
covered over real gRPC by tests/integration/test_role_flip.py); the worker Services and pool counts follow the
label, the Deployments' ReplicaSets and pods stay as they were (they select on the pool), and flipping back
restores every count. The pods are on kwok nodes and never run a worker."""

from __future__ import annotations

import pytest
import yaml

from tandem import names
from tandem.operator.autoscale.backends.kube.flip import flip_candidates, patch_flip
from tandem.operator.autoscale.core.flip import Flip
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.runtime.kube import Kube
from tests.k8s.conftest import get_json, wait_for
from tests.k8s.test_operator_lifecycle import EXAMPLE, SERVICE, model_volume, ready_at_current_generation


@pytest.fixture
def flippable(control_plane, operator, namespace):
    control_plane.kubectl("apply", "-f", "-", input=model_volume(namespace))
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["spec"]["roleFlip"] = True
    obj["spec"]["prefill"]["replicas"] = 2
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    wait_for(lambda: ready_at_current_generation(control_plane, namespace), 180, "Ready with roleFlip")
    return namespace


def _pods(cp, ns: str) -> dict[str, dict]:
    items = get_json(cp, "pods", "-l", f"{names.LABEL_SERVICE}={SERVICE}", namespace=ns)["items"]
    return {
        p["metadata"]["name"]: p for p in items if p["metadata"]["labels"].get(names.LABEL_POOL) != "router"
    }


def _roles(cp, ns: str) -> dict[str, str]:
    return {n: p["metadata"]["labels"][names.LABEL_ROLE] for n, p in _pods(cp, ns).items()}


def _replica_sets(cp, ns: str) -> dict[str, tuple[str, int]]:
    items = get_json(cp, "replicasets", "-l", f"{names.LABEL_SERVICE}={SERVICE}", namespace=ns)["items"]
    return {r["metadata"]["uid"]: (r["metadata"]["name"], r["spec"]["replicas"]) for r in items}


def _endpoints(cp, ns: str, pool: str, service: str = SERVICE) -> set[str]:
    """Pod names behind a worker Service (its EndpointSlices)."""
    slices = get_json(
        cp, "endpointslices", "-l", f"kubernetes.io/service-name={service}-{pool}", namespace=ns
    )["items"]
    return {e["targetRef"]["name"] for s in slices for e in s.get("endpoints") or [] if e.get("targetRef")}


def _workers(cp, ns: str) -> str:
    return get_json(cp, "tsvc", SERVICE, namespace=ns)["status"]["workers"]


def _flip(kube: Kube, ns: str, source: Pool, target: Pool) -> list[str]:
    """What the autoscaler's actuator does for a flip of one pod: pick it, then move its role label."""
    pods = _pods_of(kube, ns)
    chosen = flip_candidates(
        pods, Flip(source, target, 1, "test", "Test"), {p["metadata"]["name"]: 0.0 for p in pods}
    )
    patch_flip(kube.merge_patch, ns, chosen, target, "2026-01-01T00:00:00+00:00")
    return chosen


def _pods_of(kube: Kube, ns: str) -> list[dict]:
    return [
        p
        for p in kube.list("Pod", ns, f"{names.LABEL_SERVICE}={SERVICE}")
        if p["metadata"]["labels"].get(names.LABEL_POOL) != "router"
    ]


def test_flip_and_flip_back_move_labels_services_and_counts_and_leave_replica_sets_alone(
    control_plane, flippable
):
    ns, cp = flippable, control_plane
    kube = Kube.from_kubeconfig(str(cp.kubeconfig("admin")))
    before_pods = _pods(cp, ns)
    before_sets = _replica_sets(cp, ns)
    assert sorted(_roles(cp, ns).values()) == ["decode", "decode", "prefill", "prefill"]
    assert {n: p["metadata"]["labels"][names.LABEL_POOL] for n, p in before_pods.items()} == _roles(cp, ns)
    policies = {p["metadata"]["name"]: p for p in get_json(cp, "networkpolicies", namespace=ns)["items"]}
    for pool in ("prefill", "decode"):  # a flipped pod of either pool may push KV to, or take it from, either
        senders = [
            peer["podSelector"]["matchLabels"].get(names.LABEL_POOL)
            for peer in policies[f"{SERVICE}-{pool}"]["spec"]["ingress"][0]["from"]
        ]
        assert sorted(senders) == ["decode", "prefill", "router"], pool
    pod_spec = next(iter(before_pods.values()))["spec"]
    assert "--role-file" in pod_spec["containers"][0]["args"]  # the worker follows its label
    assert any(v["name"] == "podinfo" for v in pod_spec["volumes"])

    flipped = _flip(kube, ns, Pool.prefill, Pool.decode)
    assert len(flipped) == 1
    (name,) = flipped
    assert _roles(cp, ns)[name] == "decode" and sorted(_roles(cp, ns).values()).count("decode") == 3
    wait_for(
        lambda: name in _endpoints(cp, ns, "decode") and name not in _endpoints(cp, ns, "prefill"),
        60,
        "the decode Service selects the flipped pod",
    )
    wait_for(lambda: _workers(cp, ns) == "prefill 1/2 decode 3/2", 60, "pool counts by current role")
    status = get_json(cp, "tsvc", SERVICE, namespace=ns)["status"]["pools"]
    assert (status["prefill"]["servingReplicas"], status["decode"]["servingReplicas"]) == (1, 3)
    # the Deployments own the same pods through the same ReplicaSets: nothing was created, deleted or orphaned
    assert _replica_sets(cp, ns) == before_sets
    after = _pods(cp, ns)
    assert {n: p["metadata"]["uid"] for n, p in after.items()} == {
        n: p["metadata"]["uid"] for n, p in before_pods.items()
    }
    for p in after.values():
        (owner,) = p["metadata"]["ownerReferences"]
        assert owner["kind"] == "ReplicaSet" and owner["uid"] in before_sets
    back = _flip(kube, ns, Pool.decode, Pool.prefill)
    assert back == [name]  # a pod going home comes first
    assert {n: p["metadata"]["labels"][names.LABEL_POOL] for n, p in _pods(cp, ns).items()} == _roles(cp, ns)
    wait_for(lambda: _workers(cp, ns) == "prefill 2/2 decode 2/2", 60, "counts back")
    wait_for(lambda: name in _endpoints(cp, ns, "prefill"), 60, "the prefill Service selects it again")
    assert _replica_sets(cp, ns) == before_sets and set(_pods(cp, ns)) == set(before_pods)

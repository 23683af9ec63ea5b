"""Mode switches and the autoscaler-owned replica rule, on the real control plane."""

from __future__ import annotations

import yaml

from tandem import names
from tests.k8s.conftest import get_json, wait_for
from tests.k8s.test_operator_lifecycle import deployment, ready_at_current_generation


def _apply(cp, ns: str, name: str, spec: dict) -> None:
    cp.kubectl(
        "apply",
        "-n",
        ns,
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "serving.tandem.dev/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": name},
                "spec": {"model": {"source": {"path": "/models/m"}, "servedName": name}, **spec},
            }
        ),
    )


def _names(cp, ns: str, name: str) -> set[str]:
    out = cp.kubectl(
        "get",
        "deployments,services,poddisruptionbudgets,tandempools",
        "-n",
        ns,
        "-l",
        f"{names.LABEL_SERVICE}={name}",
        "-o",
        "name",
    ).stdout
    return set(out.split())


def test_switch_to_colocated_removes_the_split_pools(control_plane, operator, namespace):
    cp, ns = control_plane, namespace
    _apply(cp, ns, "m", {})
    wait_for(lambda: ready_at_current_generation(cp, ns, "m"), 90, "disaggregated Ready")
    assert "deployment.apps/m-prefill" in _names(cp, ns, "m")
    _apply(cp, ns, "m", {"mode": "colocated", "decode": {"replicas": 2}})
    wait_for(lambda: ready_at_current_generation(cp, ns, "m"), 90, "colocated Ready")
    wait_for(
        lambda: (
            _names(cp, ns, "m")
            == {
                "deployment.apps/m-colocated",
                "deployment.apps/m-router",
                "service/m-colocated",
                "service/m-router",
                "poddisruptionbudget.policy/m-colocated",
                "tandempool.serving.tandem.dev/m-colocated",
            }
        ),
        30,
        "only colocated children left",
    )
    dep = deployment(cp, ns, "colocated", "m")
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"][:3] == ["worker", "--role", "colocated"]
    assert set(get_json(cp, "tsvc", "m", namespace=ns)["status"]["pools"]) == {"colocated", "router"}
    row = cp.kubectl("get", "tsvc", "m", "-n", ns, "--no-headers").stdout.split()
    assert row[1:7] == ["True", "AllPoolsReady", "colocated", "colocated", "2/2", "1/1"]


def test_autoscaler_on_means_the_operator_owns_pool_replicas(control_plane, operator, namespace):
    cp, ns = control_plane, namespace
    _apply(cp, ns, "a", {"autoscaling": {"enabled": True}, "decode": {"replicas": 1, "maxReplicas": 2}})
    wait_for(lambda: ready_at_current_generation(cp, ns, "a"), 90, "Ready")
    cp.kubectl("scale", "tpool", "a-decode", "-n", ns, "--replicas=5")
    wait_for(
        lambda: get_json(cp, "tpool", "a-decode", namespace=ns)["spec"]["replicas"] == 2,
        30,
        "pool clamped to maxReplicas",
    )
    wait_for(lambda: deployment(cp, ns, "decode", "a")["spec"]["replicas"] == 2, 30, "deployment follows")

    def clamped() -> list[dict]:  # the Event is written after the pool and Deployment, so it may come later
        events = get_json(
            cp, "events", "--field-selector", "involvedObject.name=a,reason=ReplicasClamped", namespace=ns
        )["items"]
        return [e for e in events if e["involvedObject"]["kind"] == "InferenceService"]

    wait_for(lambda: clamped(), 30, "ReplicasClamped Event")
    (event,) = clamped()
    assert event["type"] == "Warning"
    assert "decode: replicas 5 set to 2" in event["message"] and "maxReplicas 2" in event["message"]

"""Specs that pass admission but cannot work, on the real control plane: a missing model claim, more GPUs per
worker than any node has, no GPU node matching a pool. Each ends in Degraded with its own reason (never a
failed reconcile or a retry loop) and clears once the cause is fixed."""

from __future__ import annotations

import uuid

import yaml

from tandem import names
from tests.k8s.conftest import wait_for
from tests.k8s.test_careless import obj, pool
from tests.k8s.test_operator_failures import degraded, failed_reconciles, warning_events
from tests.k8s.test_operator_lifecycle import condition, model_volume, ready_at_current_generation


def _deployments(cp, ns: str, name: str) -> list[str]:
    out = cp.kubectl(
        "get", "deployments", "-n", ns, "-l", f"{names.LABEL_SERVICE}={name}", "-o", "name"
    ).stdout
    return out.split()


def _all_share(isvc: dict, reason: str, words: str) -> None:
    assert condition(isvc, "Degraded")["status"] == "True"
    assert condition(isvc, "Ready")["status"] == "False"
    for ctype in ("Ready", "Progressing", "Degraded"):
        c = condition(isvc, ctype)
        assert c["reason"] == reason and words in c["message"], c


def test_missing_model_claim_blocks_the_pools_until_it_exists(control_plane, operator, namespace):
    cp, ns = control_plane, namespace
    spec = {"model": {"source": {"pvc": {"claimName": "models"}}, "servedName": "m"}}
    cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj("nopvc", **spec)))
    isvc = wait_for(
        lambda: degraded(cp, ns, "nopvc", "ModelSourceNotFound"), 30, "Degraded ModelSourceNotFound"
    )
    _all_share(isvc, "ModelSourceNotFound", 'PersistentVolumeClaim "models" not found')
    assert _deployments(cp, ns, "nopvc") == [], "GPU pools created for a model that is not there"
    (event,) = wait_for(lambda: warning_events(cp, ns, "nopvc"), 30, "a Warning Event")
    assert event["reason"] == "ModelSourceNotFound"
    assert failed_reconciles(operator.log(), ns, "nopvc") == 0  # reported, not an error the queue retries

    cp.kubectl(
        "apply", "-f", "-", input=model_volume(ns)
    )  # the fix: nothing watches claims, the recheck sees it
    isvc = wait_for(lambda: ready_at_current_generation(cp, ns, "nopvc"), 90, "Ready once the claim exists")
    assert condition(isvc, "Degraded")["status"] == "False"
    # One Warning for the missing claim, however many rechecks ran; new pods may add their own passing causes
    # (an unbound claim for a moment, on a slow host), which are not this test's subject.
    assert [e["reason"] for e in warning_events(cp, ns, "nopvc")].count("ModelSourceNotFound") == 1


def test_more_gpus_than_any_node_is_degraded_but_applied_and_clears_on_a_smaller_ask(
    control_plane, operator, namespace
):
    cp, ns = control_plane, namespace
    cp.kubectl(
        "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj("big", decode=pool(resources={"gpus": 64})))
    )
    isvc = wait_for(lambda: degraded(cp, ns, "big", "InsufficientGPUs"), 30, "Degraded InsufficientGPUs")
    _all_share(
        isvc, "InsufficientGPUs", "a decode worker asks for 64 nvidia.com/gpu but the largest node has 8"
    )
    assert "big-decode" in " ".join(_deployments(cp, ns, "big")), (
        "a GPU shortfall must not block (autoscalers)"
    )
    assert failed_reconciles(operator.log(), ns, "big") == 0

    cp.kubectl(
        "patch", "tsvc", "big", "-n", ns, "--type=merge", "-p", '{"spec":{"decode":{"resources":{"gpus":2}}}}'
    )
    isvc = wait_for(lambda: ready_at_current_generation(cp, ns, "big"), 90, "Ready with 2 GPUs per worker")
    assert condition(isvc, "Degraded")["status"] == "False"


def test_no_gpu_node_for_a_pool_is_reported_and_clears_when_one_joins(control_plane, operator, namespace):
    """A pool pinned to nodes that have not joined yet: reported, applied, Ready as soon as such a node is
    there."""
    cp, ns = control_plane, namespace
    label = f"tandem-test/gpu-{uuid.uuid4().hex[:6]}"
    spec = {"decode": pool(nodeSelector={label: "yes"})}
    cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj("later", **spec)))
    isvc = wait_for(lambda: degraded(cp, ns, "later", "NoGPUNodes"), 30, "Degraded NoGPUNodes")
    _all_share(isvc, "NoGPUNodes", f"no node matching nodeSelector {label}=yes offers nvidia.com/gpu")
    assert "later-decode" in " ".join(_deployments(cp, ns, "later"))
    try:
        cp.kubectl("label", "node", "gpu-node-0", f"{label}=yes")  # the node "joins" the pool's selection
        isvc = wait_for(
            lambda: ready_at_current_generation(cp, ns, "later"), 90, "Ready once a GPU node matches"
        )
        assert condition(isvc, "Degraded")["status"] == "False"
    finally:
        cp.kubectl("label", "node", "gpu-node-0", f"{label}-", check=False)

"""Careless InferenceServices, as a new user writes them: each is refused at admission with a message naming
the field, or is accepted and then reported (Degraded with the cause, a Warning Event) without half-built
GPU pools or a hot retry loop."""

from __future__ import annotations

import copy
import time

import pytest
import yaml

from tandem import names
from tests.k8s.conftest import get_json, wait_for
from tests.k8s.test_operator_failures import degraded, failed_reconciles, warning_events
from tests.k8s.test_operator_lifecycle import condition, ready_at_current_generation

BASE = {
    "apiVersion": "serving.tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "careless"},
    "spec": {"model": {"source": {"path": "/models/m"}, "servedName": "m"}},
}


def obj(name: str = "careless", **spec) -> dict:
    out = copy.deepcopy(BASE)
    out["metadata"]["name"] = name
    out["spec"].update(spec)
    return out


def pool(**fields) -> dict:
    return {"replicas": 1, **fields}


# (id, object, text the refusal must contain: the field path)
REFUSED = [
    ("name-with-dots", obj("llama-3.1-8b"), "metadata.name"),
    ("name-starts-with-digit", obj("8b-llama"), "metadata.name"),
    ("name-uppercase", obj("Llama"), "metadata.name"),
    ("name-58-chars", obj("l" * 58), "metadata.name"),
    ("name-74-chars", obj("l" * 74), "metadata.name"),
    (
        "toleration-operator-typo",
        obj(decode=pool(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exist"}])),
        "spec.decode.tolerations[0].operator",
    ),
    (
        "toleration-exists-with-value",
        obj(decode=pool(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}])),
        "spec.decode.tolerations[0]",
    ),
    (
        "toleration-without-key-equal",
        obj(prefill=pool(tolerations=[{"operator": "Equal", "value": "v"}])),
        "spec.prefill.tolerations[0]",
    ),
    (
        "toleration-seconds-without-noexecute",
        obj(
            decode=pool(
                tolerations=[
                    {"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}
                ]
            )
        ),
        "spec.decode.tolerations[0]",
    ),
    (
        "toleration-effect-typo",
        obj(decode=pool(tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedul"}])),
        "spec.decode.tolerations[0].effect",
    ),
    (
        "toleration-bad-key",
        obj(decode=pool(tolerations=[{"key": "nvidia gpu", "operator": "Exists"}])),
        "spec.decode.tolerations[0].key",
    ),
    (
        "toleration-unknown-field",
        obj(decode=pool(tolerations=[{"key": "k", "operator": "Exists", "efect": "x"}])),
        "efect",
    ),
    (
        "env-unquoted-number",
        obj(decode=pool(env=[{"name": "WORKERS", "value": 8}])),
        "spec.decode.env[0].value",
    ),
    (
        "env-unquoted-bool",
        obj(prefill=pool(env=[{"name": "DEBUG", "value": True}])),
        "spec.prefill.env[0].value",
    ),
    (
        "env-name-with-equals",
        obj(decode=pool(env=[{"name": "A=B", "value": "1"}])),
        "spec.decode.env[0].name",
    ),
    (
        "env-value-and-value-from",
        obj(
            decode=pool(
                env=[{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
            )
        ),
        "spec.decode.env[0]",
    ),
    ("env-without-name", obj(decode=pool(env=[{"value": "1"}])), "spec.decode.env[0].name"),
    (
        "node-selector-value-with-space",
        obj(decode=pool(nodeSelector={"gpu": "a100 80g"})),
        "spec.decode.nodeSelector",
    ),
    (
        "node-selector-bad-key",
        obj(decode=pool(nodeSelector={"gpu type": "a100"})),
        "spec.decode.nodeSelector",
    ),
    ("image-with-space", obj(image="tandem-worker: 0.1.0"), "spec.image"),
    (
        "pvc-claim-name-uppercase",
        obj(model={"source": {"pvc": {"claimName": "Models"}}, "servedName": "m"}),
        "spec.model.source.pvc.claimName",
    ),
    (
        "hf-secret-name-with-space",
        obj(
            model={
                "source": {"huggingFace": {"repoId": "org/m", "tokenSecretRef": {"name": "hf token"}}},
                "servedName": "m",
            }
        ),
        "spec.model.source.huggingFace.tokenSecretRef.name",
    ),
    (
        "model-image-with-space",
        obj(model={"source": {"image": "models/llama :1"}, "servedName": "m"}),
        "spec.model.source.image",
    ),
]


@pytest.mark.parametrize("body,field", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_at_admission_naming_the_field(control_plane, body, field):
    out = control_plane.kubectl(
        "create", "--dry-run=server", "-n", "default", "-f", "-", input=yaml.safe_dump(body), check=False
    )
    assert out.returncode != 0, f"accepted: {body}"
    assert field in out.stderr, out.stderr


def test_longest_name_that_fits_is_accepted(control_plane):
    """53 characters: `<name>-colocated`, the longest child name, is exactly a 63-character DNS label."""
    out = control_plane.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        "default",
        "-f",
        "-",
        input=yaml.safe_dump(obj("l" * 53, mode="colocated")),
        check=False,
    )
    assert out.returncode == 0, out.stderr


# Accepted by the CRD, refused by the API server for a child: (id, spec, text the Degraded message holds)
REPORTED = [
    (
        "affinity-unknown-field",
        {"decode": pool(affinity={"nodeAffinity": {"requiredDuringScheduling": {}}})},
        "requiredDuringScheduling",
    ),
    ("affinity-wrong-type", {"prefill": pool(affinity={"podAntiAffinity": "spread"})}, "podAntiAffinity"),
    (
        "env-value-from-typo",
        {"decode": pool(env=[{"name": "A", "valueFrom": {"secretKeyRef": {"nam": "s"}}}])},
        "nam",
    ),
]


@pytest.fixture(scope="module")
def reported(control_plane, operator):
    """Every REPORTED object applied in one namespace; waits until each shows Degraded."""
    cp = control_plane
    ns = "careless-reported"
    cp.kubectl("create", "namespace", ns, check=False)
    for case_id, spec, _ in REPORTED:
        cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj(case_id, **spec)))
    for case_id, _, _ in REPORTED:
        wait_for(lambda case_id=case_id: degraded(cp, ns, case_id, "ApplyFailed"), 60, f"{case_id} Degraded")
    before = {case_id: failed_reconciles(operator.log(), ns, case_id) for case_id, _, _ in REPORTED}
    time.sleep(12)  # a resync (10 s in these tests) and the child and status events of every object
    yield ns, before
    cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.parametrize("case_id,cause", [(c[0], c[2]) for c in REPORTED], ids=[c[0] for c in REPORTED])
def test_reported_as_degraded_with_an_event_and_nothing_half_built(
    control_plane, operator, reported, case_id, cause
):
    cp, (ns, before) = control_plane, reported
    isvc = degraded(cp, ns, case_id, "ApplyFailed")
    assert isvc is not None
    assert cause in condition(isvc, "Degraded")["message"]
    assert condition(isvc, "Ready")["status"] == "False"
    (event,) = warning_events(cp, ns, case_id)
    assert event["reason"] == "ApplyFailed" and cause in event["message"]
    deployments = cp.kubectl(
        "get", "deployments", "-n", ns, "-l", f"{names.LABEL_SERVICE}={case_id}", "-o", "name"
    ).stdout
    assert deployments.strip() == "", "a refused child left GPU Deployments behind"
    assert failed_reconciles(operator.log(), ns, case_id) == before[case_id], "retried without a change"


# Accepted and applied, but the pods cannot run: (id, spec, reason, text the Degraded message must contain)
# (A missing model claim and more GPUs than any node has are caught before the pods: test_preflight.py.)
PODS_STUCK = [
    (
        "more-cpu-than-a-node",
        {"decode": pool(resources={"gpus": 1, "cpu": "1000"})},
        "Unschedulable",
        "Insufficient cpu",
    ),
]


@pytest.mark.parametrize("spec,reason,cause", [c[1:] for c in PODS_STUCK], ids=[c[0] for c in PODS_STUCK])
def test_pods_that_cannot_run_degrade_with_the_scheduler_s_words(
    control_plane, operator, namespace, spec, reason, cause
):
    cp, ns = control_plane, namespace
    cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj("stuck", **spec)))
    isvc = wait_for(lambda: degraded(cp, ns, "stuck", reason), 30, f"Degraded {reason}")
    for ctype in ("Ready", "Progressing", "Degraded"):
        c = condition(isvc, ctype)
        assert c["reason"] == reason and cause in c["message"], c
    (event,) = wait_for(
        lambda: warning_events(cp, ns, "stuck"), 30, "a Warning Event on the InferenceService"
    )
    assert event["reason"] == reason and cause in event["message"]


def test_a_pool_scaled_to_zero_is_not_ready(control_plane, operator, namespace):
    cp, ns = control_plane, namespace
    cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj("zero")))
    wait_for(lambda: ready_at_current_generation(cp, ns, "zero"), 90, "Ready")
    cp.kubectl("scale", "tpool", "zero-decode", "-n", ns, "--replicas=0")
    isvc = wait_for(
        lambda: (
            (o := get_json(cp, "tsvc", "zero", namespace=ns))
            and condition(o, "Ready").get("reason") == "NoReplicas"
            and o
        ),
        30,
        "Ready=False NoReplicas",
    )
    assert condition(isvc, "Ready")["status"] == "False" and "decode" in condition(isvc, "Ready")["message"]
    assert condition(isvc, "Degraded")["status"] == "False"

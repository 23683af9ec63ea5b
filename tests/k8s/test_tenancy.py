"""A tenant who may create InferenceServices in its namespace cannot reach past it through one: the chart's
ValidatingAdmissionPolicy, applied to the real API server, refuses host paths outside the allow-list,
tolerating every taint or the control plane's, control-plane node selectors, Secrets not named after the
service, and a Prometheus outside the allow-list, each refusal naming the field; a careful spec is
admitted."""

from __future__ import annotations

import copy
import uuid

import pytest
import yaml

from tests.k8s.conftest import helm_template, wait_for
from tests.k8s.test_operator_lifecycle import EXAMPLE


@pytest.fixture(scope="module")
def namespace(control_plane):
    name = f"t-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def policy(control_plane, helm, namespace):
    """The chart's policy and binding, bound to this module's namespace only (the control plane is shared);
    yielded once the API server enforces it."""
    vap, binding = helm_template(
        helm,
        "ten",
        "--show-only",
        "templates/admission-policy.yaml",
        "--set",
        "tenancy.allowedHostPaths={/srv/models}",
        "--set",
        "tenancy.allowedPrometheusUrls={http://prometheus.monitoring:9090}",
        "--set",
        "tenancy.allowedSecrets={shared-hf-token}",
    )
    for d in (vap, binding):
        d["metadata"]["name"] += f"-{namespace}"
    binding["spec"]["policyName"] = vap["metadata"]["name"]
    binding["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    }
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([vap, binding]))
    probe = yaml.safe_dump(_spec(namespace, model__source={"hostPath": "/"}))
    wait_for(
        lambda: (
            control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=probe, check=False).returncode
        ),
        30,
        "the policy enforced",
    )
    yield
    control_plane.kubectl(
        "delete",
        "validatingadmissionpolicybinding,validatingadmissionpolicy",
        vap["metadata"]["name"],
        check=False,
    )


def _spec(namespace: str, **changes) -> dict:
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["metadata"]["namespace"] = namespace
    spec = obj["spec"]
    for path, value in changes.items():
        node = spec
        *parents, leaf = path.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return obj


ATTACKS = [
    ("host path", {"model__source": {"hostPath": "/etc"}}, "spec.model.source.hostPath: /etc"),
    (
        "host path next to an allowed one",
        {"model__source": {"hostPath": "/srv/models-other"}},
        "spec.model.source.hostPath",
    ),
    ("tolerate every taint", {"decode__tolerations": [{"operator": "Exists"}]}, "spec.decode.tolerations"),
    (
        "control-plane taint",
        {
            "prefill__tolerations": [
                {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
            ]
        },
        "spec.prefill.tolerations",
    ),
    (
        "control-plane node",
        {"decode__nodeSelector": {"node-role.kubernetes.io/control-plane": ""}},
        "spec.decode.nodeSelector",
    ),
    (
        "someone's Secret as API keys",
        {"security": {"apiKeys": {"secretName": "db-password"}}},
        "spec.security.apiKeys.secretName: Secret db-password",
    ),
    (
        "someone's Secret as certificates",
        {"security": {"tls": {"secretName": "ingress-cert"}}},
        "spec.security.tls.secretName",
    ),
    (
        "someone's Secret as the HF token",
        {"model__source": {"huggingFace": {"repoId": "org/m", "tokenSecretRef": {"name": "db"}}}},
        "spec.model.source.huggingFace.tokenSecretRef.name",
    ),
    (
        "someone's Secret in env",
        {"prefill__env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]},
        "spec.prefill.env",
    ),
    (
        "a Prometheus of the tenant's choosing",
        {"autoscaling": {"enabled": True, "prometheusUrl": "http://10.0.0.1:9090"}},
        "spec.autoscaling.prometheusUrl: http://10.0.0.1:9090",
    ),
]


@pytest.mark.parametrize(("what", "changes", "field"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_a_tenant_escape_is_refused_at_admission_naming_the_field(
    control_plane, namespace, policy, what, changes, field
):
    out = control_plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(_spec(namespace, **changes)), check=False
    )
    assert out.returncode != 0 and field in out.stderr and "ValidatingAdmissionPolicy" in out.stderr, (
        what,
        out.stderr,
    )


def test_a_careful_spec_is_admitted(control_plane, namespace, policy):
    careful = _spec(
        namespace,
        model__source={"hostPath": "/srv/models/llama"},
        decode__tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        security={"apiKeys": {"secretName": "llama-8b-api-keys"}, "tls": {"secretName": "llama-8b-certs"}},
        autoscaling={"enabled": True, "prometheusUrl": "http://prometheus.monitoring:9090"},
    )
    careful["spec"]["prefill"]["env"] = [
        {"name": "HF", "valueFrom": {"secretKeyRef": {"name": "shared-hf-token", "key": "t"}}}
    ]
    for obj in (
        careful,
        copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
        | {"metadata": {"name": "plain", "namespace": namespace}},
    ):
        out = control_plane.kubectl(
            "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj), check=False
        )
        assert out.returncode == 0, out.stderr


def test_a_name_clash_leaves_someone_elses_object_alone(control_plane, operator, namespace, policy):
    from tests.k8s.conftest import get_json
    from tests.k8s.test_operator_failures import degraded, warning_events
    from tests.k8s.test_operator_lifecycle import SERVICE, model_volume

    theirs = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{SERVICE}-decode", "namespace": namespace, "labels": {"team": "theirs"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "theirs"}},
            "template": {
                "metadata": {"labels": {"app": "theirs"}},
                "spec": {"containers": [{"name": "c", "image": "theirs:1"}]},
            },
        },
    }
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(theirs))
    before = get_json(control_plane, "deployment", f"{SERVICE}-decode", namespace=namespace)
    control_plane.kubectl("apply", "-f", "-", input=model_volume(namespace))
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(_spec(namespace)))
    obj = wait_for(lambda: degraded(control_plane, namespace, SERVICE, "NameInUse"), 60, "Degraded NameInUse")
    message = next(c["message"] for c in obj["status"]["conditions"] if c["type"] == "Degraded")
    assert f"Deployment/{SERVICE}-decode" in message, message
    wait_for(
        lambda: [e for e in warning_events(control_plane, namespace, SERVICE) if e["reason"] == "NameInUse"],
        30,
        "a NameInUse Warning Event",
    )
    after = get_json(control_plane, "deployment", f"{SERVICE}-decode", namespace=namespace)
    assert after["metadata"].get("ownerReferences") is None and after["metadata"]["labels"] == {
        "team": "theirs"
    }
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"]["template"]["spec"]["containers"][0]["image"] == "theirs:1"
    control_plane.kubectl(
        "delete", "inferenceservice", SERVICE, "-n", namespace, "--wait=true", "--timeout=60s"
    )
    assert get_json(control_plane, "deployment", f"{SERVICE}-decode", namespace=namespace) is not None

"""Hardening against the real API server: the test namespaces enforce the restricted Pod Security Standard
and the operator's pods are admitted there; the operator's service account, as the chart binds it, may
do what reconciling needs and nothing it must not (secrets, writing nodes, pods/exec, cluster-wide
deletes), cluster-wide or confined to one namespace. Reading nodes (the preflight GPU check) is cluster-wide
only."""

from __future__ import annotations

import subprocess
import uuid

import yaml

from tests.k8s.conftest import CHART, PSS_ENFORCE, get_json, helm_template, wait_for
from tests.k8s.test_operator_lifecycle import EXAMPLE, SERVICE, model_volume, ready_at_current_generation

# what reconciling uses, and what the operator must never be able to do
NEEDED = [
    ("get", "inferenceservices.serving.tandem.dev"),
    ("watch", "inferenceservices.serving.tandem.dev"),
    ("patch", "inferenceservices.serving.tandem.dev/status"),
    ("create", "tandempools.serving.tandem.dev"),
    ("create", "deployments.apps"),
    ("patch", "deployments.apps"),
    ("delete", "deployments.apps"),
    ("create", "services"),
    ("create", "poddisruptionbudgets.policy"),
    ("create", "networkpolicies.networking.k8s.io"),
    ("create", "events"),
    ("update", "leases.coordination.k8s.io"),
    ("get", "persistentvolumeclaims"),
    ("create", "secrets"),  # each service's CA and per-role certificates (never read back)
]
FORBIDDEN = [
    ("get", "secrets"),
    ("list", "secrets"),
    ("create", "pods/exec"),
    ("create", "pods"),
    ("delete", "pods"),
    ("update", "inferenceservices.serving.tandem.dev"),
    ("delete", "inferenceservices.serving.tandem.dev"),
    ("create", "roles.rbac.authorization.k8s.io"),
    ("create", "rolebindings.rbac.authorization.k8s.io"),
    ("create", "serviceaccounts/token"),
    ("patch", "configmaps"),
]
CLUSTER_FORBIDDEN = [
    ("get", "nodes"),
    ("patch", "nodes"),
    ("delete", "nodes"),
    ("delete", "namespaces"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
    ("update", "customresourcedefinitions.apiextensions.k8s.io"),
]


def can_i(cp, sa: str, verb: str, resource: str, namespace: str | None) -> bool:
    where = ["-n", namespace] if namespace else ["--all-namespaces"]
    resource, _, sub = resource.partition("/")
    subresource = [f"--subresource={sub}"] if sub else []
    out = cp.kubectl("auth", "can-i", verb, resource, *subresource, *where, f"--as={sa}", check=False)
    answer = out.stdout.strip()
    assert answer in ("yes", "no"), out.stdout + out.stderr
    return answer == "yes"


def test_the_test_namespace_refuses_a_privileged_pod(control_plane, namespace):
    labels = get_json(control_plane, "namespace", namespace)["metadata"]["labels"]
    assert labels[PSS_ENFORCE] == "restricted"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "root", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]},
    }
    out = control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod), check=False)
    assert out.returncode != 0 and "violates PodSecurity" in out.stderr, out.stderr


def test_every_rendered_pod_is_admitted_under_restricted(control_plane, operator, namespace):
    control_plane.kubectl("apply", "-f", "-", input=model_volume(namespace))
    control_plane.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    wait_for(lambda: ready_at_current_generation(control_plane, namespace), 180, "Ready under restricted")
    pods = get_json(control_plane, "pods", namespace=namespace)["items"]
    assert {p["metadata"]["labels"]["serving.tandem.dev/pool"] for p in pods} == {
        "prefill",
        "decode",
        "router",
    }
    for p in pods:
        assert p["spec"]["securityContext"]["runAsNonRoot"] is True
        assert all(c["securityContext"]["readOnlyRootFilesystem"] for c in p["spec"]["containers"])
    policies = get_json(control_plane, "networkpolicies", namespace=namespace)["items"]
    assert sorted(n["metadata"]["name"] for n in policies) == sorted(
        f"{SERVICE}-{p}" for p in ("prefill", "decode", "router")
    )


def test_by_default_the_operator_issues_each_role_a_certificate_and_each_pod_mounts_only_its_own(
    control_plane, operator, namespace
):
    import base64

    from cryptography import x509

    from tandem.identity import Identity, from_sans

    control_plane.kubectl("apply", "-f", "-", input=model_volume(namespace))
    control_plane.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    obj = wait_for(lambda: ready_at_current_generation(control_plane, namespace), 180, "Ready")
    encrypted = next(c for c in obj["status"]["conditions"] if c["type"] == "Encrypted")
    assert (encrypted["status"], encrypted["reason"]) == ("True", "MutualTLS")
    secret = get_json(control_plane, "secret", f"{SERVICE}-tls", namespace=namespace)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    for role in ("router", "prefill", "decode"):
        cert = x509.load_pem_x509_certificate(data[f"{role}.crt"])
        cert.verify_directly_issued_by(ca)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert from_sans(sans.get_values_for_type(x509.UniformResourceIdentifier)) == Identity(role, SERVICE)
    for p in get_json(control_plane, "pods", namespace=namespace)["items"]:
        pool = p["metadata"]["labels"]["serving.tandem.dev/pool"]
        (vol,) = [v["secret"] for v in p["spec"]["volumes"] if v["name"] == "tls"]
        assert vol["secretName"] == f"{SERVICE}-tls"
        assert sorted(i["key"] for i in vol["items"]) == sorted([f"{pool}.crt", f"{pool}.key", "ca.crt"]), (
            pool
        )


def test_tls_off_is_reported_by_a_condition_and_a_warning_event(control_plane, operator, namespace):
    from tests.k8s.test_operator_failures import warning_events

    control_plane.kubectl("apply", "-f", "-", input=model_volume(namespace))
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["spec"]["security"] = {"tls": {"mode": "off"}}
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    obj = wait_for(lambda: ready_at_current_generation(control_plane, namespace), 180, "Ready in plaintext")
    encrypted = next(c for c in obj["status"]["conditions"] if c["type"] == "Encrypted")
    assert (encrypted["status"], encrypted["reason"]) == ("False", "TLSOff")
    events = wait_for(
        lambda: [e for e in warning_events(control_plane, namespace, SERVICE) if e["reason"] == "TLSOff"],
        30,
        "a TLSOff Warning Event",
    )
    assert "plaintext" in events[0]["message"]
    assert get_json(control_plane, "secrets", namespace=namespace)["items"] == [] or all(
        s["metadata"]["name"] != f"{SERVICE}-tls"
        for s in get_json(control_plane, "secrets", namespace=namespace)["items"]
    )
    bad = dict(obj, spec={**obj["spec"], "security": {"tls": {"mode": "off", "secretName": "x"}}})
    bad["metadata"] = {"name": "bad", "namespace": namespace}
    out = control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert out.returncode != 0 and "mode off takes no secretName" in out.stderr, out.stderr


def _install_rbac(cp, helm: str, namespace: str, *values: str) -> str:
    """The chart's service account and RBAC objects, applied for real; returns the service account user."""
    docs = [
        d
        for d in helm_template(helm, "sec", "--namespace", namespace, *values)
        if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    ]
    for d in docs:  # cluster-scoped names must not collide between tests
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            d["metadata"]["name"] += f"-{namespace}"
            if d["kind"] == "ClusterRoleBinding":
                d["roleRef"]["name"] += f"-{namespace}"
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    return f"system:serviceaccount:{namespace}:{sa}"


def test_operator_rbac_cluster_wide_is_least_privilege(control_plane, helm, namespace):
    sa = _install_rbac(control_plane, helm, namespace)
    other = f"t-{uuid.uuid4().hex[:8]}"
    for verb, resource in NEEDED:
        assert can_i(control_plane, sa, verb, resource, other), (verb, resource)
    for verb, resource in FORBIDDEN:
        assert not can_i(control_plane, sa, verb, resource, other), (verb, resource)
        assert not can_i(control_plane, sa, verb, resource, namespace), (verb, resource)
    for verb, resource in CLUSTER_FORBIDDEN:
        assert not can_i(control_plane, sa, verb, resource, None), (verb, resource)
    assert not can_i(control_plane, sa, "get", "secrets", None)
    assert can_i(control_plane, sa, "list", "nodes", None)


def test_operator_rbac_single_namespace_switch(control_plane, helm, namespace):
    sa = _install_rbac(control_plane, helm, namespace, "--set", "rbac.singleNamespace=true")
    for verb, resource in NEEDED:
        assert can_i(control_plane, sa, verb, resource, namespace), (verb, resource)
        assert not can_i(control_plane, sa, verb, resource, "default"), (verb, resource)
    for verb, resource in FORBIDDEN:
        assert not can_i(control_plane, sa, verb, resource, namespace), (verb, resource)
    for verb, resource in CLUSTER_FORBIDDEN + [
        ("list", "deployments.apps"),
        ("create", "deployments.apps"),
        ("list", "nodes"),
    ]:
        assert not can_i(control_plane, sa, verb, resource, None), (verb, resource)


def test_chart_default_security_reaches_the_operator(helm):
    from tandem.operator.manifests.security_defaults import ENV, parse

    docs = helm_template(
        helm,
        "sec",
        "--set",
        "defaultSecurity.tls.secretName=tandem-tls",
        "--set",
        "defaultSecurity.apiKeys.secretName=tandem-keys",
    )
    dep = next(d for d in docs if d["kind"] == "Deployment")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    defaults = parse(env[ENV])
    assert defaults.tls.secret_name == "tandem-tls" and defaults.api_keys.secret_name == "tandem-keys"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    bad = subprocess.run(
        [helm, "template", "sec", str(CHART), "--set", "defaultSecurity.tls.nope=x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0


def test_tls_and_api_keys_from_secrets_are_admitted_and_mounted(control_plane, operator, namespace):
    from tandem.identity import Identity
    from tandem.operator.certs import Authority

    ca = Authority("cert-manager's issuer")
    secrets = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "tandem-keys", "namespace": namespace},
            "stringData": {"api-keys": "sk-one\nsk-two\n"},
        }
    ]
    for role in ("router", "prefill", "decode"):  # what three cert-manager Certificates would write
        leaf = ca.issue(Identity(role, SERVICE))
        secrets.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {"name": f"tandem-tls-{role}", "namespace": namespace},
                "stringData": {
                    "tls.crt": leaf.cert.decode(),
                    "tls.key": leaf.key.decode(),
                    "ca.crt": leaf.ca.decode(),
                },
            }
        )
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(secrets))
    control_plane.kubectl("apply", "-f", "-", input=model_volume(namespace))
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["spec"]["security"] = {"tls": {"secretName": "tandem-tls"}, "apiKeys": {"secretName": "tandem-keys"}}
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    wait_for(
        lambda: ready_at_current_generation(control_plane, namespace), 180, "Ready with TLS and API keys"
    )
    for p in get_json(control_plane, "pods", namespace=namespace)["items"]:
        secrets_mounted = {v["secret"]["secretName"] for v in p["spec"]["volumes"] if "secret" in v}
        pool = p["metadata"]["labels"]["serving.tandem.dev/pool"]
        assert secrets_mounted == (
            {"tandem-tls-router", "tandem-keys"} if pool == "router" else {f"tandem-tls-{pool}"}
        ), pool

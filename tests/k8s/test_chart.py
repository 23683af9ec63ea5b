"""The Helm chart renders, lints, and its objects pass the real API server's validation."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.k8s.conftest import CHART, helm_template


def _template(helm: str, *args: str) -> list[dict]:
    return helm_template(helm, "t", "--namespace", "tandem-system", *args)


def test_chart_lints(helm):
    out = subprocess.run([helm, "lint", str(CHART)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_chart_objects_pass_server_validation(control_plane, helm):
    docs = _template(helm, "--include-crds", "--set", "watchNamespaces={a,b}")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",  # listing nodes only
            "Role",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "RoleBinding",  # a, b, the Lease's
            "Deployment",
            "ConfigMap",
            "Job",  # Job: the helm test hook
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",  # tenancy
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
    )  # the operator's pod patches
    shipped = yaml.safe_load((CHART / "files/operator-clusterrole.yaml").read_text())
    cluster_wide = next(d for d in _template(helm) if d["kind"] == "ClusterRole")
    assert cluster_wide["rules"] == shipped["rules"]  # watching every namespace: the whole file, cluster-wide
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    granted = sorted(str(r) for d in roles for r in d["rules"])
    cluster_scoped = {"nodes", "namespaces", "customresourcedefinitions"}
    namespaced = [r for r in shipped["rules"] if not (cluster_scoped | {"leases"}) & set(r["resources"])]
    leases = [r for r in shipped["rules"] if "leases" in r["resources"]]
    assert granted == sorted(
        str(r)
        for r in namespaced * 2
        + leases
        + [  # a and b; the Lease once; no Namespaces, no CRDs
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}
        ]
    )
    assert [d["rules"] for d in roles if d["kind"] == "ClusterRole"] == [
        [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
    ]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "operator" and "--namespace=a" in args and "--namespace=b" in args
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert "--health-port=8080" in args
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    for ns in ("tandem-system", "a", "b"):
        control_plane.kubectl("create", "namespace", ns, check=False)
    out = control_plane.kubectl(
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        input=yaml.safe_dump_all([d for d in docs if d["kind"] != "CustomResourceDefinition"]),
    )
    assert "created (server dry run)" in out.stdout


def test_chart_templates_the_one_copy_of_each_crd_for_upgrades(helm):
    """The CRDs are templates (so `helm upgrade` updates them) made from files/crds as they are, kept on
    uninstall; crds.install=false leaves them out."""
    rendered = {d["metadata"]["name"]: d for d in _template(helm) if d["kind"] == "CustomResourceDefinition"}
    files = [yaml.safe_load(p.read_text()) for p in sorted((CHART / "files/crds").glob("*.yaml"))]
    assert sorted(rendered) == sorted(f["metadata"]["name"] for f in files) and len(files) == 2
    for f in files:
        crd = rendered[f["metadata"]["name"]]
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert crd["spec"] == f["spec"]
    assert not (CHART / "crds").exists()  # Helm installs crds/ once and never upgrades it
    assert [
        d for d in _template(helm, "--set", "crds.install=false") if d["kind"] == "CustomResourceDefinition"
    ] == []


def test_chart_values_schema_rejects_bad_values(helm):
    out = subprocess.run(
        [helm, "template", "t", str(CHART), "--set", "replicas=0"], capture_output=True, text=True
    )
    assert out.returncode != 0 and "replicas" in out.stderr


@pytest.mark.parametrize(
    "setting,named",
    [
        ("imag.tag=1", "imag"),
        ("image.tga=1", "tga"),
        ("monitoring.podMonitor.enable=true", "enable"),
        ("resources.requests.cpu=lots", "cpu"),
        ("resources.limit.memory=1Gi", "limit"),
    ],
)
def test_chart_values_schema_rejects_typos_and_bad_quantities(helm, setting, named):
    """A typo'd key or a bad quantity stops `helm install` with the key's name, before any API call."""
    out = subprocess.run(
        [helm, "template", "t", str(CHART), "--set", setting], capture_output=True, text=True
    )
    assert out.returncode != 0 and named in out.stderr, out.stderr


def test_chart_ci_values_pass_the_schema(helm):
    for values in sorted((CHART / "ci").glob("*.yaml")):
        out = subprocess.run(
            [helm, "template", "t", str(CHART), "-f", str(values)], capture_output=True, text=True
        )
        assert out.returncode == 0, f"{values.name}: {out.stderr}"

"""The control-plane half of bench/security.py: a real API server with the chart's RBAC and admission
policies (watching one tenant namespace), a tenant trying to escape through an InferenceService, and what
the operator's own ServiceAccount can and cannot do."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml

from bench.security import Row
from tandem.testing.cluster import ControlPlane, find_binaries

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts/tandem"
SYSTEM, TENANT, OTHER = "tandem-system", "tenant", "other"
OPERATOR_SA = f"system:serviceaccount:{SYSTEM}:sec-tandem"
BASE = {"model": {"source": {"pvc": {"claimName": "models"}}, "servedName": "m"}}

ESCAPES = [  # (attack, spec fragment, the field the refusal must name)
    (
        "mount a node's root through a hostPath model",
        {"model": {"source": {"hostPath": "/"}, "servedName": "m"}},
        "spec.model.source.hostPath",
    ),
    (
        "tolerate every taint",
        {"decode": {"tolerations": [{"operator": "Exists"}]}},
        "spec.decode.tolerations",
    ),
    (
        "schedule onto control-plane nodes",
        {"prefill": {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}},
        "spec.prefill.nodeSelector",
    ),
    (
        "read someone else's Secret as API keys",
        {"security": {"apiKeys": {"secretName": "db-password"}}},
        "spec.security.apiKeys.secretName",
    ),
    (
        "read someone else's Secret through env",
        {
            "decode": {
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "p"}}}]
            }
        },
        "spec.decode.env",
    ),
    (
        "point the autoscaler at a Prometheus of the tenant's choosing",
        {"autoscaling": {"prometheusUrl": "http://evil.example:9090"}},
        "spec.autoscaling.prometheusUrl",
    ),
]

REACH = [  # (verb, resource, namespace or None, the operator may)
    ("get", "secrets", TENANT, False),
    ("list", "secrets", None, False),
    ("create", "pods/exec", TENANT, False),
    ("create", "deployments.apps", TENANT, True),
    ("create", "deployments.apps", OTHER, False),
    ("create", "deployments.apps", None, False),
    ("patch", "pods", OTHER, False),
    ("list", "nodes", None, True),
    ("patch", "nodes", None, False),
    ("list", "namespaces", None, False),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", None, False),
]


def _isvc(name: str, fragment: dict) -> str:
    spec = {**BASE, **fragment}
    return json.dumps(
        {
            "apiVersion": "serving.tandem.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name, "namespace": TENANT},
            "spec": spec,
        }
    )


def _install(cp: ControlPlane) -> None:
    for ns in (SYSTEM, TENANT, OTHER):
        cp.kubectl("create", "namespace", ns)
    out = subprocess.run(
        [
            str(cp.bin / "helm"),
            "template",
            "sec",
            str(CHART),
            "-n",
            SYSTEM,
            "--set",
            "crds.install=false",
            "--set",
            f"watchNamespaces={{{TENANT}}}",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    docs = [
        d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] not in ("Deployment", "Job", "ConfigMap")
    ]
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def _escape_rows(cp: ControlPlane) -> list[Row]:
    rows = []
    for i, (attack, fragment, field) in enumerate(ESCAPES):
        deadline = time.monotonic() + 30
        while True:  # a new policy takes a moment to be enforced
            out = cp.kubectl("apply", "-f", "-", input=_isvc(f"escape-{i}", fragment), check=False)
            if out.returncode != 0 or time.monotonic() > deadline:
                break
            cp.kubectl("delete", "tsvc", f"escape-{i}", "-n", TENANT, check=False)
            time.sleep(1)
        observed = (
            "admitted"
            if out.returncode == 0
            else (f"refused naming {field}" if field in out.stderr else f"refused: {out.stderr.strip()[:80]}")
        )
        rows.append(Row(f"tenant: {attack}", f"refused naming {field}", observed))
    return rows


def _reach_rows(cp: ControlPlane) -> list[Row]:
    rows = []
    for verb, resource, ns, may in REACH:
        resource_name, _, sub = resource.partition("/")
        where = ["-n", ns] if ns else ["--all-namespaces"]
        out = cp.kubectl(
            "auth",
            "can-i",
            verb,
            resource_name,
            *([f"--subresource={sub}"] if sub else []),
            *where,
            f"--as={OPERATOR_SA}",
            check=False,
        )
        scope = f"in {ns}" if ns else "cluster-wide"
        rows.append(Row(f"operator: {verb} {resource} {scope}", "yes" if may else "no", out.stdout.strip()))
    return rows


def _pod_patch_row(cp: ControlPlane) -> Row:

    from tandem.operator.runtime.kube import ApiError, Kube

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "victim", "namespace": TENANT, "labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    cp.kubectl("create", "-f", "-", input=json.dumps(pod))
    token = cp.kubectl("create", "token", OPERATOR_SA.rsplit(":", 1)[1], "-n", SYSTEM).stdout.strip()
    kube = Kube.from_kubeconfig(str(cp.token_kubeconfig("sec-operator", token)))
    try:
        kube.merge_patch(
            "Pod", TENANT, "victim", {"metadata": {"labels": {"serving.tandem.dev/pool": "decode"}}}
        )
        observed = "admitted"
    except ApiError as e:
        observed = (
            "refused by the pod policy" if "operator-pods" in e.message else f"refused: {e.message[:80]}"
        )
    return Row(
        "operator: relabel a tenant's pod into a pool (only the deletion cost may change)",
        "refused by the pod policy",
        observed,
    )


def cluster_rows(work: Path) -> list[Row]:
    try:
        bin_dir = find_binaries()
    except RuntimeError as e:
        print(f"control plane skipped: {e} (bash tests/k8s/build-controlplane.sh)")
        return []
    if not (bin_dir / "helm").exists():
        print(
            "control plane skipped: helm not built (TANDEM_BUILD_HELM=1 bash tests/k8s/build-controlplane.sh)"
        )
        return []
    cp = ControlPlane(bin_dir, workdir=work, nodes=1)
    try:
        cp.start()
        cp.install_crds_and_rbac()
        _install(cp)
        return _escape_rows(cp) + _reach_rows(cp) + [_pod_patch_row(cp)]
    finally:
        cp.stop()

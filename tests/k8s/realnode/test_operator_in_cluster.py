"""The operator in a pod, as `helm install` runs it: the chart's Deployment, from the image built from
images/operator.Dockerfile, with the chart's ServiceAccount and RBAC, on the real node, reconciles the tiny
InferenceService until its router and workers are Ready and answer a streamed request.

The node has no kube-proxy, so nothing routes the `kubernetes` Service's virtual IP: the Deployment is
given the API server's address on the pods' bridge (KUBERNETES_SERVICE_HOST/PORT, which the in-cluster
client reads) before its pod starts. This module runs before test_realnode.py (file order), so the operator
process those tests start is not yet running, and this one is uninstalled before they begin."""

from __future__ import annotations

import json

from tests.k8s.conftest import wait_for
from tests.k8s.realnode.conftest import SERVICE, is_ready, tiny_namespace
from tests.k8s.realnode.node import GATEWAY
from tests.k8s.realnode.test_realnode import one_stream
from tests.k8s.test_helm_install import CHART, helm

RELEASE, NS = "tandem", "tandem-system"


def test_the_charts_operator_in_a_pod_serves_an_inference_service(real_cluster):
    cp = real_cluster.cp
    repo, tag = real_cluster.images["OPERATOR"][0].rsplit(":", 1)
    # one replica; the CRDs are the control plane's already
    helm(
        cp,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        NS,
        "--create-namespace",
        "--set",
        f"image.repository={repo}",
        "--set",
        f"image.tag={tag}",
        "--set",
        "image.pullPolicy=Never",
        "--set",
        "replicas=1",
        "--set",
        "crds.install=false",
        "--set",
        "resyncSeconds=10",
    )
    try:
        # the rollout this starts replaces the first pod, which cannot reach the API server
        cp.kubectl(
            "set",
            "env",
            f"deployment/{RELEASE}",
            "-n",
            NS,
            f"KUBERNETES_SERVICE_HOST={GATEWAY}",
            f"KUBERNETES_SERVICE_PORT={cp.port}",
        )
        cp.kubectl("rollout", "status", f"deployment/{RELEASE}", "-n", NS, "--timeout=300s", timeout=320)

        def operator_pod() -> dict | None:
            items = json.loads(cp.kubectl("get", "pods", "-n", NS, "-o", "json").stdout)["items"]
            return next((p for p in items if is_ready(p) and _told_the_api_address(p)), None)

        pod = wait_for(operator_pod, 300, "the operator pod Ready (its /healthz probe)", interval=2)
        name = pod["metadata"]["name"]
        assert pod["spec"]["serviceAccountName"] == RELEASE
        lease = wait_for(lambda: _lease_holder(cp), 120, "the chart's Lease held", interval=2)
        assert lease.startswith(name), f"the Lease is held by {lease!r}, not the operator pod {name}"

        with tiny_namespace(real_cluster) as ns:
            out = one_stream(cp, ns)
            assert out["done"] and out["finish"] == "length", out
            svc = json.loads(cp.kubectl("get", "inferenceservice", SERVICE, "-n", ns, "-o", "json").stdout)
            ready = {c["type"]: c["status"] for c in svc["status"]["conditions"]}
            assert ready.get("Ready") == "True", svc["status"]
        log = cp.kubectl("logs", "-n", NS, name).stdout
        assert ns in log, "the in-cluster operator's log never names the namespace it reconciled"
    finally:
        helm(cp, "uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "2m", check=False)


def _told_the_api_address(pod: dict) -> bool:
    return any(e["name"] == "KUBERNETES_SERVICE_HOST" for e in pod["spec"]["containers"][0].get("env", []))


def _lease_holder(cp) -> str | None:
    out = cp.kubectl("get", "lease", RELEASE, "-n", NS, "-o", "json", check=False)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)["spec"].get("holderIdentity") or None

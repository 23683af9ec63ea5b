"""`helm install` of the chart into a real API server of its own (nothing pre-installed): the CRDs get
established, the operator's Deployment, ServiceAccount and RBAC are created; the operator, run as a process
with the chart's arguments and a token of the chart's ServiceAccount (kwok pods run nothing), reconciles the
example InferenceService to Ready; `helm test`, `helm upgrade` (values, and a changed CRD with live objects
kept), a value values.schema.json refuses, and `helm uninstall` leaving only the CRDs. The tests run in order
as one install's life."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tandem import names
from tandem.testing.cluster import ControlPlane, find_binaries, free_port
from tandem.testing.operator_process import Operator
from tests import doc_blocks
from tests.k8s.conftest import get_json, wait_for
from tests.k8s.test_operator_lifecycle import EXAMPLE, SERVICE, model_volume, ready_at_current_generation

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/tandem"
RELEASE, NS = "tandem", "tandem-system"
# the docs' runnable `helm install` and `helm test` (docs/kubernetes.md), run as written with the chart's path
# made absolute
DOC_INSTALL = [str(CHART) if a == "charts/tandem" else a for a in doc_blocks.docs_command("helm", "install")]
DOC_TEST = doc_blocks.docs_command("helm", "test")
CRDS = ("inferenceservices.serving.tandem.dev", "tandempools.serving.tandem.dev")
CHART_LABEL = f"app.kubernetes.io/instance={RELEASE}"


@pytest.fixture(scope="module")
def cluster():
    """A control plane with nothing installed, so everything there comes from the chart."""
    try:
        bin_dir = find_binaries()
    except RuntimeError as e:
        pytest.skip(str(e))
    if not (bin_dir / "helm").exists():
        pytest.skip("helm not built: TANDEM_BUILD_HELM=1 bash tests/k8s/build-controlplane.sh")
    cp = ControlPlane(bin_dir, nodes=2)
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


def helm(
    cp: ControlPlane, *args: str, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess:
    cmd = [str(cp.bin / "helm"), "--kubeconfig", str(cp.kubeconfig("admin")), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


@pytest.fixture(scope="module")
def installed(cluster):
    assert DOC_INSTALL[:2] == [RELEASE, str(CHART)] and "--create-namespace" in DOC_INSTALL, DOC_INSTALL
    assert DOC_INSTALL[DOC_INSTALL.index("-n") + 1] == NS, (
        DOC_INSTALL
    )  # the namespace the tests below look in
    out = helm(cluster, "install", *DOC_INSTALL, "--wait", "--timeout", "4m")
    return out.stdout


def service_account_kubeconfig(cp: ControlPlane, name: str) -> Path:
    """A kubeconfig with a short-lived token for ServiceAccount NS/name, from the TokenRequest API."""
    token = cp.kubectl("create", "token", name, "-n", NS, "--duration=2h").stdout.strip()
    assert token.count(".") == 2  # a signed JWT
    return cp.token_kubeconfig(f"sa-{name}", token)


@pytest.fixture(scope="module")
def chart_operator(cluster, installed):
    """The operator as the chart's Deployment runs it: its container's arguments and environment, the
    chart's ServiceAccount's identity."""
    dep = get_json(cluster, "deployment", RELEASE, namespace=NS)
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["tandem"] and container["args"][0] == "operator"
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    env["POD_NAMESPACE"] = NS  # the downward API's value in the pod
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (
        f"--metrics-port={ports['metrics']}" in container["args"]
    )  # the autoscaler's metrics, on a named port
    metrics_port = free_port()  # on loopback, beside other tests' processes (argparse: the last flag wins)
    op = Operator(
        cluster,
        "chart-operator",
        extra_env=env,
        args=[*container["args"][1:], f"--metrics-port={metrics_port}"],
        kubeconfig=service_account_kubeconfig(cluster, sa),
    )
    op.metrics_port = metrics_port
    op.start().wait_leading(timeout=90)
    yield op
    op.stop()


def test_install_establishes_crds_and_creates_the_operator(cluster, installed):
    cp = cluster
    for crd in CRDS:
        obj = get_json(cp, "crd", crd)
        established = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
        assert established.get("Established") == "True", crd
    dep = get_json(cp, "deployment", RELEASE, namespace=NS)
    assert dep["status"].get("availableReplicas") == dep["spec"]["replicas"] == 2  # --wait saw them available
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    assert get_json(cp, "serviceaccount", sa, namespace=NS) is not None
    binding = get_json(cp, "clusterrolebinding", RELEASE)
    assert binding["roleRef"]["name"] == RELEASE and get_json(cp, "clusterrole", RELEASE)["rules"]
    assert {"kind": "ServiceAccount", "name": sa, "namespace": NS} in binding["subjects"]
    # NOTES.txt tells what to do next
    assert "kubectl apply -f examples/inferenceservice-gpu.yaml" in installed
    assert f"helm test {RELEASE} -n {NS}" in installed and "kubectl get tsvc,tpool" in installed
    assert "spec.security.apiKeys: {secretName:" in installed  # and how to close the API to strangers


def test_operator_with_the_charts_identity_reconciles_the_example(cluster, chart_operator):
    cp = cluster
    cp.kubectl("create", "namespace", "serving")
    wait_for(
        lambda: cp.kubectl("get", "serviceaccount", "default", "-n", "serving", check=False).returncode == 0,
        60,
        "default service account",
    )
    cp.kubectl("apply", "-f", "-", input=model_volume("serving"))
    cp.kubectl("apply", "-n", "serving", "-f", str(EXAMPLE))
    try:
        obj = wait_for(lambda: ready_at_current_generation(cp, "serving"), 180, f"{SERVICE} Ready")
    except AssertionError:
        raise AssertionError(f"not Ready; operator log:\n{chart_operator.log()[-4000:]}") from None
    assert obj["status"]["conditions"]
    for pool in ("prefill", "decode", "router"):
        assert get_json(cp, "deployment", f"{SERVICE}-{pool}", namespace="serving") is not None
    assert "Forbidden" not in chart_operator.log()  # the chart's RBAC was enough for every call


def test_the_charts_operator_serves_the_autoscalers_metrics(chart_operator):
    body = urllib.request.urlopen(
        f"http://127.0.0.1:{chart_operator.metrics_port}/metrics", timeout=10
    ).read()
    assert f"# HELP {names.AUTOSCALER_DECISIONS_TOTAL}".encode() in body


def test_helm_test_hook_passes(cluster, chart_operator):
    cp = cluster
    dep = get_json(cp, "deployment", RELEASE, namespace=NS)
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    # what the hook's container runs, run here with the same identity (kwok pods run nothing)
    manifest = helm(cp, "get", "hooks", RELEASE, "-n", NS).stdout
    assert "--check" in manifest and f"serviceAccountName: {sa}" in manifest
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "tandem",
            "operator",
            "--check",
            f"--lease-name={RELEASE}",
            "--kubeconfig",
            str(service_account_kubeconfig(cp, sa)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "POD_NAMESPACE": NS},
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert (
        "ok: 1 InferenceService(s) in all namespaces" in check.stdout
        and f"leads {NS}/{RELEASE}" in check.stdout
    )
    assert DOC_TEST == [RELEASE, "-n", NS], DOC_TEST
    out = helm(cp, "test", *DOC_TEST, "--timeout", "3m")
    assert f"TEST SUITE:     {RELEASE}-check" in out.stdout and "Phase:          Succeeded" in out.stdout, (
        out.stdout
    )


def test_top_reads_the_kubernetes_api(cluster, chart_operator):
    """`tandem top --kube` on the reconciled example: replicas from its status, the SLO from its spec, and
    the newest scaling decision from an Event like the autoscaler's (reason code, message = its reason)."""
    cp = cluster
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "llama-8b-decode.scale", "namespace": "serving"},
        "involvedObject": {
            "apiVersion": "serving.tandem.dev/v1alpha1",
            "kind": "TandemPool",
            "name": f"{SERVICE}-decode",
            "namespace": "serving",
        },
        "reason": "SLOBreach",
        "message": "decode 2->3: TPOT p90 61 ms > 40 ms SLO",
        "type": "Normal",
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z",
        "source": {"component": "tandem-autoscaler"},
    }
    cp.kubectl("apply", "-f", "-", input=json.dumps(event))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tandem",
            "top",
            "--kube",
            "--kubeconfig",
            str(cp.kubeconfig("admin")),
            "--iterations",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "260"},
    )
    assert out.returncode == 0, out.stderr
    (row,) = [line for line in out.stdout.splitlines() if f"serving/{SERVICE}" in line]
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[1] == "prefill 1/1  decode 2/2  router 1/1", cells  # ready/desired from the status
    assert cells[2].startswith("- / 400ms") and cells[3].startswith(
        "- / 40ms"
    )  # the spec's SLO, no traffic yet
    assert "ago llama-8b-decode: decode 2->3: TPOT p90 61 ms > 40 ms SLO" in cells[6], cells


def test_upgrade_applies_changed_values(cluster, installed):
    cp = cluster
    helm(
        cp,
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        NS,
        "--reuse-values",
        "--set",
        "replicas=1",
        "--set",
        "resyncSeconds=30",
        "--set",
        "monitoring.dashboards.enabled=false",
        "--wait",
        "--timeout",
        "3m",
    )
    dep = get_json(cp, "deployment", RELEASE, namespace=NS)
    assert dep["spec"]["replicas"] == 1
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert {"name": "TANDEM_RESYNC_SECONDS", "value": "30"} in container["env"]
    assert (
        get_json(cp, "configmap", f"{RELEASE}-dashboards", namespace=NS) is None
    )  # a value turned off removes it
    history = json.loads(helm(cp, "history", RELEASE, "-n", NS, "-o", "json").stdout)
    assert [h["revision"] for h in history] == [1, 2] and history[-1]["status"] == "deployed"


def test_upgrade_updates_a_changed_crd_and_keeps_live_objects(cluster, chart_operator, tmp_path):
    """The chart's next version adds a field and a printer column to the InferenceService CRD: `helm upgrade`
    applies it (the API server then keeps the field instead of pruning it), the live InferenceService and its
    TandemPools stay the same objects and Ready; upgrading back restores the CRD."""
    cp = cluster
    objects = (("tsvc", SERVICE), ("tpool", f"{SERVICE}-decode"), ("tpool", f"{SERVICE}-prefill"))
    uids = {o: get_json(cp, *o, namespace="serving")["metadata"]["uid"] for o in objects}
    chart = tmp_path / "tandem"
    shutil.copytree(CHART, chart)
    crd_file = chart / "files/crds/inferenceservice.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["upgradeMarker"] = {
        "type": "string",
        "description": "Added by the next chart version.",
    }
    version["additionalPrinterColumns"].append(
        {"name": "Marker", "type": "string", "jsonPath": ".spec.upgradeMarker"}
    )
    crd_file.write_text(yaml.safe_dump(crd))

    def marker_kept() -> bool:  # a server-side dry run returns what the API server would store
        obj = yaml.safe_load(EXAMPLE.read_text())
        obj["spec"]["upgradeMarker"] = "v2"
        out = cp.kubectl(
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-n",
            "serving",
            "-o",
            "json",
            "-f",
            "-",
            input=json.dumps(obj),
            check=False,
        )
        if out.returncode != 0:
            assert 'unknown field "spec.upgradeMarker"' in out.stderr, out.stderr
            return False
        return json.loads(out.stdout)["spec"].get("upgradeMarker") == "v2"

    assert not marker_kept()  # refused: the installed CRD does not know the field
    helm(cp, "upgrade", RELEASE, str(chart), "-n", NS, "--reuse-values", "--wait", "--timeout", "3m")
    live = get_json(cp, "crd", CRDS[0])
    assert "Marker" in [c["name"] for c in live["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert live["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    wait_for(marker_kept, 30, "the upgraded schema to keep spec.upgradeMarker")
    for o, uid in uids.items():
        assert get_json(cp, *o, namespace="serving")["metadata"]["uid"] == uid, o
    assert ready_at_current_generation(cp, "serving")
    helm(cp, "upgrade", RELEASE, str(CHART), "-n", NS, "--reuse-values", "--wait", "--timeout", "3m")
    wait_for(lambda: not marker_kept(), 30, "the CRD back to the chart's")
    assert get_json(cp, *objects[0], namespace="serving")["metadata"]["uid"] == uids[objects[0]]


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("replicas=0", "replicas"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("resyncSeconds=often", "resyncSeconds"),
    ],
)
def test_a_value_the_schema_refuses_fails_install_naming_it(cluster, installed, value, named):
    out = helm(
        cluster,
        "install",
        "refused",
        str(CHART),
        "-n",
        "refused",
        "--create-namespace",
        "--set",
        value,
        check=False,
    )
    assert out.returncode != 0 and "values don't meet the specifications of the schema" in out.stderr, (
        out.stderr
    )
    assert named in out.stderr
    assert "refused" not in helm(cluster, "list", "-A", "-q").stdout.split()


def test_uninstall_leaves_only_the_crds(cluster, chart_operator):
    cp = cluster
    cp.kubectl("delete", "tsvc", SERVICE, "-n", "serving", "--wait=true", "--timeout=120s")
    chart_operator.stop()
    helm(cp, "uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "3m")
    for kinds, ns in (
        ("deployments,replicasets,serviceaccounts,configmaps,jobs,pods,secrets", ["-n", NS]),
        ("clusterroles,clusterrolebindings", []),
    ):

        def gone(kinds=kinds, ns=ns):  # pods and ReplicaSets go through the garbage collector
            return cp.kubectl("get", kinds, *ns, "-l", CHART_LABEL, "-o", "name").stdout.split() == []

        wait_for(gone, 60, f"no {kinds} of the release left")
    assert get_json(cp, "serviceaccount", RELEASE, namespace=NS) is None
    assert (
        cp.kubectl("get", "secrets", "-n", NS, "-l", "owner=helm", "-o", "name").stdout.split() == []
    )  # release records
    for crd in CRDS:  # helm.sh/resource-policy: keep
        assert get_json(cp, "crd", crd) is not None

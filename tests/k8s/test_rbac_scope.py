"""The chart with `watchNamespaces`, installed by helm into the real API server: the operator's
ServiceAccount gets a Role in each watched namespace, the Lease's Role in the release namespace and, cluster
wide, only the listing of nodes (`kubectl auth can-i --as=...`, allowed and denied); run with that identity
the operator reconciles a watched namespace without one refusal and leaves an unwatched one alone; and the
chart's ValidatingAdmissionPolicy lets that identity change nothing on a pod but the deletion-cost
annotation and (a role flip) the role label to prefill or decode."""

from __future__ import annotations

import json
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tandem import names
from tandem.testing.operator_process import Operator
from tests.k8s.conftest import PSS_ENFORCE, get_json, wait_for
from tests.k8s.test_operator_lifecycle import EXAMPLE, SERVICE, model_volume, ready_at_current_generation
from tests.k8s.test_security import CLUSTER_FORBIDDEN, FORBIDDEN, NEEDED, can_i

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/tandem"
LEASE = ("update", "leases.coordination.k8s.io")
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


class Install:
    """One helm release watching namespaces a and b, installed into namespace sys; c is not watched."""

    def __init__(self, cp, helm: str):
        self.cp, self.helm = cp, helm
        tag = uuid.uuid4().hex[:6]
        self.release = f"rb{tag}"
        self.fullname = f"{self.release}-tandem"
        self.sys, self.a, self.b, self.c = (f"rb{tag}-{x}" for x in ("sys", "a", "b", "c"))
        self.sa = f"system:serviceaccount:{self.sys}:{self.fullname}"

    def run_helm(self, *args: str) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [self.helm, "--kubeconfig", str(self.cp.kubeconfig("admin")), *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return out

    def install(self) -> Install:
        for ns in (self.a, self.b, self.c):
            self.cp.kubectl("create", "namespace", ns)
            self.cp.kubectl("label", "namespace", ns, f"{PSS_ENFORCE}=restricted")
        self.run_helm(
            "install",
            self.release,
            str(CHART),
            "-n",
            self.sys,
            "--create-namespace",
            "--set",
            "crds.install=false",  # the session's CRDs are there already
            "--set",
            "tenancy.admissionPolicy=false",
            "--set",
            "monitoring.dashboards.enabled=false",
            "--set",
            "replicas=1",
            "--set",
            f"watchNamespaces={{{self.a},{self.b}}}",
        )
        return self

    def uninstall(self) -> None:
        subprocess.run(
            [
                self.helm,
                "--kubeconfig",
                str(self.cp.kubeconfig("admin")),
                "uninstall",
                self.release,
                "-n",
                self.sys,
            ],
            capture_output=True,
            timeout=120,
        )
        for ns in (self.a, self.b, self.c, self.sys):
            self.cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def scoped(control_plane):
    helm = control_plane.bin / "helm"
    if not helm.exists():
        pytest.skip("helm not built: TANDEM_BUILD_HELM=1 bash tests/k8s/build-controlplane.sh")
    inst = Install(control_plane, str(helm)).install()
    yield inst
    inst.uninstall()


def _cluster_roles_of(cp, sa: str) -> list[dict]:
    """The ClusterRoles bound, cluster-wide, to the ServiceAccount `sa` (system:serviceaccount:ns:name)."""
    _, _, ns, name = sa.split(":")
    bindings = get_json(cp, "clusterrolebindings")["items"]
    bound = [
        b["roleRef"]["name"]
        for b in bindings
        if {"kind": "ServiceAccount", "name": name, "namespace": ns} in (b.get("subjects") or [])
    ]
    return [get_json(cp, "clusterrole", r) for r in bound]


def _answers(cp, sa: str, asks: list[tuple[str, str, str | None]]) -> dict[tuple[str, str, str | None], bool]:
    """`kubectl auth can-i` for each (verb, resource, namespace or None for every namespace), a few at a
    time."""
    with ThreadPoolExecutor(6) as pool:
        return dict(zip(asks, pool.map(lambda a: can_i(cp, sa, *a), asks), strict=True))


def test_watch_namespaces_grants_roles_there_and_only_node_listing_cluster_wide(control_plane, scoped):
    cp, sa = control_plane, scoped.sa
    (nodes,) = _cluster_roles_of(cp, sa)
    assert nodes["metadata"]["name"] == f"{scoped.fullname}-nodes"
    assert nodes["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
    expected: dict[tuple[str, str, str | None], bool] = {}
    for verb, resource in NEEDED:
        expected[(verb, resource, scoped.a)] = (
            verb,
            resource,
        ) != LEASE  # the Lease is the release namespace's
        expected[(verb, resource, scoped.c)] = False  # not watched: nothing there
        expected[(verb, resource, scoped.sys)] = (verb, resource) == LEASE
    for verb, resource in FORBIDDEN:
        expected[(verb, resource, scoped.a)] = False
    for ns in (scoped.b, "default", "kube-system"):
        expected[("create", "deployments.apps", ns)] = ns == scoped.b
        expected[("patch", "pods", ns)] = ns == scoped.b
    expected[("get", "leases.coordination.k8s.io", scoped.sys)] = True
    expected[("list", "nodes", None)] = True
    for verb, resource in CLUSTER_FORBIDDEN + [
        ("create", "deployments.apps"),
        ("list", "deployments.apps"),
        ("patch", "pods"),
        ("create", "secrets"),
        ("list", "inferenceservices.serving.tandem.dev"),
        ("get", "secrets"),
        ("list", "namespaces"),
        ("watch", "namespaces"),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
    ]:
        expected[(verb, resource, None)] = False
    observed = _answers(cp, sa, list(expected))
    wrong = {ask: observed[ask] for ask in expected if observed[ask] != expected[ask]}
    assert wrong == {}, f"can-i answers other than expected: {wrong}"


def _service_account_kubeconfig(cp, scoped: Install) -> Path:
    name = scoped.sa.rsplit(":", 1)[1]
    token = cp.kubectl("create", "token", name, "-n", scoped.sys, "--duration=1h").stdout.strip()
    return cp.token_kubeconfig(f"sa-{scoped.release}", token)


def test_operator_with_the_scoped_identity_reconciles_only_the_watched_namespaces(
    control_plane, scoped, operator
):
    """The chart Deployment's own arguments and the ServiceAccount's token: the example becomes Ready in a
    watched namespace with no call refused, and the same example in an unwatched namespace gets nothing.
    The session's operator watches every namespace, so it is stopped while the scoped one runs alone."""
    cp = control_plane
    operator.stop()
    try:
        _scoped_operator_reconciles_only_watched(cp, scoped)
    finally:
        operator.start().wait_leading()


def _scoped_operator_reconciles_only_watched(cp, scoped) -> None:
    dep = get_json(cp, "deployment", scoped.fullname, namespace=scoped.sys)
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert f"--namespace={scoped.a}" in container["args"] and f"--namespace={scoped.b}" in container["args"]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    env["POD_NAMESPACE"] = scoped.sys  # the downward API's value in the pod
    op = Operator(
        cp,
        f"scoped-{scoped.release}",
        extra_env=env,
        args=[*container["args"][1:], "--metrics-port=0"],
        kubeconfig=_service_account_kubeconfig(cp, scoped),
    )
    op.start()
    try:
        op.wait_leading(timeout=90)
        for ns in (scoped.a, scoped.c):
            cp.kubectl("apply", "-f", "-", input=model_volume(ns))
            cp.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))
        try:
            wait_for(
                lambda: ready_at_current_generation(cp, scoped.a),
                180,
                f"{SERVICE} Ready in the watched namespace",
            )
        except AssertionError:
            raise AssertionError(f"not Ready; operator log:\n{op.log()[-4000:]}") from None
        operator_pods = json.loads(env["TANDEM_OPERATOR_PEER"])  # the direct scrape gets through the policies
        for policy in get_json(cp, "networkpolicies", namespace=scoped.a)["items"]:
            (metrics,) = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == names.METRICS_PORT]
            assert operator_pods in metrics["from"], policy["metadata"]["name"]
        assert get_json(cp, "tsvc", SERVICE, namespace=scoped.c).get("status") in (None, {})
        assert cp.kubectl("get", "deployments", "-n", scoped.c, "-o", "name").stdout.split() == []
        log = op.log()
        assert "Forbidden" not in log and "Not enough permissions" not in log, log[-4000:]
    finally:
        op.stop()


CONTAINER = {
    "name": "c",
    "image": "tandem-worker:1",
    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
}


def _pod(ns: str, name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "x"}, "annotations": {"note": "keep"}},
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [CONTAINER],
        },
    }


@pytest.fixture(scope="module")
def as_operator(control_plane, scoped):
    """The operator's own API client (what the autoscaler's deletion-cost patch goes through), with the
    chart's ServiceAccount's token."""
    from tandem.operator.runtime.kube import Kube

    return Kube.from_kubeconfig(str(_service_account_kubeconfig(control_plane, scoped)))


def _refusal(call) -> str:
    from tandem.operator.runtime.kube import ApiError

    try:
        call()
    except ApiError as e:
        return f"{e.status} {e.message}"
    return "accepted"


@pytest.mark.parametrize(
    ("patch", "refusal"),
    [
        ({"metadata": {"labels": {"serving.tandem.dev/pool": "decode"}}}, "(metadata.labels changed)"),
        ({"metadata": {"annotations": {"note": "changed"}}}, "(another annotation changed)"),
        ({"metadata": {"annotations": {"note": None}}}, "(another annotation changed)"),
        ({"metadata": {"annotations": {"prometheus.io/scrape": "true"}}}, "(another annotation changed)"),
        ({"metadata": {"finalizers": ["example.com/hold"]}}, "(owner references or finalizers changed)"),
        ({"spec": {"containers": "the live ones with another image"}}, "(spec changed)"),
        ({"spec": {"activeDeadlineSeconds": 1}}, "(spec changed)"),
    ],
    ids=["label", "other-annotation", "drop-annotation", "new-annotation", "finalizer", "image", "deadline"],
)
def test_the_operator_may_patch_a_pod_only_for_the_deletion_cost(
    control_plane, scoped, as_operator, patch, refusal
):
    cp, ns, name = control_plane, scoped.b, f"victim-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "-f", "-", input=json.dumps(_pod(ns, name)))
    cost = {DELETION_COST: str(uuid.uuid4().int % 1000)}
    as_operator.merge_patch("Pod", ns, name, {"metadata": {"annotations": cost}})  # what the autoscaler does
    before = get_json(cp, "pod", name, namespace=ns)
    assert before["metadata"]["annotations"] == {"note": "keep", **cost}
    if "containers" in patch.get(
        "spec", {}
    ):  # a merge patch replaces the list: keep the defaults the server set
        patch = {"spec": {"containers": [{**before["spec"]["containers"][0], "image": "attacker:latest"}]}}
    # the same patch with anything else in it is refused at admission, naming what changed
    meta = patch.get("metadata", {})
    mixed = {
        **patch,
        "metadata": {**meta, "annotations": {**meta.get("annotations", {}), DELETION_COST: "0"}},
    }
    refused = _refusal(lambda: as_operator.merge_patch("Pod", ns, name, mixed))
    assert (
        refused.startswith("403 ") and f"{scoped.fullname}-operator-pods" in refused and refusal in refused
    ), refused
    after = get_json(cp, "pod", name, namespace=ns)
    for field in ("labels", "annotations", "finalizers"):
        assert after["metadata"].get(field) == before["metadata"].get(field), field
    assert after["spec"] == before["spec"]


def test_the_operator_may_flip_a_pods_role_label_between_worker_roles_only(
    control_plane, scoped, as_operator
):
    cp, ns = control_plane, scoped.b
    pod = _pod(ns, "flipped")
    pod["metadata"]["labels"]["serving.tandem.dev/role"] = "prefill"
    cp.kubectl("create", "-f", "-", input=json.dumps(pod))
    from tandem.operator.autoscale.backends.kube.flip import FLIPPED_AT, flip_patch
    from tandem.operator.autoscale.core.types import Pool

    as_operator.merge_patch(
        "Pod", ns, "flipped", flip_patch(Pool("decode"), "2026-01-01T00:00:00Z")
    )  # the autoscaler's
    live = get_json(cp, "pod", "flipped", namespace=ns)["metadata"]
    assert (
        live["labels"]["serving.tandem.dev/role"] == "decode"
        and live["annotations"][FLIPPED_AT] == "2026-01-01T00:00:00Z"
    )
    refused = _refusal(
        lambda: as_operator.merge_patch(
            "Pod", ns, "flipped", {"metadata": {"labels": {"serving.tandem.dev/role": "router"}}}
        )
    )
    assert refused.startswith("403 ") and "only to prefill, decode or colocated" in refused, refused
    refused = _refusal(
        lambda: as_operator.merge_patch(
            "Pod", ns, "flipped", {"metadata": {"labels": {"serving.tandem.dev/role": None}}}
        )
    )
    assert "(metadata.labels changed)" in refused, refused


def test_the_pod_policy_binds_only_the_operator(control_plane, scoped, as_operator):
    cp, ns = control_plane, scoped.b
    cp.kubectl("create", "-f", "-", input=json.dumps(_pod(ns, "relabelled")))
    relabel = {"metadata": {"labels": {"app": "y"}, "annotations": {"note": "changed"}}}
    refused = _refusal(lambda: as_operator.merge_patch("Pod", ns, "relabelled", relabel))
    assert "(metadata.labels changed)" in refused, refused
    cp.kubectl(
        "patch", "pod", "relabelled", "-n", ns, "--type=merge", "-p", json.dumps(relabel)
    )  # an administrator may
    assert get_json(cp, "pod", "relabelled", namespace=ns)["metadata"]["labels"] == {"app": "y"}


def test_the_operator_may_not_patch_pods_outside_its_namespaces(control_plane, scoped, as_operator):
    control_plane.kubectl("create", "-f", "-", input=json.dumps(_pod(scoped.c, "victim")))
    refused = _refusal(
        lambda: as_operator.merge_patch(
            "Pod", scoped.c, "victim", {"metadata": {"annotations": {DELETION_COST: "1"}}}
        )
    )
    assert refused.startswith("403 ") and 'cannot patch resource "pods"' in refused, refused

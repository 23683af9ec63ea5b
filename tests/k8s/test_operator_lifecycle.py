"""The operator against a real control plane: children, readiness, rollout, scaling, drift, GC, restarts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tandem import names
from tandem.testing.operator_process import Operator
from tests.k8s.conftest import get_json, wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/inferenceservice-gpu.yaml"
SERVICE = "llama-8b"
POOLS = {"prefill": 1, "decode": 2, "router": 1}


def model_volume(namespace: str) -> str:
    """A static PV + PVC named `models`, so the example's pods can be scheduled."""
    return yaml.safe_dump_all(
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"models-{namespace}"},
                "spec": {
                    "capacity": {"storage": "100Gi"},
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "",
                    "hostPath": {"path": "/tmp/tandem-models"},
                    "claimRef": {"namespace": namespace, "name": "models"},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "models", "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "",
                    "volumeName": f"models-{namespace}",
                    "resources": {"requests": {"storage": "100Gi"}},
                },
            },
        ]
    )


def condition(obj: dict | None, ctype: str) -> dict:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return c
    return {}


def ready_at_current_generation(cp, namespace: str, name: str = SERVICE) -> dict | None:
    obj = get_json(cp, "tsvc", name, namespace=namespace)
    gen = obj["metadata"]["generation"]
    c = condition(obj, "Ready")
    ok = (
        c.get("status") == "True"
        and c.get("observedGeneration") == gen
        and obj["status"].get("observedGeneration") == gen
    )
    return obj if ok else None


def deployment(cp, namespace: str, pool: str, name: str = SERVICE) -> dict | None:
    return get_json(cp, "deployment", f"{name}-{pool}", namespace=namespace)


@pytest.fixture
def llama(control_plane, operator, namespace):
    control_plane.kubectl("apply", "-f", "-", input=model_volume(namespace))
    control_plane.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    wait_for(lambda: ready_at_current_generation(control_plane, namespace), 120, "llama-8b Ready")
    return namespace


def test_apply_creates_ready_gpu_pools(control_plane, llama):
    cp, ns = control_plane, llama
    isvc = get_json(cp, "tsvc", SERVICE, namespace=ns)
    uid = isvc["metadata"]["uid"]
    for pool, replicas in POOLS.items():
        dep = deployment(cp, ns, pool)
        assert dep["spec"]["replicas"] == replicas
        (ref,) = dep["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "InferenceService",
            SERVICE,
            uid,
            True,
        )
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert labels[names.LABEL_SERVICE] == SERVICE and labels[names.LABEL_POOL] == pool
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        if pool == "router":
            assert c["readinessProbe"]["httpGet"]["port"] == names.HTTP_PORT
            assert "nvidia.com/gpu" not in json.dumps(c["resources"])
        else:
            assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
            # probes reach the health-only port, which no work RPC can starve
            assert c["readinessProbe"]["grpc"]["port"] == names.HEALTH_PORT
            assert c["livenessProbe"]["grpc"]["port"] == names.HEALTH_PORT
            assert c["args"][:3] == ["worker", "--role", pool]
        svc = get_json(cp, "service", f"{SERVICE}-{pool}", namespace=ns)
        assert svc["metadata"]["ownerReferences"][0]["uid"] == uid
        assert svc["spec"]["selector"] == {names.LABEL_SERVICE: SERVICE, names.LABEL_POOL: pool}
    assert get_json(cp, "configmap", f"{SERVICE}-config", namespace=ns) is None  # pods get the spec in args
    for kind in ("poddisruptionbudget/llama-8b-decode", "tpool/llama-8b-prefill", "tpool/llama-8b-decode"):
        assert get_json(cp, kind, namespace=ns)["metadata"]["ownerReferences"][0]["uid"] == uid, kind
    pods = get_json(cp, "pods", "-l", f"{names.LABEL_SERVICE}={SERVICE}", namespace=ns)["items"]
    assert len(pods) == sum(POOLS.values())
    for pod in pods:
        assert pod["spec"]["nodeName"].startswith("gpu-node-")
        assert condition(pod, "Ready")["status"] == "True"
    assert isvc["status"]["pools"]["decode"] == {
        "desiredReplicas": 2,
        "readyReplicas": 2,
        "updatedReplicas": 2,
        "summary": "2/2",
    }
    assert isvc["status"]["routerEndpoint"] == f"http://{SERVICE}-router.{ns}.svc:{names.HTTP_PORT}"
    assert condition(isvc, "Degraded")["status"] == "False"
    assert not any(k.startswith("kopf") for k in isvc["metadata"].get("annotations") or {})
    assert set(isvc["status"]) == {
        "observedGeneration",
        "conditions",
        "pools",
        "routerEndpoint",
        "workers",
        "coldStart",
    }
    assert {s["cache"] for p in isvc["status"]["coldStart"].values() for s in p["samples"]} == {
        "none"
    }  # a PVC source
    wait_for(
        lambda: (
            {"Reconciled", "Ready"}
            <= set(
                cp.kubectl(  # Events are written after the status they report
                    "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={SERVICE}"
                ).stdout.split()
            )
        ),
        30,
        "Reconciled and Ready Events",
    )
    header, row = cp.kubectl("get", "tsvc", SERVICE, "-n", ns).stdout.splitlines()[:2]
    assert header.split()[:6] == ["NAME", "READY", "REASON", "MODE", "WORKERS", "ROUTER"]
    assert row.split()[:8] == [
        SERVICE,
        "True",
        "AllPoolsReady",
        "disaggregated",
        "prefill",
        "1/1",
        "decode",
        "2/2",
    ]
    assert row.split()[8] == "1/1"


def _live_pods(cp, ns: str) -> dict[str, list[dict]]:
    """pool -> its pods that are not being deleted."""
    out: dict[str, list[dict]] = {pool: [] for pool in POOLS}
    for pod in get_json(cp, "pods", "-l", f"{names.LABEL_SERVICE}={SERVICE}", namespace=ns)["items"]:
        if not pod["metadata"].get("deletionTimestamp"):
            out[pod["metadata"]["labels"][names.LABEL_POOL]].append(pod)
    return out


def _uids(pods: list[dict]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def _patch_and_wait_ready(cp, ns: str, patch: str) -> None:
    gen = get_json(cp, "tsvc", SERVICE, namespace=ns)["metadata"]["generation"]
    cp.kubectl("patch", "tsvc", SERVICE, "-n", ns, "--type=merge", "-p", patch)
    wait_for(
        lambda: (o := ready_at_current_generation(cp, ns)) and o["metadata"]["generation"] > gen,
        120,
        "Ready at the new generation",
    )


def test_slo_autoscaling_and_bounds_edits_restart_no_gpu_pod(control_plane, llama):
    cp, ns = control_plane, llama
    workers = ("prefill", "decode")
    pods = {pool: _uids(p) for pool, p in _live_pods(cp, ns).items() if pool in workers}
    generations = {pool: deployment(cp, ns, pool)["metadata"]["generation"] for pool in workers}
    _patch_and_wait_ready(
        cp,
        ns,
        '{"spec":{"slo":{"ttftMs":300,"tpotMs":20},'
        '"autoscaling":{"windowSeconds":120},"decode":{"maxReplicas":6}}}',
    )
    time.sleep(2)  # room for a wrong rollout to start
    assert {pool: deployment(cp, ns, pool)["metadata"]["generation"] for pool in workers} == generations
    assert {pool: _uids(p) for pool, p in _live_pods(cp, ns).items() if pool in workers} == pods
    # the router (no GPU) exports the SLO targets with its metrics, so it alone picks up the new ones
    args = deployment(cp, ns, "router")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--slo-ttft-ms") + 1] == "300"


def test_engine_edit_rolls_the_workers_and_image_edit_rolls_every_pod(control_plane, llama):
    cp, ns = control_plane, llama
    before = {pool: _uids(p) for pool, p in _live_pods(cp, ns).items()}
    _patch_and_wait_ready(cp, ns, '{"spec":{"engine":{"maxBatchTokens":4096}}}')
    after = wait_for(
        lambda: (p := _live_pods(cp, ns)) and all(len(p[k]) == n for k, n in POOLS.items()) and p,
        60,
        "old worker pods gone",
    )
    for pool in ("prefill", "decode"):
        assert not _uids(after[pool]) & before[pool], f"{pool} pods were not replaced"
        for pod in after[pool]:
            args = pod["spec"]["containers"][0]["args"]
            assert args[args.index("--max-batch-tokens") + 1] == "4096"
    assert _uids(after["router"]) == before["router"]  # the router does not consume the engine section

    _patch_and_wait_ready(cp, ns, '{"spec":{"image":"tandem-worker:0.2.0"}}')
    live = wait_for(
        lambda: (
            (p := _live_pods(cp, ns))
            and all(len(p[k]) == n for k, n in POOLS.items())
            and {q["spec"]["containers"][0]["image"] for v in p.values() for q in v}
            == {"tandem-worker:0.2.0"}
            and p
        ),
        60,
        "every pod on the new image",
    )
    assert not _uids(live["router"]) & before["router"]


def test_scale_one_pool_changes_only_that_pool(control_plane, llama):
    cp, ns = control_plane, llama
    cp.kubectl("scale", "tpool", f"{SERVICE}-decode", "-n", ns, "--replicas=3")
    wait_for(lambda: deployment(cp, ns, "decode")["spec"]["replicas"] == 3, 30, "decode scaled to 3")
    obj = wait_for(
        lambda: (
            (o := ready_at_current_generation(cp, ns))
            and o["status"]["pools"]["decode"]["readyReplicas"] == 3
            and o
        ),
        60,
        "3 decode ready",
    )
    assert obj["status"]["pools"]["prefill"]["desiredReplicas"] == 1
    assert deployment(cp, ns, "prefill")["spec"]["replicas"] == 1
    scale = json.loads(
        cp.kubectl(
            "get",
            "--raw",
            f"/apis/serving.tandem.dev/v1alpha1/namespaces/{ns}/tandempools/{SERVICE}-decode/scale",
        ).stdout
    )
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == f"{names.LABEL_SERVICE}={SERVICE},{names.LABEL_POOL}=decode"
    # the InferenceService's replicas are only the initial size: the scaled pool stays where kubectl put it
    time.sleep(3)
    assert deployment(cp, ns, "decode")["spec"]["replicas"] == 3


def test_deleted_or_edited_child_is_restored(control_plane, llama):
    cp, ns = control_plane, llama
    old_uid = deployment(cp, ns, "prefill")["metadata"]["uid"]
    cp.kubectl("delete", "deployment", f"{SERVICE}-prefill", "-n", ns, "--wait=false")
    wait_for(
        lambda: (d := deployment(cp, ns, "prefill")) and d["metadata"]["uid"] != old_uid,
        30,
        "prefill Deployment recreated",
    )
    cp.kubectl("delete", "service", f"{SERVICE}-router", "-n", ns, "--wait=false")
    wait_for(
        lambda: get_json(cp, "service", f"{SERVICE}-router", namespace=ns), 30, "router Service recreated"
    )
    cp.kubectl(
        "patch",
        "deployment",
        f"{SERVICE}-decode",
        "-n",
        ns,
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"evil:1"}]',
    )
    wait_for(
        lambda: (
            deployment(cp, ns, "decode")["spec"]["template"]["spec"]["containers"][0]["image"]
            == "tandem-worker:0.1.0"
        ),
        30,
        "decode image restored",
    )
    cp.kubectl(
        "patch",
        "poddisruptionbudget",
        f"{SERVICE}-decode",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"maxUnavailable":5}}',
    )
    wait_for(
        lambda: (
            get_json(cp, "poddisruptionbudget", f"{SERVICE}-decode", namespace=ns)["spec"]["maxUnavailable"]
            == 1
        ),
        30,
        "PodDisruptionBudget restored",
    )
    wait_for(lambda: ready_at_current_generation(cp, ns), 60, "Ready again")


def test_delete_garbage_collects_every_child(control_plane, llama):
    cp, ns = control_plane, llama
    cp.kubectl("delete", "tsvc", SERVICE, "-n", ns)
    selector = f"{names.LABEL_SERVICE}={SERVICE}"

    def gone():
        out = cp.kubectl(
            "get",
            "deployments,services,poddisruptionbudgets,tandempools,replicasets,pods",
            "-n",
            ns,
            "-l",
            selector,
            "-o",
            "name",
        ).stdout
        return out.strip() == ""

    wait_for(gone, 60, "children garbage-collected")


def _children_fingerprint(cp, ns: str) -> dict:
    out = {}
    for kind in ("deployments", "services", "poddisruptionbudgets", "tandempools"):
        for item in get_json(cp, kind, "-l", f"{names.LABEL_SERVICE}={SERVICE}", namespace=ns)["items"]:
            meta = item["metadata"]
            # generation moves on spec writes; objects without one (Service) use resourceVersion
            out[f"{kind}/{meta['name']}"] = (meta["uid"], meta.get("generation") or meta["resourceVersion"])
    return out


def test_operator_restart_creates_no_duplicates_and_keeps_status(control_plane, operator, llama):
    cp, ns = control_plane, llama
    before = _children_fingerprint(cp, ns)
    status_before = get_json(cp, "tsvc", SERVICE, namespace=ns)["status"]
    operator.stop()
    try:
        operator.start().wait_leading()
        # a new object proves the restarted operator acts; the old one must be left exactly as it was
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
                    "metadata": {"name": "probe"},
                    "spec": {
                        "model": {"source": {"path": "/m"}, "servedName": "probe"},
                        "prefill": {"resources": {"gpus": 1}},
                        "decode": {"resources": {"gpus": 1}},
                    },
                }
            ),
        )
        wait_for(lambda: ready_at_current_generation(cp, ns, "probe"), 90, "probe Ready")
        time.sleep(2)
    finally:
        if operator.proc is None:
            operator.start()
    assert _children_fingerprint(cp, ns) == before
    status_after = get_json(cp, "tsvc", SERVICE, namespace=ns)["status"]
    assert status_after == status_before


def _healthz(op: Operator) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{op.health_port}/healthz", timeout=5) as resp:
        return resp.read().decode().strip()


def test_second_operator_waits_for_the_lease(control_plane, operator):
    standby = Operator(control_plane, name="standby").start()
    try:
        wait_for(lambda: "waiting for default/tandem-operator" in standby.log(), 30, "standby waits")
        time.sleep(3)
        assert "leads" not in standby.log()
        # both pass their probes: a standby is healthy while it waits, the leader while its loop turns
        assert wait_for(lambda: _healthz(standby), 10, "standby /healthz") == "standby: waiting for the lease"
        assert _healthz(operator) == "leader"
    finally:
        standby.stop()

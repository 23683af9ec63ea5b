"""Fixtures for the real-node tests: one control plane (no fake nodes), one real kubelet + containerd node,
a minimal cluster DNS, the images built from images/*.Dockerfile, the operator, and a tiny InferenceService.
They build and start slow things (first run: images and kubelet), so they run only when asked:
TANDEM_REALNODE=1 pytest tests/k8s/realnode."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tandem.testing.cluster import ControlPlane, find_binaries
from tandem.testing.operator_process import Operator
from tests.k8s.conftest import PSS_ENFORCE, wait_for

HERE = Path(__file__).resolve().parent
ENABLE = "TANDEM_REALNODE"
SERVICE = "tiny"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"realnode: runs pods on a real kubelet + containerd node (set {ENABLE}=1)"
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.realnode)
            # the first test also waits for the session's node: builds, and the images loaded into containerd
            item.add_marker(pytest.mark.timeout(1800))
            if os.environ.get(ENABLE) != "1":
                item.add_marker(
                    pytest.mark.skip(
                        reason=(
                            "real-node tests build images and a kubelet and start containerd (minutes, "
                            f"root): run them with {ENABLE}=1 pytest tests/k8s/realnode"
                        )
                    )
                )


class RealCluster:
    def __init__(self, cp: ControlPlane, node, dns, images: dict[str, tuple[str, Path]]):
        self.cp, self.node, self.dns, self.images = cp, node, dns, images


@pytest.fixture(scope="session")
def real_cluster():
    if os.geteuid() != 0:
        pytest.skip("a real node needs root (containerd, mounts, cgroups)")
    from tests.k8s.realnode.dns import ClusterDns
    from tests.k8s.realnode.node import GATEWAY, RealNode, build, start_control_plane

    try:
        cp_bin = find_binaries()
    except RuntimeError as e:
        pytest.skip(str(e))
    node_bin, images = build("operator", "worker")
    cp = ControlPlane(cp_bin, nodes=1, serve_on=GATEWAY)  # an in-cluster operator calls it on the bridge
    node = dns = None
    try:
        start_control_plane(cp)
        cp.install_crds_and_rbac()
        RealNode.make_bridge()
        dns = ClusterDns(cp, GATEWAY).start()
        node = RealNode(cp, node_bin, images, cluster_dns=GATEWAY).start()
        yield RealCluster(cp, node, dns, images)
    finally:
        if node is not None:
            node.stop()
        if dns is not None:
            dns.stop()
        cp.stop()


@pytest.fixture(scope="session")
def real_operator(real_cluster):
    op = Operator(real_cluster.cp).start().wait_leading()
    yield op
    op.stop()


def tiny_model_dir() -> Path:
    """A tiny random Llama (`tandem model create-tiny`) in a folder the pods' uid 1000 can read."""
    d = Path(tempfile.mkdtemp(prefix="tandem-realnode-model-"))
    d.chmod(0o755)
    subprocess.run(
        [sys.executable, "-m", "tandem", "model", "create-tiny", str(d / "tiny")],
        check=True,
        capture_output=True,
    )
    for p in [d, *d.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return d


def tiny_service(namespace: str, image: str, model_pv: str) -> str:
    """The PV/PVC holding the tiny model and an InferenceService on it: router, 1 prefill, 2 decode, no GPU,
    with role flips on (each worker follows its role label through a downward-API file)."""
    isvc = {
        "apiVersion": "serving.tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": SERVICE, "namespace": namespace},
        "spec": {
            "model": {
                "source": {"pvc": {"claimName": "models", "path": "tiny"}},
                "servedName": "tiny",
                "dtype": "float32",
                "maxContextLength": 2048,
            },
            "mode": "disaggregated",
            "image": image,
            "roleFlip": True,
            "prefill": {"replicas": 1, "resources": {"gpus": 0}},
            "decode": {"replicas": 2, "minReplicas": 1, "maxReplicas": 2, "resources": {"gpus": 0}},
            "slo": {"ttftMs": 5000, "tpotMs": 1000, "percentile": 90},
            "autoscaling": {"enabled": False},
            "engine": {"blockSize": 16, "numKvBlocks": 512},
        },
    }
    return yaml.safe_dump_all(
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"models-{namespace}"},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "",
                    "hostPath": {"path": model_pv, "type": "Directory"},
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
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
            isvc,
        ]
    )


@contextmanager
def tiny_namespace(real_cluster: RealCluster):
    """A restricted namespace running the tiny InferenceService, every pod Ready on the real node (whichever
    operator reconciles it); deleted on the way out."""
    cp = real_cluster.cp
    ns = f"rn-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", ns)
    cp.kubectl("label", "namespace", ns, f"{PSS_ENFORCE}=restricted")
    wait_for(
        lambda: cp.kubectl("get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0,
        60,
        "default service account",
    )
    model = tiny_model_dir()
    cp.kubectl("apply", "-f", "-", input=tiny_service(ns, real_cluster.images["WORKER"][0], str(model)))
    try:
        wait_for(lambda: all_ready(cp, ns, 4), 600, "router, prefill and 2 decode pods Ready", interval=2)
        yield ns
    finally:
        cp.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False, timeout=150)
        shutil.rmtree(model, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny(real_cluster, real_operator):
    """The tiny InferenceService, reconciled by the operator running as a process on this machine."""
    with tiny_namespace(real_cluster) as ns:
        yield ns


def pods(cp: ControlPlane, ns: str, pool: str | None = None) -> list[dict]:
    import json

    from tandem import names

    sel = f"{names.LABEL_SERVICE}={SERVICE}" + (f",{names.LABEL_POOL}={pool}" if pool else "")
    return json.loads(cp.kubectl("get", "pods", "-n", ns, "-l", sel, "-o", "json").stdout)["items"]


def is_ready(pod: dict) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return conds.get("Ready") == "True"


def all_ready(cp: ControlPlane, ns: str, count: int) -> bool:
    items = pods(cp, ns)
    return len(items) == count and all(is_ready(p) for p in items)

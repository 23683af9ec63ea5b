"""Feasibility of real pods here, in one run: build (cached) containerd + runc + a kubelet from the control
plane's Kubernetes version, join the test control plane as one real CPU node, and run one pod of a locally
built image (Debian + Python, no registry) to Ready through a real HTTP readiness probe. Prints each step and
exits 0 only if the pod became Ready and answered on its pod IP. Usage: python -m
tests.k8s.realnode.feasibility"""

from __future__ import annotations

import json
import sys
import time
import urllib.request

import yaml

from tandem.testing.cluster import ControlPlane, find_binaries
from tests.k8s.realnode.node import NODE_LABEL, NODE_NAME, RealNode, build, start_control_plane


def pod(image: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": {
            "nodeSelector": {NODE_LABEL: "true"},
            "containers": [
                {
                    "name": "web",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-m", "http.server", "8080", "--directory", "/etc"],
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/hostname", "port": 8080}, "periodSeconds": 1},
                }
            ],
        },
    }


def main() -> int:
    t0 = time.monotonic()

    def step(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {msg}", flush=True)

    step("building the control plane, kubelet and images (cached)")
    cp_bin = find_binaries()
    node_bin, images = build()
    step(f"kubelet in {node_bin}; images {[ref for ref, _ in images.values()]}")
    cp = ControlPlane(cp_bin, nodes=1)
    node = None
    try:
        start_control_plane(cp)
        step(f"control plane up at {cp.server}")
        node = RealNode(cp, node_bin, images).start()
        info = json.loads(cp.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)["status"]["nodeInfo"]
        step(
            f"node {NODE_NAME} Ready: kubelet {info['kubeletVersion']}, runtime "
            f"{info['containerRuntimeVersion']}"
        )
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod(images["BASE"][0])))
        out = cp.kubectl(
            "wait", "--for=condition=Ready", "pod/hello", "--timeout=180s", check=False, timeout=200
        )
        if out.returncode != 0:
            step("pod did not become Ready:\n" + cp.kubectl("describe", "pod", "hello").stdout[-3000:])
            return 1
        ip = cp.kubectl("get", "pod", "hello", "-o", "jsonpath={.status.podIP}").stdout.strip()
        body = urllib.request.urlopen(f"http://{ip}:8080/hostname", timeout=10).read().decode().strip()
        step(f"pod Ready at {ip}; it served its /etc/hostname: {body!r}")
        return 0 if body == "hello" else 1
    finally:
        if node is not None:
            node.stop()
        cp.stop()
        step("stopped and cleaned up")


if __name__ == "__main__":
    sys.exit(main())

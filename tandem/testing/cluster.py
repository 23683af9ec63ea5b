"""Start and stop a real Kubernetes control plane on loopback (etcd, apiserver, controller-manager,
scheduler, kwok fake GPU nodes) from binaries built by tests/k8s/build-controlplane.sh. Used by the k8s
tests and bench/operator.py (a source checkout: it applies the repository's CRDs and RBAC)."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from tandem.testing.cluster_certs import write_certs

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "tests" / "k8s" / "build-controlplane.sh"
LOOPBACK = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")
USERS = {  # name -> (token, groups)
    "admin": ("admin-token", "system:masters"),
    "system:kube-controller-manager": ("kcm-token", ""),
    "system:kube-scheduler": ("scheduler-token", ""),
    "tandem-operator": ("operator-token", ""),
}


def find_binaries(build: bool = True) -> Path:
    """The bin folder; builds it with the script when missing. Raises RuntimeError without Go."""
    if os.environ.get("TANDEM_CONTROLPLANE_BIN"):
        return Path(os.environ["TANDEM_CONTROLPLANE_BIN"])
    if not build:
        raise RuntimeError("control-plane binaries not built")
    if shutil.which("go") is None:
        raise RuntimeError(
            "go is not installed; cannot build the control plane (tests/k8s/build-controlplane.sh)"
        )
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, text=True, stdout=subprocess.PIPE)
    return Path(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def fake_gpu_node(name: str, gpus: int = 8) -> dict:
    """A node kwok keeps Ready, with nvidia.com/gpu capacity."""
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.present": "true",
            },
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": capacity, "nodeInfo": {"kubeletVersion": "fake"}},
    }


class ControlPlane:
    """One throwaway cluster. start() returns when the API is ready and fake nodes exist."""

    def __init__(
        self, bin_dir: Path, workdir: Path | None = None, nodes: int = 4, serve_on: str | None = None
    ):
        """serve_on: an address of this machine (a real node's pod bridge) where the API server also answers,
        for pods that call it (an in-cluster operator); its certificate names that address too."""
        self.bin = bin_dir
        self.serve_on = serve_on
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="tandem-k8s-"))
        self.nodes = nodes
        self.procs: dict[str, subprocess.Popen] = {}
        self.argv: dict[str, list[str]] = {}  # each component's command line, to restart it as it was
        self.logs = self.dir / "logs"
        self.port = free_port()
        self.server = f"https://{LOOPBACK}:{self.port}"

    # --- files -------------------------------------------------------------------------------------
    def token_kubeconfig(self, name: str, token: str) -> Path:
        """A kubeconfig that authenticates with `token` (e.g. a ServiceAccount's, from the TokenRequest
        API)."""
        return self._write_kubeconfig(self.dir / f"{name}.kubeconfig", name, token)

    def kubeconfig(self, user: str = "admin") -> Path:
        path = self.dir / f"{user.replace(':', '-')}.kubeconfig"
        return path if path.exists() else self._write_kubeconfig(path, user, USERS[user][0])

    def _write_kubeconfig(self, path: Path, user: str, token: str) -> Path:
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "tandem",
            "clusters": [
                {
                    "name": "tandem",
                    "cluster": {"server": self.server, "certificate-authority": str(self.dir / "ca.crt")},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {"name": "tandem", "context": {"cluster": "tandem", "user": user, "namespace": "default"}}
            ],
        }
        path.write_text(yaml.safe_dump(cfg))
        return path

    def _prepare(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        write_certs(self.dir, LOOPBACK, self.serve_on)
        lines = [
            f'{tok},{user},{user}-uid,"{groups}"' if groups else f"{tok},{user},{user}-uid"
            for user, (tok, groups) in USERS.items()
        ]
        (self.dir / "tokens.csv").write_text("\n".join(lines) + "\n")

    # --- processes ---------------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], env: dict | None = None) -> None:
        log = open(self.logs / f"{name}.log", "a")
        self.argv[name] = args
        self.procs[name] = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def kubectl(
        self,
        *args: str,
        user: str = "admin",
        input: str | None = None,
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / "kubectl"), "--kubeconfig", str(self.kubeconfig(user)), *args]
        out = subprocess.run(cmd, input=input, text=True, capture_output=True, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {out.stderr}")
        return out

    def _wait(self, what: str, ok, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    tail = (self.logs / f"{name}.log").read_text()[-3000:]
                    raise RuntimeError(f"{name} exited ({p.returncode}) while waiting for {what}:\n{tail}")
            if ok():
                return
            time.sleep(0.3)
        raise TimeoutError(f"timed out waiting for {what}; logs in {self.logs}")

    def start(self) -> ControlPlane:
        atexit.register(self.stop)  # no stray servers if the caller dies before stop()
        self._prepare()
        etcd_port, peer_port = free_port(), free_port()
        etcd_url = f"http://{LOOPBACK}:{etcd_port}"
        self._spawn(
            "etcd",
            [
                str(self.bin / "etcd"),
                "--data-dir",
                str(self.dir / "etcd"),
                "--listen-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://{LOOPBACK}:{peer_port}",
            ],
        )
        d = self.dir
        self._spawn(
            "kube-apiserver",
            [
                str(self.bin / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--bind-address={'0.0.0.0' if self.serve_on else LOOPBACK}",
                f"--advertise-address={self.serve_on or LOOPBACK}",
                f"--secure-port={self.port}",
                f"--tls-cert-file={d / 'apiserver.crt'}",
                f"--tls-private-key-file={d / 'apiserver.key'}",
                f"--client-ca-file={d / 'ca.crt'}",
                f"--token-auth-file={d / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={d / 'sa.pub'}",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                "--enable-priority-and-fairness=false",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                f"--cert-dir={d / 'apiserver-certs'}",
            ],
        )
        self._wait("kube-apiserver /readyz", self._ready, 180)
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig('system:kube-controller-manager')}",
                f"--authentication-kubeconfig={self.kubeconfig('system:kube-controller-manager')}",
                f"--authorization-kubeconfig={self.kubeconfig('system:kube-controller-manager')}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={free_port()}",
                f"--cert-dir={d / 'kcm-certs'}",
                f"--service-account-private-key-file={d / 'sa.key'}",
                f"--root-ca-file={d / 'ca.crt'}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--leader-elect=false",
                # kwok fakes the nodes; on a loaded 2-core machine its heartbeats lag, and the node lifecycle
                # controller would then mark every pod NotReady. Node failure is not what these tests test.
                "--controllers=*,-node-ipam-controller,-node-lifecycle-controller,-cloud-node-lifecycle-controller,"
                "-service-lb-controller,-node-route-controller",
                "--concurrent-deployment-syncs=10",
                "--concurrent-replicaset-syncs=10",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin / "kube-scheduler"),
                f"--kubeconfig={self.kubeconfig('system:kube-scheduler')}",
                f"--authentication-kubeconfig={self.kubeconfig('system:kube-scheduler')}",
                f"--authorization-kubeconfig={self.kubeconfig('system:kube-scheduler')}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={free_port()}",
                f"--cert-dir={d / 'scheduler-certs'}",
                "--leader-elect=false",
            ],
        )
        self._spawn(
            "kwok",
            [
                str(self.bin / "kwok"),
                f"--kubeconfig={self.kubeconfig('admin')}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--node-ip={LOOPBACK}",
                f"--server-address={LOOPBACK}:{free_port()}",
                "--cidr=10.244.0.0/16",
            ],
        )
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump_all([fake_gpu_node(f"gpu-node-{i}") for i in range(self.nodes)]),
        )
        # the API server taints new nodes not-ready; with the node lifecycle controller off, lift it here
        self._wait("fake nodes Ready", self._nodes_ready, 120)
        self.kubectl("taint", "nodes", "--all", "node.kubernetes.io/not-ready:NoSchedule-", check=False)
        self._wait(
            "default service account",
            lambda: self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
            120,
        )
        return self

    def restart_apiserver(self, down_seconds: float = 0.0) -> float:
        """Stop kube-apiserver (etcd and everything else keep running), start it again with the same flags,
        and wait for /readyz; returns the seconds the API was unreachable."""
        p = self.procs["kube-apiserver"]
        started = time.monotonic()
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        time.sleep(down_seconds)
        self._spawn("kube-apiserver", self.argv["kube-apiserver"])
        self._wait("kube-apiserver /readyz after a restart", self._ready, 180)
        return time.monotonic() - started

    def _ready(self) -> bool:
        try:
            out = self.kubectl("get", "--raw", "/readyz", check=False, timeout=10)
        except subprocess.TimeoutExpired:  # a loaded machine: the API server is still starting
            return False
        return out.returncode == 0 and out.stdout.strip() == "ok"

    def _nodes_ready(self) -> bool:
        out = self.kubectl(
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}",
            check=False,
        )
        states = out.stdout.split()
        return len(states) == self.nodes and all(s == "True" for s in states)

    def install_crds_and_rbac(self) -> None:
        self.kubectl("apply", "--server-side", "-f", str(ROOT / "charts/tandem/files/crds"))
        self.wait_established(["inferenceservices.serving.tandem.dev", "tandempools.serving.tandem.dev"], 60)
        self.kubectl("apply", "-f", str(ROOT / "charts/tandem/files/operator-clusterrole.yaml"))
        self.kubectl(
            "create",
            "clusterrolebinding",
            "tandem-operator",
            "--clusterrole=tandem-operator",
            "--user=tandem-operator",
            check=False,
        )

    def wait_established(self, crds: list[str], timeout: float) -> None:
        """Wait until every named CRD is Established. Polled rather than `kubectl wait`, which fails at once
        on a CRD whose status has no conditions yet (a loaded API server that has not reached it)."""

        def established() -> bool:
            out = self.kubectl("get", "crd", "-o", "json", check=False, timeout=30)
            if out.returncode != 0:
                return False
            done = {
                c["metadata"]["name"]
                for c in json.loads(out.stdout)["items"]
                if any(
                    k.get("type") == "Established" and k.get("status") == "True"
                    for k in (c.get("status") or {}).get("conditions") or []
                )
            }
            return set(crds) <= done

        self._wait(f"CRDs established: {', '.join(crds)}", established, timeout)

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()
        if not os.environ.get("TANDEM_KEEP_CLUSTER_DIR"):
            shutil.rmtree(self.dir, ignore_errors=True)

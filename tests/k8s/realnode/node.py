"""One real Kubernetes node (containerd + runc + a kubelet built from Go modules, CPU only) joined to the test
control plane of tandem/testing/cluster.py, so pods really start. Pods get addresses on a bridge inside this
machine with no default route: they reach each other and the host, nothing else. stop() removes every trace
(containers, shims, mounts, network namespaces, the bridge, cgroups)."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from tandem.testing.cluster import ControlPlane, free_port

HERE = Path(__file__).resolve().parent
BRIDGE = "tandem-rn0"
POD_CIDR = "10.250.0.0/24"
GATEWAY = "10.250.0.1"  # the bridge's own address: the kubelet serves here, its probes come from here
# The API server dials a kubelet by its Hostname address first, and a name would be looked up in the
# machine's resolver (off this machine): named after its own address, the node is dialled without a lookup.
NODE_NAME = GATEWAY
NODE_LABEL = "tandem.dev/realnode"
CGROUP_ROOT = Path("/sys/fs/cgroup")


def build(*project_images: str) -> tuple[Path, dict[str, tuple[str, Path]]]:
    """Run build-node.sh and images.sh (both cached; project_images: "operator", "worker"); returns the bin
    folder and {NAME: (image ref, OCI archive)}."""
    out = subprocess.run(["bash", str(HERE / "build-node.sh")], check=True, text=True, stdout=subprocess.PIPE)
    bin_dir = Path(out.stdout.strip().splitlines()[-1])
    out = subprocess.run(
        ["bash", str(HERE / "images.sh"), str(bin_dir / "pause"), *project_images],
        check=True,
        text=True,
        stdout=subprocess.PIPE,
    )
    images = {}
    for line in out.stdout.splitlines():
        if "=" in line and " " in line:
            name, rest = line.split("=", 1)
            ref, path = rest.split(" ", 1)
            images[name] = (ref, Path(path))
    return bin_dir, images


def start_control_plane(cp: ControlPlane) -> ControlPlane:
    """Start `cp` (built with nodes=1) and delete its one kwok fake node: every pod must land on the real
    one."""
    cp.start()
    cp.kubectl("delete", "nodes", "-l", "type=kwok", "--wait=true")
    return cp


def _mounts_under(prefixes: list[str]) -> list[str]:
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].encode().decode("unicode_escape") for line in f]
    return sorted(
        {p for p in points if any(p == x or p.startswith(x.rstrip("/") + "/") for x in prefixes)},
        key=len,
        reverse=True,
    )


class RealNode:
    """containerd and a kubelet on this machine, registered as NODE_NAME with the label NODE_LABEL=true."""

    def __init__(
        self,
        cp: ControlPlane,
        bin_dir: Path,
        images: dict[str, tuple[str, Path]],
        cluster_dns: str | None = None,
    ):
        """cluster_dns: the nameserver the pods' resolv.conf names (ClusterDns on GATEWAY), or none."""
        self.cp, self.bin, self.images, self.cluster_dns = cp, bin_dir, images, cluster_dns
        # short paths: the containerd socket must fit in a unix socket address
        self.run_dir = Path(tempfile.mkdtemp(prefix="tnr-", dir="/run"))
        self.dir = cp.dir / "realnode"
        self.procs: dict[str, subprocess.Popen] = {}
        self.sock = self.run_dir / "containerd.sock"
        self.kubelet_port = free_port()
        self.netns_before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
        self.netns_dir_existed = os.path.isdir("/run/netns")

    # --- files -------------------------------------------------------------------------------------
    def _containerd_config(self) -> Path:
        cni = self.dir / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "0.4.0",
            "name": "tandem-realnode",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "isDefaultGateway": False,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(cni / "ipam"),
                        "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                        "routes": [],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (cni / "net.d" / "10-tandem.conflist").write_text(json.dumps(conflist, indent=1))
        cfg = f"""version = 2
root = "{self.dir / "containerd"}"
state = "{self.run_dir / "state"}"
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{self.run_dir / "ttrpc.sock"}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.dir / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.images["PAUSE"][0]}"
  enable_selinux = false
  # On a host that drops CAP_SYS_RESOURCE runc cannot lower oom_score_adj below ours (the pause
  # container's -998 fails with "failed to update /proc/self/oom_score_adj: Permission denied").
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{self.run_dir / "runc"}"
        BinaryName = "{os.environ.get("TANDEM_REALNODE_RUNC", "runc")}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni / "net.d"}"
"""
        path = self.dir / "containerd.toml"
        path.write_text(cfg)
        return path

    def _kubelet_files(self) -> tuple[Path, Path]:
        """A client certificate for system:node:NODE_NAME signed by the control plane's CA, its kubeconfig,
        and the KubeletConfiguration."""
        d, ca = self.dir, self.cp.dir
        subprocess.run(
            [
                "openssl",
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "kubelet.key",
                "-out",
                "kubelet.csr",
                "-subj",
                f"/O=system:nodes/CN=system:node:{NODE_NAME}",
            ],
            cwd=d,
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                "openssl",
                "x509",
                "-req",
                "-in",
                "kubelet.csr",
                "-CA",
                str(ca / "ca.crt"),
                "-CAkey",
                str(ca / "ca.key"),
                "-CAcreateserial",
                "-out",
                "kubelet.crt",
                "-days",
                "2",
            ],
            cwd=d,
            check=True,
            capture_output=True,
        )
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "node",
            "clusters": [
                {
                    "name": "tandem",
                    "cluster": {"server": self.cp.server, "certificate-authority": str(ca / "ca.crt")},
                }
            ],
            "users": [
                {
                    "name": "node",
                    "user": {
                        "client-certificate": str(d / "kubelet.crt"),
                        "client-key": str(d / "kubelet.key"),
                    },
                }
            ],
            "contexts": [{"name": "node", "context": {"cluster": "tandem", "user": "node"}}],
        }
        (d / "kubelet.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        # The pods' resolv.conf: never the host's resolver (off this machine); cluster DNS is set per test.
        (d / "resolv.conf").write_text("options ndots:5\n")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # the kubelet refuses a loopback node IP: it serves on the pods' bridge (this machine only)
            "address": GATEWAY,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "podLogsDir": str(d / "pod-logs"),
            "clusterDomain": "cluster.local",
            "resolvConf": str(d / "resolv.conf"),
            "podCIDR": POD_CIDR,
            "maxPods": 30,
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "makeIPTablesUtilChains": False,
            "registerNode": True,
            "rotateCertificates": False,
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "shutdownGracePeriod": "0s",
            "localStorageCapacityIsolation": True,
        }
        if self.cluster_dns:
            config["clusterDNS"] = [self.cluster_dns]
        (d / "kubelet.yaml").write_text(yaml.safe_dump(config))
        return d / "kubelet.kubeconfig", d / "kubelet.yaml"

    # --- processes ---------------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.cp.logs / f"{name}.log", "a")
        self.procs[name] = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True
        )

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ctr", "--address", str(self.sock), "--namespace", "k8s.io", *args],
            text=True,
            capture_output=True,
            check=check,
            timeout=600,
        )

    def _wait(self, what: str, ok, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    tail = (self.cp.logs / f"{name}.log").read_text()[-4000:]
                    raise RuntimeError(f"{name} exited ({p.returncode}) while waiting for {what}:\n{tail}")
            if ok():
                return
            time.sleep(0.5)
        raise TimeoutError(f"timed out waiting for {what}; logs in {self.cp.logs}")

    @staticmethod
    def make_bridge() -> None:
        """The pods' bridge with the gateway address, made before any pod so a DNS server can bind to it
        (the CNI bridge plugin adopts it as it is)."""
        if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0:
            subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True)
            subprocess.run(
                ["ip", "addr", "add", f"{GATEWAY}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE], check=True
            )
        subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True)

    def start(self, timeout: float = 180) -> RealNode:
        atexit.register(self.stop)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.make_bridge()
        cfg = self._containerd_config()
        self._spawn("containerd", ["containerd", "--config", str(cfg)])
        self._wait("containerd", lambda: self.ctr("version", check=False).returncode == 0, 60)
        for ref, archive in self.images.values():
            self.ctr("images", "import", "--snapshotter=overlayfs", str(archive))
            if self.ctr("images", "ls", "-q", check=False).stdout.find(ref) < 0:
                raise RuntimeError(f"image {ref} did not import from {archive}")
        kubeconfig, config = self._kubelet_files()
        # RBAC only (no Node authorizer) in the test control plane: the kubelet's user gets the node role
        self.cp.kubectl(
            "create",
            "clusterrolebinding",
            "tandem-realnode",
            "--clusterrole=system:node",
            f"--user=system:node:{NODE_NAME}",
            check=False,
        )
        self._spawn(
            "kubelet",
            [
                str(self.bin / "kubelet"),
                f"--kubeconfig={kubeconfig}",
                f"--config={config}",
                f"--root-dir={self.dir / 'kubelet'}",
                f"--cert-dir={self.dir / 'kubelet-pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={GATEWAY}",
                f"--node-labels={NODE_LABEL}=true",
                "--v=2",
            ],
        )
        self._wait("the real node Ready", self._ready, timeout)
        # The node lifecycle controller (which lifts this taint) is off in the test control plane.
        self.cp.kubectl("taint", "node", NODE_NAME, "node.kubernetes.io/not-ready:NoSchedule-", check=False)
        return self

    def _ready(self) -> bool:
        out = self.cp.kubectl(
            "get",
            "node",
            NODE_NAME,
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )
        return out.returncode == 0 and out.stdout.strip() == "True"

    def stop(self) -> None:
        """Stop the kubelet, every container and its shim, containerd; unmount and delete what they made."""
        kubelet = self.procs.pop("kubelet", None)
        if kubelet and kubelet.poll() is None:
            os.killpg(kubelet.pid, signal.SIGTERM)
            kubelet.wait(timeout=30)
        if "containerd" in self.procs and self.procs["containerd"].poll() is None:
            tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
            for t in tasks:
                self.ctr("tasks", "kill", "-s", "SIGKILL", t, check=False)
            time.sleep(1)
            for t in tasks:
                self.ctr("tasks", "delete", "-f", t, check=False)
        self._kill_shims()
        containerd = self.procs.pop("containerd", None)
        if containerd and containerd.poll() is None:
            os.killpg(containerd.pid, signal.SIGTERM)
            try:
                containerd.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(containerd.pid, signal.SIGKILL)
                containerd.wait()
        self._kill_shims()
        for point in _mounts_under([str(self.dir), str(self.run_dir)]):
            subprocess.run(["umount", "-l", point], capture_output=True)
        if os.path.isdir("/run/netns"):
            for ns in set(os.listdir("/run/netns")) - self.netns_before:
                if ns.startswith("cni-"):
                    subprocess.run(["umount", "-l", f"/run/netns/{ns}"], capture_output=True)
                    Path(f"/run/netns/{ns}").unlink(missing_ok=True)
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
        self._remove_cgroups()
        self._remove_host_traces()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_shims(self) -> None:
        """containerd-shim-runc-v2 processes outlive containerd; end the ones serving this node's socket."""
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and str(self.sock).encode() in cmd:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _remove_host_traces(self) -> None:
        """What containerd 1.6 and the kubelet write to fixed host paths: log symlinks, CNI result caches,
        the device-plugin socket, the shims' socket folders (only when empty)."""
        logs = Path("/var/log/containers")
        if logs.is_dir():
            for link in logs.iterdir():
                if link.is_symlink() and os.readlink(link).startswith(str(self.dir)):
                    link.unlink()
        results = Path("/var/lib/cni/results")
        if results.is_dir():
            ours = [f for f in results.iterdir() if f.name.startswith("tandem-realnode-")]
            ids = {f.name[len("tandem-realnode-") :].rsplit("-", 1)[0] for f in ours}
            for f in [*ours, *(results / f"cni-loopback-{i}-lo" for i in ids)]:
                f.unlink(missing_ok=True)
        Path("/var/lib/kubelet/device-plugins/kubelet.sock").unlink(missing_ok=True)
        # containerd makes /run/netns and bind-mounts it onto itself; undo that when it was not there before
        if not self.netns_dir_existed and os.path.isdir("/run/netns") and not os.listdir("/run/netns"):
            subprocess.run(["umount", "/run/netns"], capture_output=True)
            try:
                os.rmdir("/run/netns")
            except OSError:
                pass
        for d in (
            "/var/lib/kubelet/device-plugins",
            "/var/lib/kubelet",
            "/var/lib/cni/results",
            "/var/lib/cni",
            "/run/containerd/fifo",
            "/run/containerd/s",
            "/run/containerd/runc/k8s.io",
            "/run/containerd/runc",
            "/run/containerd",
            "/var/log/pods",
            "/var/log/containers",
        ):
            try:
                os.rmdir(d)
            except OSError:
                pass

    @staticmethod
    def _remove_cgroups() -> None:
        """The kubelet's cgroup tree (kubepods) in each v1 hierarchy, leaves first."""
        for hierarchy in CGROUP_ROOT.iterdir():
            top = hierarchy / "kubepods"
            if not top.is_dir():
                continue
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: len(w[0]), reverse=True):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass

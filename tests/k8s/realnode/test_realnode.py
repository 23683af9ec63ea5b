"""The operator's pods on a real kubelet + containerd node, from the images built from images/*.Dockerfile:
real probes, the restricted security context as the runtime applies it, the model volume, a streamed
request through the router's Service, and a scale-down whose victim drains (preStop) an open stream."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request

from tandem import names
from tandem.operator.manifests.pod_role import PODINFO_MOUNT
from tests.k8s.conftest import wait_for
from tests.k8s.realnode.conftest import SERVICE, is_ready, pods

# Long enough that the victim is still streaming when the scale-down reaches it (400 took ~7 s here).
STREAM_TOKENS = 1500


def exec_in(cp, ns: str, pod: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return cp.kubectl("exec", "-n", ns, pod, "--", *cmd, check=check, timeout=60)


class PortForward:
    """`kubectl port-forward svc/NAME` to a loopback port (the API server -> kubelet -> containerd path)."""

    def __init__(self, cp, ns: str, target: str, port: int):
        self.proc = subprocess.Popen(
            [
                str(cp.bin / "kubectl"),
                "--kubeconfig",
                str(cp.kubeconfig()),
                "-n",
                ns,
                "port-forward",
                "--address",
                "127.0.0.1",
                target,
                f":{port}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        line = self.proc.stdout.readline()
        m = re.search(r"127\.0\.0\.1:(\d+)", line)
        if not m:
            self.close()
            raise RuntimeError(f"port-forward did not start: {line}")
        self.port = int(m.group(1))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def stream_chat(port: int, max_tokens: int, timeout: float = 600) -> dict:
    """One streamed chat completion; returns the chunks' text pieces, finish reason and whether [DONE]
    came."""
    body = json.dumps(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hello there"}],
            "stream": True,
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
    ).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    out: dict = {"pieces": [], "finish": None, "done": False, "first_at": None}
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                out["done"] = True
                break
            chunk = json.loads(data)
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    out["pieces"].append(piece)
                    out["first_at"] = out["first_at"] or time.monotonic()
                if choice.get("finish_reason"):
                    out["finish"] = choice["finish_reason"]
    return out


def one_stream(cp, ns: str) -> dict:
    """A 16-token streamed chat completion through the router's Service, retried until one is answered."""
    pf = PortForward(cp, ns, f"svc/{SERVICE}-router", names.HTTP_PORT)
    try:
        return wait_for(lambda: stream_chat(pf.port, 16), 120, "a streamed answer", interval=2)
    finally:
        pf.close()


def test_pods_ready_through_their_real_probes(real_cluster, tiny):
    """Every pod is Ready because the kubelet ran the rendered probes against the running processes (gRPC
    health on the workers' health port, HTTP /readyz on the router), and nothing restarted."""
    cp = real_cluster.cp
    items = pods(cp, tiny)
    by_pool = {}
    for p in items:
        by_pool.setdefault(p["metadata"]["labels"][names.LABEL_POOL], []).append(p)
    assert {k: len(v) for k, v in by_pool.items()} == {"router": 1, "prefill": 1, "decode": 2}
    for p in items:
        c = p["spec"]["containers"][0]
        pool = p["metadata"]["labels"][names.LABEL_POOL]
        if pool == "router":
            assert c["readinessProbe"]["httpGet"]["path"] == names.READINESS_PATH
        else:
            assert c["readinessProbe"]["grpc"]["port"] == names.HEALTH_PORT
            assert c["startupProbe"]["grpc"]["port"] == names.HEALTH_PORT
        assert is_ready(p)
        (status,) = p["status"]["containerStatuses"]
        assert status["ready"] and status["started"] and "running" in status["state"]
        assert status["restartCount"] == 0, f"{p['metadata']['name']} restarted: {status}"
        assert status["imageID"], "the runtime reports the image it ran"


def test_restricted_security_context_applied_by_the_runtime(real_cluster, tiny):
    """In every running container: uid/gid 1000, a read-only root, no capabilities, no privilege escalation,
    and the RuntimeDefault seccomp filter, as runc applied them (the namespace enforces `restricted`)."""
    cp = real_cluster.cp
    for p in pods(cp, tiny):
        name = p["metadata"]["name"]
        assert exec_in(cp, tiny, name, "id", "-u").stdout.strip() == "1000"
        assert exec_in(cp, tiny, name, "id", "-g").stdout.strip() == "1000"
        status = exec_in(cp, tiny, name, "cat", "/proc/1/status").stdout
        fields = dict(re.findall(r"^(\w+):\s+(.*)$", status, re.M))
        assert fields["CapEff"] == fields["CapPrm"] == fields["CapBnd"] == "0000000000000000", name
        assert fields["NoNewPrivs"] == "1", name
        assert fields["Seccomp"] == "2", name  # filter mode
        root = exec_in(cp, tiny, name, "sh", "-c", "touch /probe-root 2>&1", check=False)
        assert root.returncode != 0 and "Read-only file system" in root.stdout, name
        scratch = exec_in(cp, tiny, name, "sh", "-c", "touch /tmp/probe && echo ok", check=False)
        assert scratch.stdout.strip() == "ok", f"{name}: /tmp (the scratch volume) is not writable"


def test_model_volume_mounted_read_only(real_cluster, tiny):
    """The model's PVC (a hostPath PV holding `tandem model create-tiny`) is mounted read-only at /models in
    the workers and the router, with the weights and config the processes loaded."""
    cp = real_cluster.cp
    for p in pods(cp, tiny):
        name = p["metadata"]["name"]
        listing = exec_in(cp, tiny, name, "ls", "/models/tiny").stdout.split()
        assert "config.json" in listing and any(f.endswith(".safetensors") for f in listing), (name, listing)
        ro = exec_in(cp, tiny, name, "sh", "-c", "touch /models/tiny/x 2>&1", check=False)
        assert ro.returncode != 0 and "Read-only file system" in ro.stdout, (
            f"{name}: the model volume is writable"
        )


def test_downward_api_files_present(real_cluster, tiny):
    """Every downward-API file the operator renders into a container is there, non-empty, and names the pod
    where it is `metadata.name`."""
    cp = real_cluster.cp
    checked = 0
    for p in pods(cp, tiny):
        name = p["metadata"]["name"]
        vols = {v["name"]: v for v in p["spec"]["volumes"]}
        for m in p["spec"]["containers"][0].get("volumeMounts", []):
            v = vols[m["name"]]
            items = list((v.get("downwardAPI") or {}).get("items", []))
            for src in (v.get("projected") or {}).get("sources", []):
                items += (src.get("downwardAPI") or {}).get("items", [])
            for it in items:
                text = exec_in(cp, tiny, name, "cat", f"{m['mountPath']}/{it['path']}").stdout.strip()
                assert text, f"{name}: {m['mountPath']}/{it['path']} is empty"
                if it.get("fieldRef", {}).get("fieldPath") == "metadata.name":
                    assert text == name
                checked += 1
        if p["metadata"]["labels"][names.LABEL_POOL] in ("prefill", "decode"):
            labels = exec_in(cp, tiny, name, "cat", f"{PODINFO_MOUNT}/labels").stdout
            assert f'{names.LABEL_ROLE}="{p["metadata"]["labels"][names.LABEL_ROLE]}"' in labels, (
                name,
                labels,
            )
    assert checked >= 3, "every worker pod of a roleFlip service mounts its labels file"


def _took_role(cp, ns: str, pod: str, role: str) -> str | None:
    """The worker's log line saying it now serves `role`, if it has one."""
    text = cp.kubectl("logs", "-n", ns, pod, check=False).stdout
    return next((line for line in text.splitlines() if f"now a {role} worker" in line), None)


def test_a_relabelled_pod_takes_its_new_role_and_the_router_uses_it(real_cluster, tiny):
    """A flip as the operator makes it on a running pod: the decode pod's role label becomes prefill, the
    kubelet rewrites the downward-API file, the worker drains and switches, the prefill Service finds it,
    and requests are still answered; relabelled back, it serves decode again. Prints how long each took
    (the kubelet's default sync period bounds it)."""
    cp = real_cluster.cp
    pod = pods(cp, tiny, "decode")[0]["metadata"]["name"]
    for role in ("prefill", "decode"):
        start = time.monotonic()
        cp.kubectl("label", "pod", "-n", tiny, pod, "--overwrite", f"{names.LABEL_ROLE}={role}")
        line = wait_for(lambda r=role: _took_role(cp, tiny, pod, r), 180, f"{pod} serving {role}", interval=1)
        print(f"\n{pod}: label -> {role}: serving it after {time.monotonic() - start:.1f} s ({line.strip()})")
        if role == "prefill":
            endpoints = cp.kubectl("get", "endpointslices", "-n", tiny, "-o", "json").stdout
            assert pod in endpoints
        out = one_stream(cp, tiny)
        assert out["done"] and out["finish"] == "length", out


def test_streamed_request_through_the_router_service(real_cluster, tiny):
    """A streamed chat completion through `kubectl port-forward svc/<router>`: router -> prefill -> decode
    over the pod network (workers found through DNS), answered to the end."""
    out = one_stream(real_cluster.cp, tiny)
    assert out["done"] and out["finish"] == "length", out
    assert len(out["pieces"]) >= 8, out


def decode_held(cp, pod: dict) -> float:
    """The decode worker's running sequences, from its /metrics on the pod network."""
    ip = pod["status"]["podIP"]
    text = urllib.request.urlopen(f"http://{ip}:{names.METRICS_PORT}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(names.DECODE_RUNNING_SEQUENCES):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_scale_down_victim_drains_its_open_stream(real_cluster, tiny):
    """Scale decode 2 -> 1 while a stream runs on the replica that goes: its preStop `tandem drain` holds the
    pod until the stream is finished, and the client gets every token and [DONE]."""
    cp = real_cluster.cp
    pf = PortForward(cp, tiny, f"svc/{SERVICE}-router", names.HTTP_PORT)
    result: dict = {}

    def run():
        try:
            result.update(stream_chat(pf.port, STREAM_TOKENS))
        except Exception as e:  # reported below
            result["error"] = repr(e)

    t = threading.Thread(target=run, daemon=True)
    try:
        t.start()
        decodes = pods(cp, tiny, "decode")
        holder = wait_for(
            lambda: next((p for p in decodes if decode_held(cp, p) >= 1), None),
            120,
            "the decode worker that holds the stream",
            interval=0.5,
        )
        victim = holder["metadata"]["name"]
        assert not result.get("done"), "the stream ended before the scale-down; make it longer"
        logs = subprocess.Popen(
            [str(cp.bin / "kubectl"), "--kubeconfig", str(cp.kubeconfig()), "-n", tiny, "logs", "-f", victim],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # the ReplicaSet removes the pod with the lowest deletion cost: make it the one holding the stream
        for p in decodes:
            cost = "-1000" if p["metadata"]["name"] == victim else "1000"
            cp.kubectl(
                "annotate",
                "pod",
                "-n",
                tiny,
                p["metadata"]["name"],
                "--overwrite",
                f"controller.kubernetes.io/pod-deletion-cost={cost}",
            )
        cp.kubectl("scale", "-n", tiny, f"tpool/{SERVICE}-decode", "--replicas=1")
        wait_for(lambda: pods_named(cp, tiny, victim, "deletionTimestamp"), 120, "the victim terminating")
        t.join(timeout=600)
        log_text = logs.communicate(timeout=120)[0]
    finally:
        pf.close()
    assert "error" not in result, result
    assert result["done"] and result["finish"] == "length", result
    assert len(result["pieces"]) >= STREAM_TOKENS * 3 // 4, len(result["pieces"])
    m = re.search(r"draining \(([^)]*)\): (\d+) held", log_text)
    assert m and int(m.group(2)) >= 1, f"the victim did not drain with the stream held:\n{log_text[-3000:]}"
    assert "drained; exiting" in log_text, log_text[-3000:]
    wait_for(lambda: not pods_named(cp, tiny, victim), 120, "the victim gone")
    assert len([p for p in pods(cp, tiny, "decode") if is_ready(p)]) == 1


def pods_named(cp, ns: str, name: str, field: str | None = None):
    out = cp.kubectl("get", "pod", "-n", ns, name, "-o", "json", check=False)
    if out.returncode != 0:
        return None
    meta = json.loads(out.stdout)["metadata"]
    return meta.get(field) if field else meta

"""Every rendered pod meets the restricted Pod Security Standard, and each pool's NetworkPolicy selects
exactly that pool's pods and lets in only its real senders, on the ports its containers open."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem import names
from tandem.operator.manifests import pod_security, render
from tandem.spec import InferenceServiceSpec, load_file

ROOT = Path(__file__).resolve().parents[2]
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _specs() -> dict[str, InferenceServiceSpec]:
    gpu = load_file(ROOT / "examples/inferenceservice-gpu.yaml").spec
    base = gpu.model_dump(by_alias=True)
    hf = {**base, "model": {**base["model"], "source": {"huggingFace": {"repoId": "org/m"}}}}
    image = {
        **base,
        "model": {**base["model"], "source": {"image": "models/m:1"}},
        "security": {"tls": {"secretName": "t"}, "apiKeys": {"secretName": "k"}},
    }
    colo = {**{k: v for k, v in base.items() if k not in ("prefill", "kvTransfer")}, "mode": "colocated"}
    return {
        "gpu": gpu,
        **{
            k: InferenceServiceSpec.model_validate(v)
            for k, v in {"hf": hf, "image": image, "colocated": colo}.items()
        },
    }


def _pods(spec: InferenceServiceSpec) -> dict[str, dict]:
    out = render.children(spec, "llama", "ml", "u", {"prefill": 1, "decode": 1, "colocated": 1})
    return {
        m["metadata"]["labels"][names.LABEL_POOL]: m["spec"]["template"]
        for m in out
        if m["kind"] == "Deployment"
    }


def restricted_violations(pod: dict) -> list[str]:
    """The restricted profile's rules (Kubernetes Pod Security Standards, v1.25+) a pod template breaks."""
    spec, problems = pod["spec"], []
    psc = spec.get("securityContext", {})
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {v['name']}: {kinds}")
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{c['name']}: allowPrivilegeEscalation")
        if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
            problems.append(f"{c['name']}: runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            problems.append(f"{c['name']}: runAsUser 0")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []) or sc["capabilities"].get("add"):
            problems.append(f"{c['name']}: capabilities")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{c['name']}: seccomp {seccomp}")
        if sc.get("privileged") or any(p.get("hostPort") for p in c.get("ports", [])):
            problems.append(f"{c['name']}: privileged or hostPort")
        if not sc.get("readOnlyRootFilesystem"):
            problems.append(f"{c['name']}: writable root filesystem")
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        problems.append("host namespaces")
    return problems


@pytest.mark.parametrize("which", ["gpu", "hf", "image", "colocated"])
def test_every_pod_is_restricted(which):
    pods = _pods(_specs()[which])
    assert pods
    for pool, pod in pods.items():
        assert restricted_violations(pod) == [], pool
        mounts = {m["mountPath"]: m["name"] for c in pod["spec"]["containers"] for m in c["volumeMounts"]}
        vols = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert "emptyDir" in vols[mounts[pod_security.SCRATCH]]
        if pool != names.POOL_ROUTER:  # the KV staging rings live in /dev/shm, in memory, sized
            shm = vols[mounts["/dev/shm"]]["emptyDir"]
            assert shm["medium"] == "Memory" and shm["sizeLimit"] == pod_security.SHM_SIZE[pool]


def _shm_of(pod: dict) -> str:
    mounts = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    return {v["name"]: v for v in pod["spec"]["volumes"]}[mounts["/dev/shm"]]["emptyDir"]["sizeLimit"]


def test_a_prefill_pod_that_may_flip_has_room_for_decodes_staging_rings():
    """With roleFlip a prefill worker builds decode's staging rings too, in /dev/shm: a prefill-sized one
    killed the worker with SIGBUS on a real node."""
    base = _specs()["gpu"].model_dump(by_alias=True)
    flipping = _pods(InferenceServiceSpec.model_validate({**base, "roleFlip": True}))
    fixed = _pods(_specs()["gpu"])
    decode_size = pod_security.SHM_SIZE[names.POOL_DECODE]
    assert _shm_of(flipping["prefill"]) == _shm_of(flipping["decode"]) == decode_size
    assert _shm_of(fixed["prefill"]) == pod_security.SHM_SIZE[names.POOL_PREFILL] != decode_size


def test_restricted_checker_catches_a_violation():
    pod = _pods(_specs()["gpu"])["decode"]
    pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    pod["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    assert len(restricted_violations(pod)) == 2


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


@pytest.mark.parametrize("which", ["gpu", "colocated"])
def test_network_policies_select_their_pool_and_admit_only_real_senders(which):
    spec = _specs()[which]
    out = render.children(spec, "llama", "ml", "u", {"prefill": 1, "decode": 1, "colocated": 1})
    pods = _pods(spec)
    policies = {m["metadata"]["labels"][names.LABEL_POOL]: m for m in out if m["kind"] == "NetworkPolicy"}
    assert set(policies) == set(pods)
    expected_senders = {
        "router": None,
        "prefill": {"router"},
        "decode": {"router", "prefill"},
        "colocated": {"router"},
    }
    for pool, policy in policies.items():
        ps = policy["spec"]
        assert ps["policyTypes"] == ["Ingress"]
        # it selects this pool's pods and no other pool's (nor another service's)
        assert [p for p, pod in pods.items() if _matches(ps["podSelector"], pod["metadata"]["labels"])] == [
            pool
        ]
        other = dict(pods[pool]["metadata"]["labels"], **{names.LABEL_SERVICE: "other"})
        assert not _matches(ps["podSelector"], other)
        open_ports = {p["containerPort"] for c in pods[pool]["spec"]["containers"] for p in c["ports"]}
        allowed = {port["port"] for rule in ps["ingress"] for port in rule["ports"]}
        assert allowed <= open_ports
        (main,) = [r for r in ps["ingress"] if r["ports"][0]["port"] != names.METRICS_PORT]
        if expected_senders[pool] is None:
            assert "from" not in main and main["ports"] == [{"protocol": "TCP", "port": names.HTTP_PORT}]
        else:
            senders = {
                p
                for p, pod in pods.items()
                for peer in main["from"]
                if _matches(peer["podSelector"], pod["metadata"]["labels"])
            }
            assert senders == expected_senders[pool]
            assert main["ports"] == [{"protocol": "TCP", "port": names.GRPC_PORT}]
        (metrics,) = [r for r in ps["ingress"] if r["ports"][0]["port"] == names.METRICS_PORT]
        assert metrics["from"] == spec.security.network_policy.metrics_from


def test_network_policies_can_be_turned_off():
    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"source": {"path": "/m"}, "servedName": "m"},
            "security": {"networkPolicy": {"enabled": False}},
        }
    )
    assert not [
        m
        for m in render.children(spec, "s", "ns", "u", {"prefill": 1, "decode": 1})
        if m["kind"] == "NetworkPolicy"
    ]


def test_the_operator_is_admitted_to_every_metrics_port_and_nothing_else(monkeypatch):
    """The autoscaler scrapes the pods' /metrics itself when no Prometheus is configured: the chart names the
    operator's pods (TANDEM_OPERATOR_PEER) and every pool's policy admits them to the metrics port only."""
    import json
    import subprocess

    from tandem.operator.manifests import security_defaults
    from tests.unit.test_chart_values import CHART, _helm

    helm = _helm()
    if helm is None:
        pytest.skip("no helm binary: TANDEM_BUILD_HELM=1 bash tests/k8s/build-controlplane.sh")
    out = subprocess.run(
        [helm, "template", "rel", str(CHART), "-n", "ops"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    import yaml

    dep = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    monkeypatch.setenv(security_defaults.OPERATOR_PEER_ENV, env[security_defaults.OPERATOR_PEER_ENV])
    security_defaults.operator_peer.cache_clear()
    peer = security_defaults.operator_peer()
    security_defaults.operator_peer.cache_clear()
    assert peer is not None
    assert _matches(peer["podSelector"], dep["spec"]["template"]["metadata"]["labels"])  # the operator's pods
    assert peer["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "ops"}
    }  # in its namespace only
    spec = _specs()["gpu"]
    out_children = render.children(spec, "llama", "ml", "u", {"prefill": 1, "decode": 1}, operator_peer=peer)
    for policy in (m for m in out_children if m["kind"] == "NetworkPolicy"):
        for rule in policy["spec"]["ingress"]:
            admitted = json.dumps(peer) in [json.dumps(p) for p in rule.get("from", [])]
            assert admitted == (rule["ports"][0]["port"] == names.METRICS_PORT), policy["metadata"]["name"]

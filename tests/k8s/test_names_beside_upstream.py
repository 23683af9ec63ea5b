"""tandem's kinds beside the Gateway API, its Inference Extension and KServe on one API server: every kubectl
command the READMEs, the docs pages, the chart's NOTES and the examples give reaches tandem's objects, not
theirs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.k8s import upstream_crds
from tests.k8s.conftest import get_json, wait_for

ROOT = Path(__file__).resolve().parents[2]
GROUP = "serving.tandem.dev"
# docs/inferenceservice.md is generated from the spec types' descriptions, whose prose names kubectl verbs in
# passing
DOCS = sorted(
    {
        str(p.relative_to(ROOT))
        for p in [
            *ROOT.rglob("README.md"),
            *(ROOT / "docs").glob("*.md"),
            *(ROOT / "examples").glob("*.yaml"),
        ]
        if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    }
    - {"docs/inferenceservice.md"}
    | {"charts/tandem/templates/NOTES.txt"}
)
COMMAND = re.compile(
    r"kubectl ((?:get|scale|explain|describe|delete|edit|patch|wait|annotate|label|apply) [^`#;|\n]*)"
)
pytestmark = pytest.mark.slow  # installs three projects' CRDs (megabytes) on the API server
SERVICE = "llama-8b"  # examples/inferenceservice-gpu.yaml; `<name>` and `<svc>` in the docs stand for it


def doc_commands() -> list[tuple[str, str]]:
    """(file, the kubectl arguments) for each kubectl command in the docs, placeholders filled in."""
    found = []
    for doc in DOCS:
        for m in COMMAND.finditer((ROOT / doc).read_text()):
            args = re.sub(r"<(name|svc|service)>", SERVICE, m.group(1)).replace("...", "").strip()
            found.append((doc, args))
    return found


@pytest.fixture(scope="module")
def upstream(control_plane):
    """Every upstream CRD installed next to tandem's; removed again after the module."""
    try:
        docs = [d for m in upstream_crds.MODULES for d in upstream_crds.crds(m)]
    except RuntimeError as e:
        pytest.skip(f"upstream CRDs unavailable: {e}")
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    control_plane.kubectl(
        "apply", "--server-side", "-f", "-", input=yaml.dump_all(docs, Dumper=dumper), timeout=180
    )
    names = [f"crd/{d['metadata']['name']}" for d in docs]
    control_plane.wait_established([d["metadata"]["name"] for d in docs], 180)
    yield {d["metadata"]["name"] for d in docs}
    control_plane.kubectl("delete", *names, "--wait=false", check=False, timeout=120)


def group_of(cp, resource: str) -> str:
    """The API group kubectl resolves a resource name (as typed) to ("" for the core group). `kubectl explain`
    reads the OpenAPI document, which the API server publishes a while after a CRD is Established (longer on a
    busy host): it is asked again until it answers."""
    out = wait_for(lambda: cp.kubectl("explain", resource).stdout, 120, f"kubectl explain {resource}")
    found = re.search(r"^GROUP:\s*(\S+)", out, re.M)
    return found.group(1) if found else ""


def test_the_upstream_kinds_are_there_and_take_the_bare_names(control_plane, upstream):
    """The control: with the upstream CRDs installed, the bare names are theirs (why tandem uses
    tsvc/tpool)."""
    assert {
        "inferencepools.inference.networking.k8s.io",
        "inferencepools.inference.networking.x-k8s.io",
        "httproutes.gateway.networking.k8s.io",
        "inferenceservices.serving.kserve.io",
    } <= upstream
    assert group_of(control_plane, "inferencepool") == "inference.networking.k8s.io"
    assert group_of(control_plane, "inferenceservice") == "serving.kserve.io"
    for short in ("tsvc", "tpool", "inferenceservices.serving.tandem.dev", "tandempools.serving.tandem.dev"):
        assert group_of(control_plane, short) == GROUP, short


def test_no_upstream_crd_claims_a_tandem_name(upstream):
    """No plural, singular or short name of theirs is one of tandem's (InferenceService's kind name aside)."""
    ours = [
        yaml.safe_load(p.read_text())["spec"]["names"]
        for p in sorted((ROOT / "charts/tandem/files/crds").glob("*.yaml"))
    ]
    tandem = {n for names in ours for n in (names["plural"], names["singular"], *names.get("shortNames", []))}
    for m in upstream_crds.MODULES:
        for crd in upstream_crds.crds(m):
            names = crd["spec"]["names"]
            theirs = {names["plural"], names.get("singular", ""), *names.get("shortNames", [])}
            assert not theirs & (tandem - {"inferenceservices", "inferenceservice"}), crd["metadata"]["name"]


def test_every_documented_kubectl_command_reaches_tandem(control_plane, upstream, operator, namespace):
    commands = doc_commands()
    assert {
        ("README.md", "get tsvc,tpool"),
        ("README.md", f"scale tpool/{SERVICE}-decode --replicas=3"),
        ("operator/README.md", "explain tsvc.spec"),
        ("docs/kubernetes.md", "get tsvc,tpool"),
        ("docs/kubernetes.md", f"scale tpool/{SERVICE}-decode --replicas=3"),
    } <= set(commands), commands
    ns = ["-n", namespace]
    for doc, args in (
        c for c in commands if c[1].startswith("apply -f")
    ):  # first create what the others address
        out = control_plane.kubectl(*shlex.split(args), *ns, "-o", "name").stdout.split()
        ours = [line for line in out if GROUP in line]
        for f in re.findall(r"-f (\S+)", args):
            kinds = [
                d["kind"]
                for d in yaml.safe_load_all((ROOT / f).read_text())
                if d and GROUP in d["apiVersion"]
            ]
            assert len([o for o in ours if o.split(".")[0] in {k.lower() for k in kinds}]) >= len(kinds), (
                doc,
                out,
            )
    wait_for(
        lambda: control_plane.kubectl("get", "tpool", f"{SERVICE}-decode", *ns, check=False).returncode == 0,
        60,
        "the operator to create the decode TandemPool",
    )
    theirs = {crd["spec"]["group"] for m in upstream_crds.MODULES for crd in upstream_crds.crds(m)}
    checked = 0
    for doc, args in commands:
        verb, *rest = shlex.split(args)
        if verb == "apply":
            continue
        resources = next((a for a in rest if not a.startswith("-")), None)
        if resources is None:  # prose naming the verb only ("`kubectl scale` to 20")
            continue
        groups = {group_of(control_plane, r.split("/")[0]) for r in resources.split(",")}
        # a built-in kind (a Secret, a CRD) is fine; a name that lands on another project's kind is the bug
        assert not groups & theirs, f"{doc}: kubectl {args} reaches {groups & theirs}, not {GROUP}"
        if groups != {GROUP}:
            continue
        if verb == "get":
            out = control_plane.kubectl(*shlex.split(args), *ns, "-o", "name").stdout.split()
            assert out and all(f".{GROUP}/" in line for line in out), (doc, out)
        elif verb == "scale":
            out = control_plane.kubectl(*shlex.split(args), *ns).stdout
            assert f"tandempool.{GROUP}/" in out and "scaled" in out, (doc, out)
        checked += 1
    assert checked >= 5


def test_gateway_objects_are_accepted_and_reference_what_exists(control_plane, upstream, operator, namespace):
    """spec.gateway on the real API server with the upstream CRDs: the operator (with the chart's RBAC)
    renders an InferencePool and an HTTPRoute the upstream schemas accept; the route's parent is the Gateway,
    its backend the pool, the pool selects the router pods (not the workers) on the port they serve and names
    the picker Service; dropping spec.gateway removes both."""
    cp, ns, name = control_plane, ["-n", namespace], "gw-llama"
    gateway_objects = [
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": f"{namespace}-gc"},
            "spec": {"controllerName": "example.com/gateway-controller"},
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "inference-gw", "namespace": namespace},
            "spec": {
                "gatewayClassName": f"{namespace}-gc",
                "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "llama-epp", "namespace": namespace},  # the picker
            "spec": {"selector": {"app": "llama-epp"}, "ports": [{"name": "grpc-ext-proc", "port": 9002}]},
        },
    ]
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(gateway_objects))
    cp.kubectl("apply", *ns, "-f", str(ROOT / "examples/models-pvc.yaml"))  # the example's weights
    obj = yaml.safe_load((ROOT / "examples/inferenceservice-gpu.yaml").read_text())
    obj["metadata"]["name"] = name
    obj["spec"]["gateway"] = {
        "parentRefs": [{"name": "inference-gw", "sectionName": "http"}],
        "endpointPickerRef": {"name": "llama-epp"},
    }
    cp.kubectl("apply", *ns, "-f", "-", input=yaml.safe_dump(obj))
    route = wait_for(
        lambda: get_json(cp, "httproutes.gateway.networking.k8s.io", f"{name}-router", namespace=namespace),
        90,
        "the operator to render the HTTPRoute",
    )
    pool = get_json(cp, "inferencepools.inference.networking.k8s.io", f"{name}-router", namespace=namespace)
    assert pool is not None and pool["apiVersion"] == "inference.networking.k8s.io/v1"
    (parent,) = route["spec"]["parentRefs"]
    assert get_json(cp, "gateways.gateway.networking.k8s.io", parent["name"], namespace=namespace) is not None
    listeners = [
        li["name"] for li in get_json(cp, "gateway", parent["name"], namespace=namespace)["spec"]["listeners"]
    ]
    assert parent["sectionName"] in listeners
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        pool["metadata"]["name"],
    )
    assert rule["matches"][0]["headers"][0]["value"] == obj["spec"]["model"]["servedName"]
    selector = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
    pods = wait_for(
        lambda: get_json(cp, "pods", "-l", selector, namespace=namespace)["items"], 90, "router pods"
    )
    assert {p["metadata"]["labels"]["serving.tandem.dev/pool"] for p in pods} == {"router"}
    ports = {p["containerPort"] for p in pods[0]["spec"]["containers"][0]["ports"]}
    assert {t["number"] for t in pool["spec"]["targetPorts"]} <= ports
    picker = pool["spec"]["endpointPickerRef"]
    epp = get_json(cp, "service", picker["name"], namespace=namespace)
    assert picker["port"]["number"] in {p["port"] for p in epp["spec"]["ports"]}
    for child in (route, pool):
        assert child["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"

    del obj["spec"]["gateway"]
    cp.kubectl("apply", *ns, "-f", "-", input=yaml.safe_dump(obj))
    wait_for(
        lambda: (
            get_json(cp, "httproutes.gateway.networking.k8s.io", f"{name}-router", namespace=namespace)
            is None
            and get_json(
                cp, "inferencepools.inference.networking.k8s.io", f"{name}-router", namespace=namespace
            )
            is None
        ),
        90,
        "the Gateway objects removed with spec.gateway",
    )
    cp.kubectl("delete", "gatewayclass", f"{namespace}-gc", "--wait=false", check=False)

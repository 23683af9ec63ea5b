"""spec.gateway renders an upstream InferencePool over exactly the router pods and an HTTPRoute for the
served model that points at it; without it, no Gateway objects."""

from __future__ import annotations

from tandem.operator.manifests import render
from tandem.spec import InferenceServiceSpec

BASE = {"model": {"source": {"path": "/m"}, "servedName": "llama-3"}}
GATEWAY = {
    "parentRefs": [{"name": "inference-gw", "namespace": "gw", "sectionName": "http"}, {"name": "edge"}],
    "endpointPickerRef": {"name": "llama-epp"},
}


def _children(**extra):
    spec = InferenceServiceSpec.model_validate({**BASE, **extra})
    return {
        (m["kind"], m["metadata"]["name"]): m
        for m in render.children(spec, "llama", "ml", "uid-1", {"prefill": 1, "decode": 1})
    }


def test_no_gateway_no_gateway_objects():
    assert not {k for k, _ in _children()} & {"InferencePool", "HTTPRoute"}


def test_pool_selects_the_router_pods_on_their_port_and_the_route_sends_the_model_there():
    out = _children(gateway=GATEWAY)
    pool, route = out[("InferencePool", "llama-router")], out[("HTTPRoute", "llama-router")]
    router = out[("Deployment", "llama-router")]["spec"]["template"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    labels = router["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for pool_name in ("prefill", "decode"):  # and no worker pod
        worker = out[("Deployment", f"llama-{pool_name}")]["spec"]["template"]["metadata"]["labels"]
        assert not pool["spec"]["selector"]["matchLabels"].items() <= worker.items()
    ports = [p["containerPort"] for c in router["spec"]["containers"] for p in c.get("ports", [])]
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [ports[0]]
    assert pool["spec"]["endpointPickerRef"] == {
        "kind": "Service",
        "name": "llama-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    assert route["spec"]["parentRefs"] == [
        {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": "inference-gw",
            "namespace": "gw",
            "sectionName": "http",
        },
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge"},
    ]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llama-router"}
    ]
    assert rule["matches"][0]["headers"] == [
        {"type": "Exact", "name": "X-Gateway-Model-Name", "value": "llama-3"}
    ]
    for obj in (pool, route):  # garbage-collected with the InferenceService
        assert obj["metadata"]["ownerReferences"][0]["name"] == "llama"

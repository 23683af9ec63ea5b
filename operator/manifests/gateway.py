"""Pure rendering of the Gateway API objects for an InferenceService with `spec.gateway`: an upstream
InferencePool (Gateway API Inference Extension) over the router pods and an HTTPRoute that sends the served
model's requests to it, so one Gateway fronts many InferenceServices."""

from __future__ import annotations

from typing import Any

from tandem import names
from tandem.spec_gateway import GatewaySpec

POOL_API_VERSION = "inference.networking.k8s.io/v1"
ROUTE_API_VERSION = "gateway.networking.k8s.io/v1"
# The header the Inference Extension's body-based routing sets from the request body's `model`.
MODEL_HEADER = "X-Gateway-Model-Name"

Manifest = dict[str, Any]


def inference_pool(
    gateway: GatewaySpec, metadata: dict[str, Any], router_selector: dict[str, str]
) -> Manifest:
    """The InferencePool selecting the router pods on their HTTP port, with the picker the user deployed."""
    picker = gateway.endpoint_picker_ref
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": dict(router_selector)},
            "targetPorts": [{"number": names.HTTP_PORT}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": picker.name,
                "port": {"number": picker.port},
                "failureMode": picker.failure_mode.value,
            },
        },
    }


def http_route(gateway: GatewaySpec, metadata: dict[str, Any], served_name: str) -> Manifest:
    """The HTTPRoute from the Gateways to the InferencePool of the same name, for this served model only."""
    parents = []
    for ref in gateway.parent_refs:
        parent = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": ref.name}
        if ref.namespace:
            parent["namespace"] = ref.namespace
        if ref.section_name:
            parent["sectionName"] = ref.section_name
        parents.append(parent)
    return {
        "apiVersion": ROUTE_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": metadata,
        "spec": {
            "parentRefs": parents,
            "rules": [
                {
                    "matches": [
                        {
                            "path": {"type": "PathPrefix", "value": "/"},
                            "headers": [{"type": "Exact", "name": MODEL_HEADER, "value": served_name}],
                        }
                    ],
                    "backendRefs": [
                        {
                            "group": "inference.networking.k8s.io",
                            "kind": "InferencePool",
                            "name": metadata["name"],
                        }
                    ],
                }
            ],
        },
    }

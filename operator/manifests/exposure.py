"""Whether a service's router is reachable from outside the cluster while it takes no API keys: an
OpenAI endpoint behind a LoadBalancer, a NodePort, external IPs or a Gateway then serves anyone who finds
it, so the operator says so with a Warning Event (once per change, not at every resync)."""

from __future__ import annotations

from typing import Any

from tandem.spec import InferenceServiceSpec

Body = dict[str, Any]
REASON = "ExposedWithoutAPIKeys"
EXTERNAL_TYPES = ("LoadBalancer", "NodePort")


def selects(service: Body, pod_labels: dict[str, str]) -> bool:
    """A Service's selector matches pods with these labels (a Service without a selector matches none)."""
    selector = (service.get("spec") or {}).get("selector") or {}
    return bool(selector) and all(pod_labels.get(k) == v for k, v in selector.items())


def external_services(services: list[Body], router_labels: dict[str, str]) -> tuple[str, ...]:
    """Each Service that selects the router pods and is reachable from outside: `Service x (LoadBalancer)`."""
    out = []
    for svc in services:
        spec = svc.get("spec") or {}
        how = (
            spec.get("type")
            if spec.get("type") in EXTERNAL_TYPES
            else ("externalIPs" if spec.get("externalIPs") else None)
        )
        if how and selects(svc, router_labels):
            out.append(f"Service {svc['metadata']['name']} ({how})")
    return tuple(sorted(out))


def warning(spec: InferenceServiceSpec, namespace: str, services: tuple[str, ...]) -> str | None:
    """The Warning Event's message, or None when the router takes API keys or nothing exposes it."""
    if spec.security.api_keys is not None:
        return None
    ways = list(services)
    for ref in spec.gateway.parent_refs if spec.gateway else []:
        ways.append(f"Gateway {ref.namespace or namespace}/{ref.name} (spec.gateway)")
    if not ways:
        return None
    return (
        f"the router is reachable from outside the cluster through {', '.join(ways)} and takes no API keys: "
        "anyone who reaches it may use the model; set spec.security.apiKeys (a Secret of bearer keys)"
    )


class ExposureWatch:
    """Per InferenceService (namespace, name, uid): the external Services last listed, and the last warning
    given, so the Event is sent when the exposure starts or changes."""

    def __init__(self) -> None:
        self.services: dict[tuple[str, str, str], tuple[str, ...]] = {}
        self.warned: dict[tuple[str, str, str], str] = {}

    def forget(self, namespace: str, name: str) -> None:
        """The InferenceService is gone (or going): nothing more to remember of it, whatever its uid."""
        for seen in (self.services, self.warned):
            for key in [k for k in seen if k[:2] == (namespace, name)]:
                del seen[key]

    def needs_listing(self, key: tuple[str, str, str], fresh: bool) -> bool:
        return fresh or key not in self.services

    def to_send(
        self, key: tuple[str, str, str], services: tuple[str, ...] | None, message: str | None
    ) -> str | None:
        """Record this look; the message to send now, or None when it was already sent (or there is none)."""
        if services is not None:
            self.services[key] = services
        if message is None:
            self.warned.pop(key, None)
            return None
        if self.warned.get(key) == message:
            return None
        self.warned[key] = message
        return message

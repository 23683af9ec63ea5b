"""Each pool's NetworkPolicy (`security.networkPolicy`): which pods and ports may reach it, nothing else."""

from __future__ import annotations

from typing import Any

from tandem import names
from tandem.operator.manifests.manifest import Manifest, child_name, object_metadata, selector
from tandem.spec import InferenceServiceSpec


def network_policy(
    spec: InferenceServiceSpec,
    service: str,
    namespace: str,
    uid: str,
    pool: str,
    operator_peer: dict[str, Any] | None = None,
) -> Manifest:
    """What may reach a pool's pods: clients the router's HTTP port, the router (and, for decode, the
    prefill pool; with spec.roleFlip, both worker pools for either) the workers' gRPC port, `metricsFrom`
    and the operator (`operator_peer`, its direct scrape) the metrics port. Nothing else. A NetworkPolicy
    sees addresses and labels only (L3/L4): which role a caller of a worker's gRPC port has is decided by
    its certificate (worker/serve/authz.py)."""

    def port(n: int) -> list[dict[str, Any]]:
        return [{"protocol": "TCP", "port": n}]

    def pods(p: str) -> dict[str, Any]:
        return {"podSelector": {"matchLabels": selector(service, p)}}

    ingress: list[dict[str, Any]]
    if pool == names.POOL_ROUTER:
        ingress = [{"ports": port(names.HTTP_PORT)}]  # the API, from anywhere (API keys guard it)
    else:
        senders = [names.POOL_ROUTER] + ([names.POOL_PREFILL] if pool == names.POOL_DECODE else [])
        if spec.role_flip:  # either pool's pods may prefill now, and either pool's take KV as decode workers
            senders = [names.POOL_ROUTER, names.POOL_PREFILL, names.POOL_DECODE]
        ingress = [{"from": [pods(p) for p in senders], "ports": port(names.GRPC_PORT)}]
    metrics_from = spec.security.network_policy.metrics_from
    scrapers = [dict(peer) for peer in metrics_from] + ([dict(operator_peer)] if operator_peer else [])
    ingress.append({"from": scrapers, "ports": port(names.METRICS_PORT)})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_metadata(child_name(service, pool), namespace, service, uid, pool),
        "spec": {
            "podSelector": {"matchLabels": selector(service, pool)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }

"""Where to scrape a service's /metrics on Kubernetes: its running pods, found through the API server."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tandem import names


def pod_is_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def metrics_targets(pods: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """Pool (or "router") -> /metrics URLs of the pods that run and have an IP, by the role each serves now
    (its role label, else its pool's: a flipped or colocated pod counts where it serves); the router and the
    workers serve metrics on names.METRICS_PORT."""
    out: dict[str, list[str]] = {}
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        labels = meta.get("labels") or {}
        pool = labels.get(names.LABEL_ROLE) or labels.get(names.LABEL_POOL)
        ip = status.get("podIP")
        if not pool or not ip or status.get("phase") != "Running" or meta.get("deletionTimestamp"):
            continue
        host = f"[{ip}]" if ":" in ip else ip
        out.setdefault(pool, []).append(f"http://{host}:{names.METRICS_PORT}/metrics")
    for urls in out.values():
        urls.sort()
    return out


def service_selector(service: str) -> str:
    return f"{names.LABEL_SERVICE}={service}"

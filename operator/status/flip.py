"""A worker pod's current role on Kubernetes: its `serving.tandem.dev/role` label, which a flip moves
(operator/autoscale/backends/kube/flip.py).

The two Deployments stay the pools' homes: they select on `serving.tandem.dev/pool`, which never changes,
so a flip leaves their ReplicaSets and pod ownership alone. The worker follows its label (a downward-API
file, tandem.worker.serve.role_label); the worker Services select on the role, so the router's DNS names
follow too, and pool counts read the label.
"""

from __future__ import annotations

from typing import Any

from tandem import names
from tandem.operator.manifests.pod_role import FLIPPABLE

Body = dict[str, Any]


def current_role(pod: Body) -> str | None:
    labels = pod["metadata"].get("labels") or {}
    return labels.get(names.LABEL_ROLE) or labels.get(names.LABEL_POOL)


def is_ready(pod: Body) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def role_counts(pods: list[Body]) -> dict[str, int]:
    """Ready worker pods by current role (pure): what each pool serves with now."""
    out = {r: 0 for r in FLIPPABLE}
    for p in pods:
        role = current_role(p)
        if role in out and is_ready(p) and not p["metadata"].get("deletionTimestamp"):
            out[role] += 1
    return out

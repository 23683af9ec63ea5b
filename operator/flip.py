"""Flip warm worker pods between the prefill and decode pools on Kubernetes: the pod's
`serving.tandem.dev/role` label is its current role, and moving it is the flip.

The two Deployments stay the pools' homes: they select on `serving.tandem.dev/pool`, which never changes,
so a flip leaves their ReplicaSets and pod ownership alone. The worker follows its label (a downward-API
file, tandem.worker.serve.role_label); `set_role`, when given, tells it at once (SetRole) before the label
moves, so the flip does not wait for the kubelet to rewrite the file. The worker Services select on the
role, so the router's DNS names follow too, and pool counts read the label.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tandem import names
from tandem.operator.kube import Kube
from tandem.operator.pod_role import FLIPPABLE

log = logging.getLogger(__name__)
Body = dict[str, Any]


def current_role(pod: Body) -> str | None:
    labels = pod["metadata"].get("labels") or {}
    return labels.get(names.LABEL_ROLE) or labels.get(names.LABEL_POOL)


def is_ready(pod: Body) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def flip_candidates(pods: list[Body], from_role: str, to_role: str, count: int) -> list[Body]:
    """Which pods to flip (pure): those of `from_role` not being deleted, pods going back to their own pool
    first (undoing an earlier flip), then Ready ones, then by name."""
    live = [p for p in pods if current_role(p) == from_role and not p["metadata"].get("deletionTimestamp")]

    def key(p: Body) -> tuple[bool, bool, str]:
        home = (p["metadata"].get("labels") or {}).get(names.LABEL_POOL)
        return (home != to_role, not is_ready(p), p["metadata"]["name"])

    return sorted(live, key=key)[: max(0, count)]


def role_counts(pods: list[Body]) -> dict[str, int]:
    """Ready worker pods by current role (pure): what each pool serves with now."""
    out = {r: 0 for r in FLIPPABLE}
    for p in pods:
        role = current_role(p)
        if role in out and is_ready(p) and not p["metadata"].get("deletionTimestamp"):
            out[role] += 1
    return out


def flip_pods(
    kube: Kube, isvc: Body, from_role: str, to_role: str, count: int, reason: str = "",
    set_role: Callable[[Body, str], None] | None = None,
) -> list[str]:
    """Move `count` pods of `isvc` from `from_role` to `to_role`; the names of those flipped. A pod whose
    SetRole fails (`set_role` raises) keeps its role and label."""
    if {from_role, to_role} != set(FLIPPABLE):
        raise ValueError(f"a flip is between prefill and decode, not {from_role} -> {to_role}")
    meta = isvc["metadata"]
    namespace, service = meta["namespace"], meta["name"]
    pods = kube.list("Pod", namespace, f"{names.LABEL_SERVICE}={service},{names.LABEL_ROLE}={from_role}")
    flipped: list[str] = []
    for pod in flip_candidates(pods, from_role, to_role, count):
        name = pod["metadata"]["name"]
        if set_role is not None:
            try:
                set_role(pod, to_role)
            except Exception as e:  # noqa: BLE001 - one pod's refusal must not stop the others
                log.warning("SetRole %s on %s/%s failed: %s", to_role, namespace, name, e)
                continue
        kube.merge_patch("Pod", namespace, name, {"metadata": {"labels": {names.LABEL_ROLE: to_role}}})
        flipped.append(name)
    if flipped:
        why = f": {reason}" if reason else ""
        kube.event(isvc, f"FlippedTo{to_role.title()}", f"{', '.join(flipped)} {from_role} -> {to_role}{why}")
    return flipped

"""A prefill or decode pod's current role (spec.roleFlip): the `serving.tandem.dev/role` label its template
starts at its pool's and the operator moves to flip it, the downward-API file through which the worker
follows that label, and the Service selector that finds pods by it. Deployments keep selecting on the
pool, which never changes, so a flip leaves their ReplicaSets alone."""

from __future__ import annotations

from typing import Any

from tandem import names
from tandem.spec import InferenceServiceSpec

FLIPPABLE = (names.POOL_PREFILL, names.POOL_DECODE)
PODINFO_MOUNT = "/etc/tandem/podinfo"


def role_labels(pool: str) -> dict[str, str]:
    """The starting role a worker pod's template carries (none for the router or a colocated pod)."""
    return {names.LABEL_ROLE: pool} if pool in FLIPPABLE else {}


def follows_label(spec: InferenceServiceSpec, pool: str) -> bool:
    return spec.role_flip and pool in FLIPPABLE


def role_file_args(spec: InferenceServiceSpec, pool: str) -> list[str]:
    """`tandem worker` flags that make it take the role its label names, whenever it changes."""
    return ["--role-file", f"{PODINFO_MOUNT}/labels"] if follows_label(spec, pool) else []


def role_label_volumes(
    spec: InferenceServiceSpec, pool: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's labels as a downward-API file the worker reads (the kubelet rewrites it when they change)."""
    if not follows_label(spec, pool):
        return [], []
    mount = {"name": "podinfo", "mountPath": PODINFO_MOUNT, "readOnly": True}
    volume = {
        "name": "podinfo",
        "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
    }
    return [mount], [volume]


def role_selector(service: str, role: str) -> dict[str, str]:
    """Every pod of `service` whose current role is `role`, whichever Deployment it belongs to."""
    return {names.LABEL_SERVICE: service, names.LABEL_ROLE: role}

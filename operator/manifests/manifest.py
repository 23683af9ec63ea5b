"""The parts every child manifest shares: its name, labels, selector, owner reference and content hash, so
the renderers and the reconciler name and find children the same way."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tandem import names
from tandem.spec import API_GROUP, API_VERSION, KIND

Manifest = dict[str, Any]

POOL_API_VERSION = f"{API_GROUP}/{API_VERSION}"
POOL_KIND = "TandemPool"
MANAGED_BY = "tandem-operator"
HASH_ANNOTATION = f"{API_GROUP}/rendered-hash"


def child_name(service: str, pool: str) -> str:
    return f"{service}-{pool}"


def labels(service: str, pool: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "tandem",
        "app.kubernetes.io/instance": service,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        names.LABEL_SERVICE: service,
    }
    if pool:
        out[names.LABEL_POOL] = pool
        out[names.LABEL_COMPONENT] = pool
    return out


def selector(service: str, pool: str) -> dict[str, str]:
    return {names.LABEL_SERVICE: service, names.LABEL_POOL: pool}


def selector_string(service: str, pool: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(service, pool).items())


def owner_reference(service: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": KIND,
        "name": service,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_metadata(
    name: str, namespace: str, service: str, uid: str, pool: str | None = None
) -> dict[str, Any]:
    """A child's metadata: its name, the service's (and pool's) labels, owned by the InferenceService."""
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels(service, pool),
        "ownerReferences": [owner_reference(service, uid)],
    }


def content_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def with_hash(manifest: Manifest) -> Manifest:
    """The manifest with a hash of itself in an annotation, so a changed render is seen without a deep
    diff."""
    digest = content_hash(manifest)
    meta = dict(manifest["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), HASH_ANNOTATION: digest}
    return {**manifest, "metadata": meta}

"""How a pod gets its role's mutual-TLS files: the per-service Secret the operator issues, a Secret per pool
the user brings, or a folder the image carries; each pod mounts only its own role's key."""

from __future__ import annotations

from typing import Any

from tandem import names
from tandem.operator.manifests.manifest import Manifest, object_metadata
from tandem.spec import InferenceServiceSpec

TLS_MOUNT = "/etc/tandem/tls"  # tls.crt, tls.key, ca.crt of the pod's role
TLS_ROLES = (names.POOL_PREFILL, names.POOL_DECODE, names.POOL_COLOCATED, names.POOL_ROUTER)


def tls_secret_name(service: str) -> str:
    """The Secret the operator issues a service's CA and per-role certificates into."""
    return f"{service}-tls"


def tls_secret(service: str, namespace: str, uid: str, data: dict[str, str]) -> Manifest:
    """The Secret of a service's certificates (certs.secret_data), owned by the InferenceService."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": object_metadata(tls_secret_name(service), namespace, service, uid),
        "stringData": data,
    }


def tls_dir(spec: InferenceServiceSpec, pool: str) -> str | None:
    """Where a pool's pods find their role's mutual-TLS files: the mounted Secret, else a per-role folder the
    image carries; None with `security.tls.mode: off`."""
    tls = spec.security.tls
    if not tls.enabled:
        return None
    return f"{tls.dir}/{pool}" if tls.dir else TLS_MOUNT


def tls_volumes(
    spec: InferenceServiceSpec, service: str, pool: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The role's certificate only: the pool's own Secret `<secretName>-<pool>`, or its keys of the
    operator's per-service Secret (a prefill pod never holds the router's key)."""
    tls = spec.security.tls
    if not tls.enabled or tls.dir:
        return [], []
    mount = {"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True}
    if tls.secret_name:
        source: dict[str, Any] = {"secretName": f"{tls.secret_name}-{pool}"}
    else:
        source = {
            "secretName": tls_secret_name(service),
            "items": [
                {"key": f"{pool}.crt", "path": "tls.crt"},
                {"key": f"{pool}.key", "path": "tls.key"},
                {"key": "ca.crt", "path": "ca.crt"},
            ],
        }
    return [mount], [{"name": "tls", "secret": {**source, "defaultMode": 0o440}}]

"""The restricted Pod Security Standard for every rendered pod: non-root, no privilege escalation, no
capabilities, a read-only root filesystem with scratch and shared-memory volumes for what must be written."""

from __future__ import annotations

from typing import Any

from tandem import names

RUN_AS = 1000  # uid and gid of every tandem container; the image must not need root
SCRATCH = "/tmp"  # the only writable path besides /dev/shm and the volumes: HOME and caches go here
SCRATCH_SIZE = "1Gi"
# A decode worker lends 4 staging rings of 64 MiB (serve/main.py); torch and the KV transport share /dev/shm.
SHM_SIZE = {names.POOL_DECODE: "320Mi", names.POOL_COLOCATED: "64Mi", names.POOL_PREFILL: "64Mi"}
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS,
    "runAsGroup": RUN_AS,
    "fsGroup": RUN_AS,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def restricted(container: dict[str, Any], shm: bool) -> dict[str, Any]:
    """A container that passes the restricted Pod Security Standard on a read-only root filesystem."""
    mounts = [*container.get("volumeMounts", []), {"name": "scratch", "mountPath": SCRATCH}]
    if shm:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return {**container, "volumeMounts": mounts, "securityContext": dict(CONTAINER_SECURITY)}


def shm_size(pool: str, flips: bool = False) -> str | None:
    """The /dev/shm a pool's pods get (None: none); a worker that may flip to decode lends decode's staging
    rings once it does (a prefill pod with decode's rings in a prefill-sized /dev/shm dies of SIGBUS)."""
    if pool not in SHM_SIZE:
        return None
    return SHM_SIZE[names.POOL_DECODE] if flips else SHM_SIZE[pool]


def scratch_volumes(shm: str | None) -> list[dict[str, Any]]:
    """The writable scratch volume, and a memory-backed /dev/shm of size `shm` when given."""
    out: list[dict[str, Any]] = [{"name": "scratch", "emptyDir": {"sizeLimit": SCRATCH_SIZE}}]
    if shm:
        out.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}})
    return out

"""How a reconcile reads the cluster: through the watch cache, shared list reads, the preflight's facts."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from tandem.operator.runtime.cache import ObjectCache
from tandem.operator.runtime.kube import ApiError, Body, Kube
from tandem.operator.status.preflight import Facts, NodeGpus, claims_needed, node_gpus
from tandem.spec import InferenceServiceSpec

log = logging.getLogger("tandem.operator")


class Reader:
    """Reads through the watch cache when there is one (GET only on a miss); writes refresh it."""

    def __init__(self, kube: Kube, cache: ObjectCache | None, fresh: bool):
        self.kube, self.cache, self.fresh = kube, cache, fresh
        self.first_time = False  # set for a never-reconciled object: a cache miss then means "absent"

    def get(self, kind: str, namespace: str, name: str) -> Body | None:
        if self.cache is not None and not self.fresh:
            hit = self.cache.get(kind, namespace, name)
            if hit is not None:
                return hit
            if self.first_time:
                return None
        body = self.kube.get(kind, namespace, name)
        if body is not None:
            self.remember(body)
        return body

    def remember(self, body: Body) -> Body:
        if self.cache is not None and body.get("kind"):
            self.cache.put(body)
        return body


class Listing:
    """A list read shared by every reconcile for `ttl` seconds: the cluster's Nodes (the preflight of every
    object not yet Ready) or a namespace's Services (the exposure check of every new object), which a burst
    of new objects would otherwise list once each."""

    def __init__(self, read: Callable[[], list[Body]], ttl: float):
        self.read, self.ttl = read, ttl
        self._items: list[Body] = []
        self._at = -math.inf
        self._lock = threading.Lock()

    def __call__(self) -> list[Body]:
        with self._lock:
            if time.monotonic() - self._at >= self.ttl:
                self._items, self._at = self.read(), time.monotonic()
            return self._items


def read_facts(
    kube: Kube, namespace: str, spec: InferenceServiceSpec, nodes: Callable[[], list[Body]]
) -> Facts:
    """The I/O edge of the preflight check; what the API refuses (RBAC, a Role without nodes) stays
    unknown."""
    claims: dict[str, str | None] = {}
    for claim in claims_needed(spec):
        try:
            body = kube.get("PersistentVolumeClaim", namespace, claim)
        except ApiError as e:
            log.debug("%s: cannot read PersistentVolumeClaim %s: %s", namespace, claim, e)
            continue
        claims[claim] = None if body is None else str((body.get("status") or {}).get("phase") or "Pending")
    try:
        gpus: tuple[NodeGpus, ...] | None = tuple(node_gpus(n) for n in nodes())
    except ApiError as e:
        log.debug("cannot list nodes (the GPU check is skipped): %s", e)
        gpus = None
    return Facts(claims=claims, nodes=gpus)

"""Latest known body of each InferenceService and owned child, fed by the operator's watch events.

Reconciles read here first and fall back to a GET only on a miss, so a reconcile with nothing to do
costs no API round trips. Entries never go backwards: a stale event cannot replace a newer write.
"""

from __future__ import annotations

import threading
from typing import Any

Body = dict[str, Any]
Key = tuple[str, str, str]  # (kind, namespace, name)


def _version(body: Body) -> int:
    try:
        return int(body["metadata"].get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def slim(body: Body) -> Body:
    """The body without managedFields (large, and never compared)."""
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    return {**body, "metadata": meta}


class ObjectCache:
    def __init__(self) -> None:
        self._items: dict[Key, Body] = {}
        self._tombstones: dict[Key, int] = {}  # resourceVersion at deletion: older events must not revive
        self._lock = threading.Lock()

    def put(self, body: Body, kind: str | None = None) -> None:
        meta = body.get("metadata") or {}
        key = (kind or body["kind"], meta.get("namespace", ""), meta["name"])
        new = slim(body)
        version = _version(new)
        with self._lock:
            old = self._items.get(key)
            if version <= self._tombstones.get(key, -1):
                return
            if old is None or version >= _version(old):
                self._items[key] = new
                self._tombstones.pop(key, None)

    def forget(self, body: Body, kind: str | None = None) -> None:
        """A DELETED event: drop the entry unless something newer replaced it."""
        meta = body.get("metadata") or {}
        key = (kind or body["kind"], meta.get("namespace", ""), meta["name"])
        version = _version(body)
        with self._lock:
            old = self._items.get(key)
            if old is None or _version(old) <= version:
                self._items.pop(key, None)
                self._tombstones[key] = version

    def get(self, kind: str, namespace: str, name: str) -> Body | None:
        with self._lock:
            return self._items.get((kind, namespace, name))

    def objects(self, kind: str) -> list[Body]:
        """Every cached body of one kind (a snapshot)."""
        with self._lock:
            return [body for (k, _, _), body in self._items.items() if k == kind]

    def __len__(self) -> int:
        return len(self._items)

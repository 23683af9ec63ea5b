"""The operator's only door to the Kubernetes API: get, server-side apply, create, status patches, events.

Synchronous: the reconciler runs it in worker threads.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import kopf
import urllib3

from tandem.operator.runtime.credentials import login

FIELD_MANAGER = "tandem-operator"

# kind -> (API path prefix, plural)
_KINDS = {
    "Deployment": ("/apis/apps/v1", "deployments"),
    "Service": ("/api/v1", "services"),
    "Secret": ("/api/v1", "secrets"),
    "Pod": ("/api/v1", "pods"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "InferenceService": ("/apis/serving.tandem.dev/v1alpha1", "inferenceservices"),
    "TandemPool": ("/apis/serving.tandem.dev/v1alpha1", "tandempools"),
    "Event": ("/api/v1", "events"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    # spec.gateway: the Gateway API Inference Extension's pool and the Gateway API's route
    "InferencePool": ("/apis/inference.networking.k8s.io/v1", "inferencepools"),
    "HTTPRoute": ("/apis/gateway.networking.k8s.io/v1", "httproutes"),
}

Body = dict[str, Any]
Login = Callable[[], kopf.ConnectionInfo]
_TIMEOUT = urllib3.Timeout(connect=10, read=60)
POOL_SIZE = 32  # reconcile workers x side-by-side applies share one pool


class ApiError(Exception):
    """An error answer from the API server: `status` is the HTTP status; `reason` and `message` come from
    the Status object the server sends (for example `Invalid` and `Service "x" is invalid: ...`)."""

    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        doc = doc if isinstance(doc, dict) else {}
        self.reason = str(doc.get("reason") or "")
        self.message = str(doc.get("message") or body[:500])


def path(kind: str, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
    """The resource's URL path; without a namespace, across all namespaces."""
    prefix, plural = _KINDS[kind]
    out = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
    if name:
        out += f"/{name}"
    if sub:
        out += f"/{sub}"
    return out


class Kube:
    """A thin, thread-safe client over one urllib3 pool, logged in by `login` (runtime/credentials.py);
    it logs in again when the credentials expire or the API server answers 401."""

    def __init__(self, login: Login):
        self._login = login
        self._lock = threading.Lock()
        self._connect()

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str) -> Kube:
        """A client for a kubeconfig's current context (tools, tests; the operator passes its own login)."""
        return cls(lambda: login(kubeconfig))

    def _connect(self) -> None:
        info = self._login()
        pool: dict[str, Any] = {"maxsize": POOL_SIZE}
        if info.server.startswith("https:"):
            pool["ssl_context"] = info.as_ssl_context()
        self.server = info.server.rstrip("/")
        self.expires_at = None if info.expiration is None else _aware(info.expiration)
        self.headers = info.as_http_headers()
        self.pool = (
            urllib3.ProxyManager(info.proxy_url, **pool) if info.proxy_url else urllib3.PoolManager(**pool)
        )

    def close(self) -> None:
        """Close the pool's connections."""
        self.pool.clear()

    def _expired(self) -> bool:
        return self.expires_at is not None and dt.datetime.now(dt.UTC) >= self.expires_at

    def _relogin(self, refused: urllib3.PoolManager | None = None) -> None:
        """Log in again if the credentials expired or `refused` (the pool a 401 came through) is still in use:
        threads that met the same 401 log in once."""
        with self._lock:
            if self._expired() or (refused is not None and refused is self.pool):
                self._connect()

    def _call(
        self,
        method: str,
        url: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Body:
        """One HTTP round trip; a 401 logs in again and tries once more (a rotated token)."""
        if self._expired():
            self._relogin()
        full = url + (f"?{urlencode(query)}" if query else "")
        payload = json.dumps(body).encode() if body is not None else None
        for attempt in range(2):
            pool, headers = self.pool, {"Content-Type": content_type, "Accept": "application/json"}
            headers.update(self.headers)
            resp = pool.request(
                method,
                self.server + full,
                body=payload,
                headers=headers,
                timeout=_TIMEOUT,
                preload_content=True,
            )
            if resp.status == 401 and attempt == 0:
                self._relogin(refused=pool)
                continue
            if resp.status >= 400:
                raise ApiError(resp.status, resp.data.decode(errors="replace"))
            return json.loads(resp.data) if resp.data else {}
        raise AssertionError("unreachable")

    def get(self, kind: str, namespace: str, name: str) -> Body | None:
        try:
            return self._call("GET", path(kind, namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list_nodes(self) -> list[Body]:
        """Every Node (cluster-scoped); the preflight GPU check reads their allocatable resources."""
        return self._call("GET", "/api/v1/nodes").get("items") or []

    def list(self, kind: str, namespace: str | None, label_selector: str = "") -> list[Body]:
        """Objects of `kind` in `namespace` (None: every namespace) matching `label_selector`."""
        query = [("labelSelector", label_selector)] if label_selector else None
        return self._call("GET", path(kind, namespace), query=query).get("items") or []

    def apply(self, manifest: Body, dry_run: bool = False) -> Body:
        """Server-side apply under our field manager; force, since the operator owns what it renders.

        `dry_run` runs validation and admission (quota included) without persisting anything.
        """
        meta = manifest["metadata"]
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")] + (
            [("dryRun", "All")] if dry_run else []
        )
        return self._call(
            "PATCH",
            path(manifest["kind"], meta["namespace"], meta["name"]),
            manifest,
            query=query,
            content_type="application/apply-patch+yaml",
        )

    def create(self, manifest: Body) -> Body:
        meta = manifest["metadata"]
        return self._call(
            "POST",
            path(manifest["kind"], meta["namespace"]),
            manifest,
            query=[("fieldManager", FIELD_MANAGER)],
        )

    def replace(self, manifest: Body) -> Body:
        """PUT: the whole object, guarded by the resourceVersion it carries."""
        meta = manifest["metadata"]
        return self._call(
            "PUT",
            path(manifest["kind"], meta["namespace"], meta["name"]),
            manifest,
            query=[("fieldManager", FIELD_MANAGER)],
        )

    def merge_patch(self, kind: str, namespace: str, name: str, patch: Body, sub: str | None = None) -> Body:
        return self._call(
            "PATCH",
            path(kind, namespace, name, sub),
            patch,
            query=[("fieldManager", FIELD_MANAGER)],
            content_type="application/merge-patch+json",
        )

    def patch_status(self, kind: str, obj: Body, build: Callable[[Body], Body], attempts: int = 4) -> Body:
        """Merge-patch `obj`'s status with `build(the status it is built on)`, guarded by resourceVersion.
        The reconciler and the autoscaler each write the whole conditions list (a merge patch replaces
        lists), so a write built on a stale read would put back the other's old condition; on a conflict the
        object is read again and the status rebuilt on what is there now."""
        meta = obj["metadata"]
        for attempt in range(attempts):
            patch = {
                "metadata": {"resourceVersion": meta["resourceVersion"]},
                "status": build(obj.get("status") or {}),
            }
            try:
                return self.merge_patch(kind, meta["namespace"], meta["name"], patch, sub="status")
            except ApiError as e:
                if e.status != 409 or attempt == attempts - 1:
                    raise
            fresh = self.get(kind, meta["namespace"], meta["name"])
            if fresh is None:
                raise ApiError(404, f"{kind} {meta['namespace']}/{meta['name']} is gone")
            obj, meta = fresh, fresh["metadata"]
        raise AssertionError("unreachable")

    def delete(self, kind: str, namespace: str, name: str) -> None:
        try:
            self._call("DELETE", path(kind, namespace, name), {"propagationPolicy": "Background"})
        except ApiError as e:
            if e.status != 404:
                raise

    def event(self, owner: Body, reason: str, message: str, type_: str = "Normal") -> None:
        """A core/v1 Event about `owner`, so `kubectl describe` shows what the operator did."""
        meta = owner["metadata"]
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": FIELD_MANAGER},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.create(event)
        except ApiError:
            pass  # events are best effort


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)

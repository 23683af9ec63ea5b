"""The operator's only door to the Kubernetes API: get, server-side apply, create, status patches, events.

Synchronous: the reconciler runs it in worker threads.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import urllib3
from kubernetes import client, config

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
    # spec.gateway: the Gateway API Inference Extension's pool and the Gateway API's route
    "InferencePool": ("/apis/inference.networking.k8s.io/v1", "inferencepools"),
    "HTTPRoute": ("/apis/gateway.networking.k8s.io/v1", "httproutes"),
}

Body = dict[str, Any]
_TIMEOUT = urllib3.Timeout(connect=10, read=60)


def load_credentials(kubeconfig: str | None) -> None:
    """Where the API is and who we are: `kubeconfig` when named, else the pod's service account, else the
    user's default kubeconfig."""
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()


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


def path(kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
    prefix, plural = _KINDS[kind]
    out = f"{prefix}/namespaces/{namespace}/{plural}"
    if name:
        out += f"/{name}"
    if sub:
        out += f"/{sub}"
    return out


class Kube:
    """A thin, thread-safe wrapper around one ApiClient."""

    def __init__(self, api: client.ApiClient | None = None):
        self.api = api or client.ApiClient()

    def _call(
        self,
        method: str,
        url: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Body:
        """One HTTP round trip through the client's configured pool (TLS, client certs, token).

        The generated client's call_api changed signature between releases; its urllib3 pool did not.
        """
        cfg = self.api.configuration
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        auth = cfg.auth_settings().get("BearerToken")
        if auth and auth.get("value"):
            headers[auth["key"]] = auth["value"]
        full = cfg.host + url + (f"?{urlencode(query)}" if query else "")
        payload = json.dumps(body).encode() if body is not None else None
        resp = self.api.rest_client.pool_manager.request(
            method, full, body=payload, headers=headers, timeout=_TIMEOUT, preload_content=True
        )
        if resp.status >= 400:
            raise ApiError(resp.status, resp.data.decode(errors="replace"))
        return json.loads(resp.data) if resp.data else {}

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

    def list(self, kind: str, namespace: str, label_selector: str) -> list[Body]:
        out = self._call("GET", path(kind, namespace), query=[("labelSelector", label_selector)])
        return out.get("items") or []

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

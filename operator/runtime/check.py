"""`tandem operator --check`: what the chart's `helm test` hook runs. With the operator's own identity it
lists InferenceServices (the CRD is served and RBAC lets it read) and reads the leader Lease (an operator
replica holds it); exit 0 when both hold, 1 with the reason otherwise."""

from __future__ import annotations

import datetime as dt

from kubernetes import client
from kubernetes.client.rest import ApiException

from tandem.operator.runtime.leader import lease_free

GROUP, VERSION, PLURAL = "serving.tandem.dev", "v1alpha1", "inferenceservices"


def lease_problem(
    holder: str | None, renewed: dt.datetime | None, duration: int, now: dt.datetime
) -> str | None:
    """Pure: why the Lease shows no live leader, or None when one holds it."""
    if not holder:
        return "no operator holds the lease"
    if lease_free(holder, renewed, duration, me="", now=now):
        return f"the lease of {holder} expired (last renewed {renewed})"
    return None


def check(namespaces: list[str], lease_name: str, lease_namespace: str) -> tuple[bool, list[str]]:
    """Run the checks against the API server; (all passed, one line per check)."""
    lines, ok = [], True
    api = client.CustomObjectsApi()
    scopes: list[str | None] = list(namespaces) or [None]
    for ns in scopes:
        where = f"namespace {ns}" if ns else "all namespaces"
        try:
            if ns:
                items = api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
            else:
                items = api.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
            lines.append(f"ok: {len(items)} InferenceService(s) in {where}")
        except ApiException as e:
            ok = False
            lines.append(f"fail: cannot list InferenceServices in {where}: {e.status} {e.reason}")
    try:
        lease = client.CoordinationV1Api().read_namespaced_lease(lease_name, lease_namespace)
        spec = lease.spec
        problem = lease_problem(
            spec.holder_identity if spec else None,
            spec.renew_time if spec else None,
            (spec.lease_duration_seconds if spec else None) or 15,
            dt.datetime.now(dt.UTC),
        )
    except ApiException as e:
        problem = f"cannot read lease {lease_namespace}/{lease_name}: {e.status} {e.reason}"
    if problem:
        ok = False
        lines.append(f"fail: {problem}")
    else:
        lines.append(f"ok: {spec.holder_identity} leads {lease_namespace}/{lease_name}")
    return ok, lines

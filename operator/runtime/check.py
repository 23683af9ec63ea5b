"""`tandem operator --check`: what the chart's `helm test` hook runs. With the operator's own identity it
lists InferenceServices (the CRD is served and RBAC lets it read) and reads the leader Lease (an operator
replica holds it); exit 0 when both hold, 1 with the reason otherwise."""

from __future__ import annotations

import datetime as dt

from tandem.operator.runtime.kube import ApiError, Kube
from tandem.operator.runtime.leader import lease_free, parse_time


def lease_problem(
    holder: str | None, renewed: dt.datetime | None, duration: int, now: dt.datetime
) -> str | None:
    """Pure: why the Lease shows no live leader, or None when one holds it."""
    if not holder:
        return "no operator holds the lease"
    if lease_free(holder, renewed, duration, me="", now=now):
        return f"the lease of {holder} expired (last renewed {renewed})"
    return None


def check(kube: Kube, namespaces: list[str], lease_name: str, lease_namespace: str) -> tuple[bool, list[str]]:
    """Run the checks against the API server; (all passed, one line per check)."""
    lines, ok = [], True
    scopes: list[str | None] = list(namespaces) or [None]
    for ns in scopes:
        where = f"namespace {ns}" if ns else "all namespaces"
        try:
            items = kube.list("InferenceService", ns)
            lines.append(f"ok: {len(items)} InferenceService(s) in {where}")
        except ApiError as e:
            ok = False
            lines.append(f"fail: cannot list InferenceServices in {where}: {e.status} {e.reason}")
    spec: dict = {}
    try:
        lease = kube.get("Lease", lease_namespace, lease_name)
        spec = (lease or {}).get("spec") or {}
        problem = (
            f"no lease {lease_namespace}/{lease_name}"
            if lease is None
            else lease_problem(
                spec.get("holderIdentity"),
                parse_time(spec.get("renewTime")),
                spec.get("leaseDurationSeconds") or 15,
                dt.datetime.now(dt.UTC),
            )
        )
    except ApiError as e:
        problem = f"cannot read lease {lease_namespace}/{lease_name}: {e.status} {e.reason}"
    if problem:
        ok = False
        lines.append(f"fail: {problem}")
    else:
        lines.append(f"ok: {spec.get('holderIdentity')} leads {lease_namespace}/{lease_name}")
    return ok, lines

"""`tandem top --kube`: InferenceServices from the Kubernetes API: pools' desired and ready replicas from
their status, the SLO from their spec, the last scaling decision from their Events."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from typing import Any

from tandem.operator.top.view import PoolState, ServiceState

POOL_KINDS = ("InferenceService", "TandemPool")
SCALING_MESSAGE = re.compile(r"^\S+ \d+->\d+: ")


def service_state(obj: dict[str, Any]) -> ServiceState:
    """Pure: an InferenceService object as the view shows it."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    st = ServiceState(meta["name"], meta.get("namespace", "default"))
    for pool, p in (status.get("pools") or {}).items():
        st.pools[pool] = PoolState(p.get("desiredReplicas"), p.get("readyReplicas"))
    slo = spec.get("slo") or {}
    if "ttftMs" in slo:
        st.slo_ttft_s = slo["ttftMs"] / 1000
    if "tpotMs" in slo:
        st.slo_tpot_s = slo["tpotMs"] / 1000
    if "percentile" in slo:
        st.objective = slo["percentile"] / 100
    return st


def _when(e: dict[str, Any]) -> dt.datetime | None:
    """When an Event (as JSON) last happened."""
    for v in (
        e.get("lastTimestamp"),
        e.get("eventTime"),
        e.get("firstTimestamp"),
        (e.get("metadata") or {}).get("creationTimestamp"),
    ):
        if isinstance(v, str) and v:
            return dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    return None


def is_scaling(event: dict[str, Any]) -> bool:
    """An autoscaler decision: its message is the decision's reason ("decode 2->3: ..."), whatever its
    reason code (SLOBreach, Forecast, ScaleDown...); or a reason that says scaling."""
    return bool(SCALING_MESSAGE.match(str(event.get("message", "")))) or str(
        event.get("reason", "")
    ).startswith("Scal")


def last_scaling(events: Iterable[dict[str, Any]], service: str, now: dt.datetime) -> str | None:
    """Pure: the newest scaling Event of the service or one of its pools (named <service>-<pool>), as
    "<age>s ago <object>: <message>"."""
    mine: list[tuple[dt.datetime, dict[str, Any]]] = []
    for e in events:
        obj = e.get("involvedObject") or {}
        name, when = obj.get("name", ""), _when(e)
        if (
            obj.get("kind") in POOL_KINDS
            and (name == service or name.startswith(service + "-"))
            and is_scaling(e)
            and when is not None
        ):
            mine.append((when, e))
    if not mine:
        return None
    when, e = max(mine, key=lambda pair: pair[0])
    ago = int((now - when).total_seconds())
    return f"{ago}s ago {e['involvedObject']['name']}: {e.get('message') or e.get('reason')}"


class KubeSource:
    def __init__(self, kubeconfig: str | None = None, namespace: str | None = None):
        from tandem.operator.runtime.credentials import login
        from tandem.operator.runtime.kube import Kube

        self.kube, self.namespace = Kube(lambda: login(kubeconfig)), namespace

    def poll(self) -> list[ServiceState]:
        items = self.kube.list("InferenceService", self.namespace)
        now = dt.datetime.now(dt.UTC)
        events: dict[str, list[dict[str, Any]]] = {}
        out = []
        for obj in items:
            st = service_state(obj)
            ns = st.namespace or "default"
            if ns not in events:
                events[ns] = self.kube.list("Event", ns)
            st.last_scaling = last_scaling(events[ns], st.name, now)
            out.append(st)
        return out

    def close(self) -> None:
        self.kube.close()

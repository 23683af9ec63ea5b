"""Pure reading of a pod's start, phase by phase, from its conditions and container states: created ->
scheduled -> image pulled (its first container started) -> model fetched (the `fetch-model` init container,
a cache hit or a miss by its termination message) -> weights loaded, warmed up and Ready. Kept per pool in
the InferenceService's status (the last few starts, by pod) for the user and for the autoscaler, which
learns a hit's and a miss's cold start apart (operator/autoscale/core/cold_start.py)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

Body = dict[str, Any]
FETCH_CONTAINER = "fetch-model"  # render.model_init_containers
KEEP = 8  # starts kept per pool


def _time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def _span(a: dt.datetime | None, b: dt.datetime | None) -> float | None:
    return None if a is None or b is None else max(0.0, (b - a).total_seconds())


def _condition_time(pod: Body, ctype: str) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return c.get("lastTransitionTime")
    return None


def _started(cs: Body) -> str | None:
    state = cs.get("state") or {}
    return (
        (state.get("running") or {}).get("startedAt")
        or (state.get("terminated") or {}).get("startedAt")
        or ((cs.get("lastState") or {}).get("terminated") or {}).get("startedAt")
    )


def fetch_report(pod: Body) -> tuple[Body | None, Body | None]:
    """(the fetch-model init container's status, the outcome its termination message reports) or Nones."""
    for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if cs.get("name") == FETCH_CONTAINER:
            done = (cs.get("state") or {}).get("terminated") or (
                (cs.get("lastState") or {}).get("terminated") or {}
            )
            try:
                report = json.loads(done.get("message") or "")
            except ValueError:
                report = None
            return cs, report if isinstance(report, dict) else None
    return None, None


def pod_cold_start(pod: Body) -> Body | None:
    """The phases (seconds) of a Ready pod's start; None until it is Ready. `cache` is hit, miss or none
    (no download). `loadedSeconds` runs from the serving container's start to Ready: loading the weights,
    warming up and the first passing readiness probe."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    created, ready = _time(meta.get("creationTimestamp")), _time(_condition_time(pod, "Ready"))
    if created is None or ready is None:
        return None
    scheduled = _time(_condition_time(pod, "PodScheduled"))
    inits = status.get("initContainerStatuses") or []
    mains = status.get("containerStatuses") or []
    main_started = _time(_started(mains[0])) if mains else None
    first_started = _time(_started(inits[0])) if inits else main_started
    fetch, report = fetch_report(pod)
    fetch_done = ((fetch or {}).get("state") or {}).get("terminated") or {}
    fetched = (
        _span(_time(fetch_done.get("startedAt")), _time(fetch_done.get("finishedAt"))) if fetch else None
    )
    out: Body = {
        "pod": meta.get("name", "?"),
        "readyAt": _condition_time(pod, "Ready"),
        "cache": (report or {}).get("cache", "unknown") if fetch else "none",
        "scheduledSeconds": _span(created, scheduled),
        "pulledSeconds": _span(scheduled, first_started),
        "fetchedSeconds": fetched,
        "loadedSeconds": _span(main_started, ready),
        "totalSeconds": _span(created, ready),
    }
    return {k: v for k, v in out.items() if v is not None}


def merge(previous: list[Body], pods: list[Body], keep: int = KEEP) -> list[Body]:
    """The pool's last `keep` starts: those already kept and those of `pods` now Ready, one per pod, newest
    last."""
    by_pod = {s["pod"]: s for s in previous if isinstance(s, dict) and "pod" in s}
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        sample = pod_cold_start(pod)
        if sample is not None and sample["pod"] not in by_pod:
            by_pod[sample["pod"]] = sample
    return sorted(by_pod.values(), key=lambda s: s.get("readyAt") or "")[-keep:]


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else round((values[mid - 1] + values[mid]) / 2, 3)


def pool_summary(samples: list[Body]) -> Body:
    """What status shows of a pool's starts: the kept samples, the last one, and per kind of start (cache
    hit, miss, no download) the count and the median of each phase."""
    out: Body = {"samples": samples}
    if samples:
        out["last"] = samples[-1]
    kinds: dict[str, list[Body]] = {}
    for s in samples:
        kinds.setdefault(s.get("cache", "unknown"), []).append(s)
    out["medians"] = {
        kind: {
            "count": len(group),
            **{
                phase: _median([s[phase] for s in group if phase in s])
                for phase in PHASES
                if any(phase in s for s in group)
            },
        }
        for kind, group in sorted(kinds.items())
    }
    return out


PHASES = ("scheduledSeconds", "pulledSeconds", "fetchedSeconds", "loadedSeconds", "totalSeconds")

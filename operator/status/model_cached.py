"""Pure: the `ModelCached` condition of a Hugging Face model source, from the `fetch-model` init containers of
the service's pods: how many pods have the model (and whether they found it cached or downloaded it), how
many are fetching or waiting for another pod's download, and why a fetch failed, in its own words."""

from __future__ import annotations

import datetime as dt
from typing import Any

from tandem.operator.status.cold_start import fetch_report

Body = dict[str, Any]
STATES = ("cached", "fetching", "waiting", "failed")


def pod_fetch_state(pod: Body) -> tuple[str, Body]:
    """(cached | fetching | waiting | failed, details) of one pod's fetch-model init container; a fetch that
    failed and waits to be restarted is failed, one that runs again is fetching."""
    cs, report = fetch_report(pod)
    if cs is None:
        return "waiting", {}
    state, last = cs.get("state") or {}, (cs.get("lastState") or {}).get("terminated")
    done = state.get("terminated")
    if done is not None and done.get("exitCode") == 0:
        return "cached", report or {}
    if state.get("running"):
        return "fetching", {"since": state["running"].get("startedAt")}
    if done is not None or last:
        return "failed", {
            "error": (report or {}).get("error") or (done or last or {}).get("reason") or "failed"
        }
    return "waiting", {}


def pool_fetches(pods: list[Body]) -> Body:
    """Counts per state of a pool's live pods, cache hits and misses, bytes downloaded, the first error, and
    the model's max_position_embeddings as the fetches read it (the least, should pods disagree)."""
    out: Body = {s: 0 for s in STATES} | {"pods": 0, "hits": 0, "misses": 0, "bytes": 0}
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        state, details = pod_fetch_state(pod)
        out["pods"] += 1
        out[state] += 1
        if state == "cached":
            out["hits" if details.get("cache") == "hit" else "misses"] += 1
            out["bytes"] += int(details.get("bytes") or 0)
            if isinstance(n := details.get("max_position_embeddings"), int) and n > 0:
                out["maxPositionEmbeddings"] = min(n, out.get("maxPositionEmbeddings", n))
        if state == "failed" and "error" not in out:
            out["error"] = f"pod {pod['metadata'].get('name', '?')}: {details['error']}"
        if state == "fetching" and details.get("since") and "fetchingSince" not in out:
            out["fetchingSince"] = details["since"]
    return out


def condition(pools: dict[str, Body], now: str) -> tuple[bool, str, str]:
    """(status, reason, message) of ModelCached over every pool's pool_fetches."""
    total = {
        k: sum(int(p.get(k) or 0) for p in pools.values())
        for k in (*STATES, "pods", "hits", "misses", "bytes")
    }
    have = f"{total['cached']}/{total['pods']} pods have the model"
    kinds = f"{total['hits']} found it cached, {total['misses']} downloaded {total['bytes'] / 2**20:.1f} MiB"
    errors = [f"{pool}: {p['error']}" for pool, p in pools.items() if p.get("error")]
    if errors:
        return False, "FetchFailed", f"{have}; " + "; ".join(errors)
    if total["pods"] == 0:
        return False, "NoPods", "no pod has started to fetch the model"
    if total["cached"] == total["pods"]:
        return True, "Cached", f"{have} ({kinds})"
    since = [p["fetchingSince"] for p in pools.values() if p.get("fetchingSince")]
    running = ""
    if since:
        started = dt.datetime.fromisoformat(min(since).replace("Z", "+00:00"))
        elapsed = (dt.datetime.fromisoformat(now.replace("Z", "+00:00")) - started).total_seconds()
        running = f", the longest for {max(0, int(elapsed))} s"
    return (
        False,
        "Fetching",
        f"{have}; {total['fetching']} fetching{running}, {total['waiting']} not started ({kinds})",
    )


def model_positions(cache: dict[str, Body]) -> int | None:
    """The model's max_position_embeddings over the pools' fetches (status.modelCache); None while unread."""
    found = [int(p["maxPositionEmbeddings"]) for p in cache.values() if p.get("maxPositionEmbeddings")]
    return min(found) if found else None

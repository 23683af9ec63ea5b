"""Pure: what the reconciler adds to an InferenceService's status from the pods it read: each pool's cold
starts, phase by phase (cold_start.py), and for a Hugging Face source the `ModelCached` condition with each
pool's fetch progress (model_cached.py), with the model's max_position_embeddings its fetches read. Pools
whose pods were not read keep what the status said."""

from __future__ import annotations

from typing import Any

from tandem.operator.status import cold_start, model_cached

Body = dict[str, Any]
CONDITION = "ModelCached"


def with_pod_starts(
    status: Body, previous: Body, pods: dict[str, list[Body]], fetches: bool, generation: int, now: str
) -> Body:
    """`status` (service_status's) with `coldStart` and, when the pods fetch the model (`fetches`),
    `modelCache` and the ModelCached condition; `pods` are the pools' pods read this time."""
    starts = dict(previous.get("coldStart") or {})
    for pool, found in pods.items():
        kept = ((starts.get(pool) or {}).get("samples")) or []
        merged = cold_start.merge(kept, found)
        if merged:
            starts[pool] = cold_start.pool_summary(merged)
    out = {**status, "coldStart": starts} if starts else dict(status)
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != CONDITION]
    if not fetches:
        return {**out, "conditions": conditions}
    kept = previous.get("modelCache") or {}
    cache = {
        **kept,
        **{p: _keep_positions(model_cached.pool_fetches(f), kept.get(p)) for p, f in pods.items()},
    }
    cache = {p: v for p, v in cache.items() if p in (status.get("pools") or {})}
    if not cache:
        return out
    ok, reason, message = model_cached.condition(cache, now)
    old: Body = next((c for c in previous.get("conditions") or [] if c.get("type") == CONDITION), {})
    flag = "True" if ok else "False"
    cond = {
        "type": CONDITION,
        "status": flag,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": now if old.get("status") != flag else old.get("lastTransitionTime", now),
    }
    return {**out, "modelCache": cache, "conditions": [*conditions, cond]}


def _keep_positions(read: Body, kept: Body | None) -> Body:
    """A pool's fetches as read now, keeping the model's limit an earlier fetch reported until one reports
    again."""
    if "maxPositionEmbeddings" in read or not (kept or {}).get("maxPositionEmbeddings"):
        return read
    return {**read, "maxPositionEmbeddings": kept["maxPositionEmbeddings"]}  # type: ignore[index]

"""Who writes a pool's replica count: one owner at a time, decided here as a pure function.

The rule:
- The TandemPool object `<service>-<pool>` holds the desired worker count of that pool
  (`spec.replicas`, exposed through its /scale subresource). The pool's Deployment always follows it;
  only the operator writes the Deployment's replicas.
- The operator writes `TandemPool.spec.replicas` in exactly two cases: when it creates the pool
  (from `InferenceService.spec.<pool>.replicas`, the initial size), and while
  `spec.autoscaling.enabled` is true (the built-in autoscaler owns the count; the operator clamps it to
  [minReplicas, maxReplicas]).
- With the autoscaler off, `kubectl scale tpool/<service>-<pool>`, an HPA or KEDA own the count,
  and editing `spec.<pool>.replicas` on the InferenceService after creation changes nothing.
The colocated pool is sized by `spec.decode`. In `mode: auto` a pool's Deployment is the home of pods of any
role (a collapse leaves colocated pods in either and may empty the other), so the operator keeps its count
within 0 and the two pools' maxReplicas together; the autoscaler bounds each role's count.
"""

from __future__ import annotations

from typing import Any

from tandem.operator.manifests.render import pool_spec
from tandem.spec import InferenceServiceSpec, Mode


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def bounds(spec: InferenceServiceSpec, pool: str) -> tuple[int, int]:
    """The counts the operator keeps a pool's TandemPool within while the autoscaler owns it."""
    if spec.mode is Mode.auto:
        return 0, spec.prefill.max_replicas + spec.decode.max_replicas
    ps = pool_spec(spec, pool)
    return ps.min_replicas, ps.max_replicas


def clamp_message(spec: InferenceServiceSpec, pool: str, was: int, now: int) -> str:
    """Why the operator rewrote a pool's count that someone else set (the Event a user sees)."""
    low, high = bounds(spec, pool)
    within = (
        "pods of any role, from 0 to both pools' maxReplicas"
        if spec.mode is Mode.auto
        else f"minReplicas {low} and maxReplicas {high}"
    )
    return (
        f"{pool}: replicas {was} set to {now}: spec.autoscaling.enabled gives the count to the autoscaler, "
        f"within {within}"
    )


def desired_pool_replicas(
    spec: InferenceServiceSpec, pool: str, live_pool: dict[str, Any] | None
) -> tuple[int, bool]:
    """(replicas the pool should have, whether the operator must write them)."""
    ps = pool_spec(spec, pool)
    if live_pool is None:
        return ps.replicas, True
    current = (live_pool.get("spec") or {}).get("replicas")
    if current is None:
        return ps.replicas, True
    if spec.autoscaling.enabled:
        wanted = clamp(int(current), *bounds(spec, pool))
        return wanted, wanted != current
    return int(current), False

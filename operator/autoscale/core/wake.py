"""Wake a pool from zero (pure): a pool with no replica reports no load, so the router's held requests are
its demand. The first replica starts as soon as the router holds a request for the pool, before any other
rule (a pool at zero has no latency to size on). The way down to zero is the policy's idle rule: with
`minReplicas: 0` a pool without traffic for the stabilization window goes to its minimum, zero; a pool
the router holds requests for is never idle (its first replica may still be starting).
"""

from __future__ import annotations

from tandem.launch import worker_pools
from tandem.operator.autoscale.core.config import PoolLimits
from tandem.operator.autoscale.core.types import Decision, PoolObservation
from tandem.spec import InferenceServiceSpec

WAKE_FROM_ZERO = "WakeFromZero"  # the reason code of a decision that starts a pool's first replica


def holds_demand(obs: PoolObservation) -> bool:
    """The router holds requests for this pool: it is not idle, whatever its own arrivals say (a held
    request arrived once, maybe a window ago, and still waits)."""
    return (obs.held_requests or 0) > 0


def wake_from_zero(obs: PoolObservation, limits: PoolLimits) -> Decision | None:
    """Start the pool's first replica (or its minimum) when it has none, not even one starting, and the
    router holds requests for it; None otherwise."""
    r = obs.replicas
    held = obs.held_requests or 0
    if r.ready + r.starting > 0 or held <= 0 or limits.max_replicas < 1:
        return None
    desired = min(max(1, limits.min_replicas), limits.max_replicas)
    waited = f" for {obs.held_oldest_s:.0f} s" if obs.held_oldest_s else ""
    why = f"{held:.0f} requests held{waited} by the router with no {obs.pool} worker"
    return Decision(
        obs.pool, 0, desired, f"{obs.pool} 0->{desired}: {why}", WAKE_FROM_ZERO, {"held_requests": held}
    )


def wakes_from_zero(spec: InferenceServiceSpec) -> set[str]:
    """The pools the autoscaler wakes from zero (autoscaling on, minReplicas 0): at 0 replicas they rest,
    they are not broken."""
    if not spec.autoscaling.enabled:
        return set()
    return {
        pool
        for pool in worker_pools(spec)
        if (spec.prefill if pool == "prefill" else spec.decode).min_replicas == 0
    }

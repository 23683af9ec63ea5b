"""The policy's rules for a pool whose need is at or below its count: each returns a hold with its reason,
or None to let the next speak; `step_down` decides the step when none holds."""

from __future__ import annotations

import math

from tandem.operator.autoscale.core.pool_tick import Plan, Tick
from tandem.operator.autoscale.core.types import Decision


def steady(t: Tick, p: Plan) -> Decision | None:
    if p.target == t.current or t.current <= t.limits.min_replicas:
        return t.hold("Steady", p.text, **p.details)
    return None


def _last_change_in_flight(t: Tick, p: Plan) -> Decision | None:
    r = t.obs.replicas
    if not (t.arriving or r.draining):
        return None
    why = (
        f"{p.text}; waiting for the last change (starting {r.starting}, draining {r.draining}) "
        "before going down"
    )
    return t.hold("InFlight", why, **p.details)


def _low_for(t: Tick) -> float:
    """How long the need has stayed below the count (the tick's state holds since when)."""
    return t.now_s - t.ps.low_since_s if t.ps.low_since_s is not None else 0.0


def _stabilizing(t: Tick, p: Plan) -> Decision | None:
    waited, window = _low_for(t), t.cfg.stabilization_s
    if waited >= window:
        return None
    return t.hold(
        "Stabilizing", f"{p.text}; stabilizing {waited:.0f}/{window:.0f} s before going down", **p.details
    )


def _down_cooldown(t: Tick, p: Plan) -> Decision | None:
    since = t.now_s - t.ps.last_change_s
    if t.ps.last_direction < 0 and since < t.cfg.scale_down_cooldown_s:
        return t.hold("Cooldown", f"{p.text}; stepped down {since:.0f} s ago", **p.details)
    return None


def _above_margin(t: Tick, p: Plan) -> Decision | None:
    s, margin = p.sizing, t.cfg.margin
    if s.observed_ms <= margin * s.slo_ms:
        return None
    why = f"{s.label} {s.observed_ms:.0f} ms is above {margin:.0%} of the {s.slo_ms:.0f} ms SLO; {p.text}"
    return t.hold("NoMargin", why, **p.details)


def _break_even(t: Tick, p: Plan) -> Decision | None:
    """Of the past quiet spells that outlasted this one so far, the typical one ends too soon for a removed
    replica to stay away longer than the cold start it costs to bring it back."""
    waited, cold = _low_for(t), t.cfg.cold_start
    longer = sorted(s for s in t.ps.quiet_spells_s if s > waited)
    if not longer or longer[len(longer) // 2] - waited >= cold:
        return None
    left = longer[len(longer) // 2] - waited
    why = (
        f"{p.text}; quiet spells this long ended about {left:.0f} s later, within a {cold:.0f} s "
        "cold start: a replica removed now would be wanted back before it paid off"
    )
    return t.hold("BreakEven", why, **p.details)


def step_down(t: Tick, p: Plan) -> Decision:
    """Down by up to `down_step_fraction` of the pool, to the fewest replicas that keep the SLO with
    margin."""
    current, share, label = t.current, p.sizing.latency_share, p.sizing.label
    bound = max(
        p.target, t.limits.min_replicas, current - max(1, math.floor(current * t.cfg.down_step_fraction))
    )
    desired = next((n for n in range(bound, current) if share(n) <= t.cfg.margin * t.cfg.hysteresis), current)
    if desired == current:
        why = f"{current - 1} replicas would run at {share(current - 1):.0%} of the {label} SLO; {p.text}"
        return t.hold("NoMargin", why, **p.details)
    return t.move(
        desired,
        "ScaleDown",
        f"{p.text}; {desired} replicas keep {label} at {share(desired):.0%} of the SLO",
        p.details,
    )


DOWN_RULES = (_last_change_in_flight, _stabilizing, _down_cooldown, _above_margin, _break_even)

"""The SLO contract in InferenceService.status, from one autoscaler tick (pure): observed TTFT and TPOT at
the SLO percentile against their targets, attainment, replicas per pool, the last decision, and the
SLOMet condition."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tandem.operator.autoscale.core.loop import Tick
from tandem.operator.autoscale.core.shape import ShapeAction
from tandem.operator.autoscale.core.shape_tick import current_shape
from tandem.operator.autoscale.core.types import Decision, Pool
from tandem.spec_autoscaling import SloSpec

Body = dict[str, Any]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def observed_latencies(tick: Tick) -> tuple[float | None, float | None]:
    """(TTFT, TPOT) at the SLO percentile: TTFT from the prefill (or colocated) pool, TPOT from decode."""
    obs = tick.observations
    ttft_pool = obs.get(Pool.prefill) or obs.get(Pool.colocated)
    tpot_pool = obs.get(Pool.decode) or obs.get(Pool.colocated)
    return (ttft_pool.ttft_ms if ttft_pool else None, tpot_pool.tpot_ms if tpot_pool else None)


def slo_met(tick: Tick, slo: SloSpec) -> tuple[str, str, str]:
    """(status, CamelCase reason, message) of the SLOMet condition."""
    if tick.unavailable is not None:
        return "Unknown", "MetricsUnavailable", tick.unavailable
    ttft, tpot = observed_latencies(tick)
    if ttft is None and tpot is None:
        return "Unknown", "NoTraffic", "no request completed in the window"
    over = []
    if ttft is not None and ttft > slo.ttft_ms:
        over.append(("TTFTAboveTarget", f"TTFT p{slo.percentile} {ttft:.0f} ms > {slo.ttft_ms} ms"))
    if tpot is not None and tpot > slo.tpot_ms:
        over.append(("TPOTAboveTarget", f"TPOT p{slo.percentile} {tpot:.0f} ms > {slo.tpot_ms} ms"))
    if len(over) == 2:
        return "False", "TTFTAndTPOTAboveTarget", "; ".join(m for _, m in over)
    if over:
        return "False", over[0][0], over[0][1]
    return (
        "True",
        "WithinTarget",
        f"TTFT p{slo.percentile} {_ms(ttft)} ms <= {slo.ttft_ms} ms, TPOT {_ms(tpot)} ms <= {slo.tpot_ms} ms",
    )


def decision_body(d: Decision, at: str) -> Body:
    return {
        "pool": d.pool.value,
        "fromReplicas": d.current,
        "toReplicas": d.desired,
        "reason": d.reason,
        "reasonCode": d.reason_code,
        "time": at,
    }


def shape_body(tick: Tick, previous: Body, at: str) -> Body:
    """`status.autoscaling.shape`: the shape now, and the last change (kept until a newer one)."""
    now = current_shape(tick.replicas)
    body = {k: v for k, v in previous.items() if k in ("target", "reason", "time")}
    if tick.shape is not None and tick.shape.action is not ShapeAction.keep:
        body = {"target": str(tick.shape.target), "reason": tick.shape.reason[:1024], "time": at}
    return {"current": str(now) if now is not None else "changing", **body}


def slo_status(
    tick: Tick, slo: SloSpec, window_s: int, attainment: Mapping[str, float], previous: Body, at: str
) -> Body:
    """`status.slo`, `status.autoscaling` and the SLOMet condition (other conditions kept as they are).
    `at` is the tick's time as RFC 3339; the last decision stays until a newer one changes a pool."""
    ttft, tpot = observed_latencies(tick)
    slo_body: Body = {
        "percentile": slo.percentile,
        "windowSeconds": window_s,
        "ttftTargetMs": slo.ttft_ms,
        "tpotTargetMs": slo.tpot_ms,
        "ttft": f"{_ms(ttft)}/{slo.ttft_ms}ms",
        "tpot": f"{_ms(tpot)}/{slo.tpot_ms}ms",
        "observedAt": at,
    }
    if ttft is not None:
        slo_body["ttftMs"] = round(ttft, 1)
    if tpot is not None:
        slo_body["tpotMs"] = round(tpot, 1)
    if attainment:
        slo_body["attainment"] = {k: round(v, 4) for k, v in sorted(attainment.items())}
    pools = {}
    for pool, r in tick.replicas.items():
        d = tick.decisions.get(pool)
        desired = d.desired if d is not None else r.ready + r.starting
        pools[pool.value] = {
            "desiredReplicas": desired,
            "readyReplicas": r.ready,
            "startingReplicas": r.starting,
            "drainingReplicas": r.draining,
        }
    autoscaling: Body = {"pools": pools}
    last = ((previous.get("autoscaling") or {}).get("lastDecision")) or None
    if tick.applied:
        last = decision_body(tick.applied[-1], at)
    if last:
        autoscaling["lastDecision"] = last
    if {Pool.colocated, Pool.prefill} <= set(tick.replicas):  # mode auto
        autoscaling["shape"] = shape_body(tick, (previous.get("autoscaling") or {}).get("shape") or {}, at)
    status, reason, message = slo_met(tick, slo)
    prev = {c["type"]: c for c in previous.get("conditions") or []}
    old = prev.get("SLOMet") or {}
    condition = {
        "type": "SLOMet",
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": at if old.get("status") != status else old.get("lastTransitionTime", at),
    }
    conditions = [c for t, c in prev.items() if t != "SLOMet"] + [condition]
    return {"slo": slo_body, "autoscaling": autoscaling, "conditions": conditions}

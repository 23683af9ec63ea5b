"""The SLO policy: one pure call per interval turns per-pool observations into replica decisions with reasons.

Rules, in the order they apply to each pool (a pool at zero that the router holds requests for wakes
first, wake.py):
1. stale, missing or NaN metrics: hold and say which; but a pool with work waiting and no completion in
   the window is stalled, which is a breach (its latency is what its backlog implies, at least 2x the SLO);
2. capacity still arriving (replicas starting, or the last target not yet created): hold, unless the
   need already exceeds what is coming; replicas that are draining never hold a scale-up, only the next
   step down;
3. zero traffic for a stabilisation window: straight down to the minimum;
4. otherwise the target is the larger of a predictive floor (the capacity model at the rate forecast one
   cold start plus one interval ahead) and a reactive term (SLO breached now, the running batch, or the
   prefill queue growing faster than the pool drains it). Reactive terms go up at once; a forecast alone
   goes up once it held for `up_confirm_s`. Down only after the need stayed below the current count for
   the stabilisation window, only if the fewer replicas still meet the SLO with margin, not while the
   pool's past quiet spells were shorter than the wait plus a cold start (a removal that must be undone
   within a cold start costs more than it saves), by up to `down_step_fraction` of the pool per step;
5. min/max per pool, then an optional GPU budget shared by the pools (budget.py).

Each rule is a function of the pool's tick (`_stale`, `_out_of_bounds`, ..., `step_down`) that returns a
Decision with its reason, or None; `_decide_pool` runs them in order and carries the state between them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from tandem.operator.autoscale.core import forecast as fc
from tandem.operator.autoscale.core.budget import apply_budget
from tandem.operator.autoscale.core.capacity import prefill_drain_tokens_per_ms
from tandem.operator.autoscale.core.config import PolicyConfig
from tandem.operator.autoscale.core.pool_tick import (
    QUIET_SPELLS,
    Plan,
    PolicyState,
    PoolState,
    Push,
    Tick,
    hold,
)
from tandem.operator.autoscale.core.scale_down import DOWN_RULES, steady, step_down
from tandem.operator.autoscale.core.sizing import Sizing, missing, size_pool
from tandem.operator.autoscale.core.types import Decision, Pool, PoolObservation
from tandem.operator.autoscale.core.wake import holds_demand, wake_from_zero


@dataclass(frozen=True)
class _Outcome:
    decision: Decision
    state: PoolState
    latency_share: Callable[[int], float] | None = None  # predicted latency / SLO at N replicas


def decide(
    observations: dict[Pool, PoolObservation], state: PolicyState, config: PolicyConfig, now_s: float
) -> tuple[dict[Pool, Decision], PolicyState]:
    """Decide every observed pool; the returned state replaces `state` for the next call."""
    outcomes = {
        pool: _decide_pool(obs, state.pools.get(pool, PoolState()), config, now_s)
        for pool, obs in observations.items()
    }
    decisions = {pool: o.decision for pool, o in outcomes.items()}
    if config.gpu_budget is not None:
        decisions = apply_budget(decisions, {pool: o.latency_share for pool, o in outcomes.items()}, config)
    pools = dict(state.pools)
    for pool, o in outcomes.items():
        pools[pool] = _record(o.state, decisions[pool], now_s)
    return decisions, PolicyState(pools)


def _record(ps: PoolState, d: Decision, now_s: float) -> PoolState:
    if not d.changes:
        return ps
    direction = 1 if d.desired > d.current else -1
    return replace(ps, target=d.desired, target_since_s=now_s, last_change_s=now_s, last_direction=direction)


# --- one pool: the rules ---------------------------------------------------------------------------------
# A rule reads one pool's tick (and, past the guards, its plan) and returns a Decision with its reason, or
# None to let the next rule speak. What the policy remembers changes only in `_decide_pool`, between rules.


def _required(obs: PoolObservation) -> tuple[str, ...]:
    if obs.pool == Pool.prefill:
        return ("prompt_tokens_mean", "ttft_ms")
    if obs.pool == Pool.decode:
        return ("prompt_tokens_mean", "output_tokens_mean", "tpot_ms")
    return ("prompt_tokens_mean", "output_tokens_mean", "ttft_ms", "tpot_ms")


# Guards: before any sizing.


def _stale(t: Tick) -> Decision | None:
    age = t.now_s - t.obs.at_s
    return t.hold("MetricsStale", f"metrics are {age:.0f} s old") if age > t.cfg.stale_after_s else None


def _no_rate(t: Tick) -> Decision | None:
    return t.hold("MetricsUnavailable", "arrival rate missing") if missing(t.obs.arrival_rate_rps) else None


def _out_of_bounds(t: Tick) -> Decision | None:
    lo, hi = t.limits.min_replicas, t.limits.max_replicas
    if lo <= t.current <= hi:
        return None
    return t.move(min(max(t.current, lo), hi), "Bounds", f"bounds are {lo}..{hi}")


def _metrics_absent(t: Tick) -> Decision | None:
    absent = [name for name in _required(t.obs) if missing(getattr(t.obs, name))]
    return t.hold("MetricsUnavailable", "missing " + ", ".join(absent)) if absent else None


def _is_idle(obs: PoolObservation) -> bool:
    return (
        obs.arrival_rate_rps <= 0
        and not (obs.queued_prompt_tokens or 0) > 0
        and not (obs.running_sequences or 0) > 0
        and not holds_demand(obs)
    )  # type: ignore[operator]


# Up: the target is above the current count.


def _arriving_covers(t: Tick, p: Plan) -> Decision | None:
    if not t.arriving or max(p.sizing.need.replicas, p.sizing.now_need) > t.current:
        return None
    r = t.obs.replicas
    return t.hold(
        "InFlight",
        f"waiting for {t.ps.target} (ready {r.ready}, starting {r.starting}, draining {r.draining})",
    )


def _up_cooldown(t: Tick, p: Plan) -> Decision | None:
    since = t.now_s - t.ps.last_change_s
    if t.ps.last_direction > 0 and since < t.cfg.scale_up_cooldown_s:
        return t.hold("Cooldown", f"scaled up {since:.0f} s ago; " + p.text)
    return None


def _forecast_only(t: Tick, p: Plan) -> bool:
    return not (p.push.replicas > t.current and p.push.code)


def _confirming(t: Tick, p: Plan) -> Decision | None:
    """A forecast alone goes up once it held for `up_confirm_s` (the tick's state says since when it asks)."""
    since = t.ps.up_since_s
    if since is None or t.now_s - since >= t.cfg.up_confirm_s:
        return None
    return t.hold(
        "Confirming", f"{p.text}; confirming for {t.cfg.up_confirm_s:.0f} s before going up", **p.details
    )


def _scale_up(t: Tick, p: Plan) -> Decision:
    push = p.push
    code = push.code if push.replicas >= p.sizing.need.replicas and push.code else "Forecast"
    why = f"{push.why}; {p.text}" if push.why else p.text
    return t.move(p.target, code, why, p.details)


def _first(rules: tuple[Callable[[Tick, Plan], Decision | None], ...], t: Tick, p: Plan) -> Decision | None:
    return next((d for rule in rules if (d := rule(t, p)) is not None), None)


def _decide_pool(obs: PoolObservation, ps: PoolState, cfg: PolicyConfig, now_s: float) -> _Outcome:
    t = Tick(obs, cfg, now_s, ps)
    if d := _stale(t) or wake_from_zero(obs, t.limits) or _no_rate(t):
        return _Outcome(d, ps)
    t = _track(t)
    if d := _out_of_bounds(t):
        return _Outcome(d, t.ps)
    if _is_idle(obs):
        return _idle(obs, replace(t.ps, low_since_s=None), cfg, now_s, t.current)
    obs, stalled = _stalled(obs, cfg)
    t = replace(t, obs=obs, ps=replace(t.ps, idle_since_s=None))
    if d := _metrics_absent(t):
        return _Outcome(d, t.ps)

    p = _plan(t, stalled)
    t = replace(t, ps=replace(t.ps, last_queue_tokens=obs.queued_prompt_tokens, last_queue_at_s=obs.at_s))
    share = p.sizing.latency_share

    if p.target > t.current:
        if d := _arriving_covers(t, p):
            return _Outcome(d, t.ps, share)
        t = replace(t, ps=_end_quiet_spell(t.ps, now_s))
        if d := _up_cooldown(t, p):
            return _Outcome(d, t.ps, share)
        up_since = (now_s if t.ps.up_since_s is None else t.ps.up_since_s) if _forecast_only(t, p) else None
        t = replace(t, ps=replace(t.ps, up_since_s=up_since))
        if d := _confirming(t, p):
            return _Outcome(d, t.ps, share)
        return _Outcome(_scale_up(t, p), replace(t.ps, up_since_s=None), share)

    t = replace(t, ps=replace(t.ps, up_since_s=None))
    if d := steady(t, p):
        return _Outcome(d, _end_quiet_spell(t.ps, now_s), share)
    t = replace(t, ps=replace(t.ps, low_since_s=now_s if t.ps.low_since_s is None else t.ps.low_since_s))
    return _Outcome(_first(DOWN_RULES, t, p) or step_down(t, p), t.ps, share)


def _track(t: Tick) -> Tick:
    """The forecaster sees the rate; a target is forgotten once reached, given up on, or nothing moves."""
    rate, ps, r = float(t.obs.arrival_rate_rps), t.ps, t.obs.replicas  # type: ignore[arg-type]
    forecaster = (
        fc.start(rate, t.obs.at_s) if ps.forecaster is None else fc.observe(ps.forecaster, rate, t.obs.at_s)
    )
    ps = replace(ps, forecaster=forecaster)
    arriving = False
    if ps.target is not None:
        arriving = r.starting > 0 or r.ready + r.starting < ps.target
        if t.now_s - ps.target_since_s >= t.cfg.in_flight_timeout_s or not (arriving or r.draining):
            ps, arriving = replace(ps, target=None), False
    return replace(t, ps=ps, arriving=arriving)


def _plan(t: Tick, stalled: str) -> Plan:
    """Size the pool for the larger of the rate now and the rate forecast one cold start ahead; add what the
    present calls for (`_push`); a forecast alone moves up only past a tolerance band."""
    obs, cfg, current = t.obs, t.cfg, t.current
    rate = float(obs.arrival_rate_rps)  # type: ignore[arg-type]
    assert t.ps.forecaster is not None
    predicted = fc.forecast(t.ps.forecaster, cfg.horizon_s)
    floor_rate = max(rate, predicted.rate_rps)
    s = size_pool(obs, cfg, floor_rate)
    need = s.need
    text = (
        f"predicted {floor_rate:.3g} req/s ({predicted.model})"
        + (f", bursts of {s.rate_rps:.3g} req/s," if s.rate_rps > floor_rate * 1.05 else "")
        + f" needs {need.load_replicas:.2g} replicas"
        + (f" at batch {need.batch:.0f}" if need.batch else "")
    )
    details = {
        "rate_rps": rate,
        "predicted_rate_rps": floor_rate,
        "needed_replicas": float(need.replicas),
        "load_replicas": need.load_replicas,
        "observed_ms": s.observed_ms,
        "slo_ms": s.slo_ms,
    }
    push, lagging = _push(t, s, stalled)
    predictive = need.replicas
    if (
        predictive > current
    ):  # a forecast alone moves up only past a tolerance band (the SLO breach does not wait)
        loose = min(cfg.margin * (1 + cfg.up_tolerance), 0.95)
        predictive = max(current, size_pool(obs, cfg, floor_rate, loose).need.replicas)
    target = min(max(predictive, push.replicas, t.limits.min_replicas), t.limits.max_replicas)
    return Plan(s, text + lagging, details, push, predictive, target)


def _push(t: Tick, s: Sizing, stalled: str) -> tuple[Push, str]:
    """The reactive term, strongest last: an SLO breach the present load still implies, the running batch,
    a growing prefill queue, a stall. Also a note for a breach the present load no longer implies."""
    current, lagging = t.current, ""
    push = Push(0, "", "")
    breach = _breach(t, s)
    if breach:
        push = breach
    elif s.observed_ms > s.slo_ms:
        lagging = f"; {_breach_text(t, s)} but the present {s.now_source} implies {s.now_ms:.0f} ms"
    if s.now_need > max(push.replicas, s.need.replicas, current):
        push = Push(
            s.now_need,
            f"{t.obs.running_sequences:.0f} running sequences need {s.now_need} replicas",
            "RunningBatch",
        )
    growing = _queue_growing(t.obs, t.ps, t.cfg, current)
    if growing and push.replicas <= current:
        push = Push(current + 1, growing, "QueueGrowing")
    if stalled and push.replicas <= current:
        push = Push(current + 1, stalled, "Stalled")
    elif stalled:
        push = push._replace(why=f"{stalled}: {push.why}")
    return push, lagging


def _breach_text(t: Tick, s: Sizing) -> str:
    return f"{s.label} p{t.cfg.slo.percentile:g} {s.observed_ms:.0f} ms > {s.slo_ms:.0f} ms SLO"


def _breach(t: Tick, s: Sizing) -> Push | None:
    """Latency percentiles lag (a TPOT sample is a whole generation old): a breach acts only while the pool's
    present backlog or batch still implies a latency above the margin. Replicas shorten only the wait, never
    a prompt's own service time: prefill acts on the wait part, in proportion (a queue drains faster with
    more servers). Decode: running sequences stay where they are, so new replicas relieve only new
    arrivals: one more at a time, the running batch sizes the rest."""
    current = t.current
    allowed_wait = max(t.cfg.margin * s.slo_ms - s.service_ms, 0.1 * s.slo_ms)
    if not (s.observed_ms > s.slo_ms and s.now_ms - s.service_ms > allowed_wait):
        return None
    if t.obs.pool == Pool.decode:
        ratio_step = current + 1
    else:
        ratio_step = math.ceil(current * (s.observed_ms - s.service_ms) / allowed_wait)
    return Push(min(2 * current, max(current + 1, ratio_step)), _breach_text(t, s), "SLOBreach")


def _end_quiet_spell(ps: PoolState, now_s: float) -> PoolState:
    """The need reached the count again: remember how long it stayed below (the last few spells). A spell
    that ended in our own step down is not one: the need never came back."""
    if ps.low_since_s is None:
        return ps
    if ps.last_direction < 0 and ps.last_change_s >= ps.low_since_s:
        return replace(ps, low_since_s=None)
    return replace(
        ps, low_since_s=None, quiet_spells_s=(*ps.quiet_spells_s, now_s - ps.low_since_s)[-QUIET_SPELLS:]
    )


def _stalled(obs: PoolObservation, cfg: PolicyConfig) -> tuple[PoolObservation, str]:
    """A pool with work waiting and no completion in the window is stalled: a breach, not missing data."""
    slo = cfg.slo
    prompt = obs.prompt_tokens_mean
    if (
        obs.pool in (Pool.prefill, Pool.colocated)
        and missing(obs.ttft_ms)
        and (obs.queued_prompt_tokens or 0) > 0
    ):
        backlog = float(obs.queued_prompt_tokens)  # type: ignore[arg-type]
        implied = 0.0
        if not missing(prompt) and prompt:
            per_ms = max(obs.replicas.ready, 1) * prefill_drain_tokens_per_ms(cfg.profile, prompt)
            implied = backlog / per_ms
        ttft = max(implied, 2 * slo.ttft_ms)
        return replace(obs, ttft_ms=ttft), f"{backlog:.0f} prompt tokens wait and none finished in the window"
    if (
        obs.pool in (Pool.decode, Pool.colocated)
        and missing(obs.tpot_ms)
        and (obs.running_sequences or 0) > 0
    ):
        return replace(
            obs, tpot_ms=2 * slo.tpot_ms
        ), f"{obs.running_sequences:.0f} sequences run and no token came in the window"
    return obs, ""


def _idle(obs: PoolObservation, ps: PoolState, cfg: PolicyConfig, now_s: float, current: int) -> _Outcome:
    idle_since = now_s if ps.idle_since_s is None else ps.idle_since_s
    ps = replace(ps, idle_since_s=idle_since)
    floor = cfg.limits_for(obs.pool).min_replicas
    if current <= floor:
        return _Outcome(hold(obs, current, "Idle", "no traffic, at the minimum"), ps, lambda n: 0.0)
    waited = now_s - idle_since
    if waited < cfg.stabilization_s:
        why = f"no traffic for {waited:.0f} s; down to {floor} after {cfg.stabilization_s:.0f} s"
        return _Outcome(hold(obs, current, "Idle", why), ps, lambda n: 0.0)
    why = f"no traffic for {waited:.0f} s"
    decision = Decision(obs.pool, current, floor, f"{obs.pool} {current}->{floor}: {why}", "ScaleDownIdle")
    return _Outcome(decision, ps, lambda n: 0.0)


def _queue_growing(obs: PoolObservation, ps: PoolState, cfg: PolicyConfig, current: int) -> str:
    """Why the prefill backlog calls for a replica now ('' if it does not)."""
    q = obs.queued_prompt_tokens
    if obs.pool == Pool.decode or missing(q) or ps.last_queue_tokens is None or ps.last_queue_at_s is None:
        return ""
    dt = obs.at_s - ps.last_queue_at_s
    if dt <= 0 or q <= ps.last_queue_tokens:  # type: ignore[operator]
        return ""
    prompt = max(float(obs.prompt_tokens_mean or 1.0), 1.0)
    tokens_per_s = current * prefill_drain_tokens_per_ms(cfg.profile, prompt) * 1000
    drain_s = float(q) / max(tokens_per_s, 1e-9)  # type: ignore[arg-type]
    if drain_s * 1000 <= cfg.slo.ttft_ms:
        return ""
    growth = (float(q) - ps.last_queue_tokens) / dt  # type: ignore[arg-type]
    return f"prefill queue {q:.0f} tokens grows {growth:.0f} tokens/s and takes {drain_s:.1f} s to drain"

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
5. min/max per pool, then an optional GPU budget shared by the pools, given to the pool whose
   predicted latency (as a share of its SLO) drops most per replica.

Each rule is a function of the pool's tick (`_stale`, `_out_of_bounds`, ..., `_step_down`) that returns a
Decision with its reason, or None; `_decide_pool` runs them in order and carries the state between them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from tandem.operator.autoscale import forecast as fc
from tandem.operator.autoscale.config import PolicyConfig, PoolLimits
from tandem.operator.autoscale.sizing import Sizing, missing, size_pool
from tandem.operator.autoscale.types import Decision, Pool, PoolObservation
from tandem.operator.autoscale.wake import holds_demand, wake_from_zero

QUIET_SPELLS = 5  # how many past quiet spells the break-even rule weighs (their median)


@dataclass(frozen=True)
class PoolState:
    """What the policy remembers of one pool between calls."""

    forecaster: fc.RateForecaster | None = None
    target: int | None = None  # the last decided count, until the pool reaches it
    target_since_s: float = -math.inf
    last_change_s: float = -math.inf
    last_direction: int = 0  # +1 up, -1 down, 0 none yet
    low_since_s: float | None = None  # since when the need stayed below the current count
    idle_since_s: float | None = None  # since when the pool saw no traffic
    last_queue_tokens: float | None = None
    last_queue_at_s: float | None = None
    up_since_s: float | None = None  # since when a forecast alone has asked for more replicas
    quiet_spells_s: tuple[float, ...] = ()  # lengths of the last spells with the need below the count


@dataclass(frozen=True)
class PolicyState:
    pools: dict[Pool, PoolState] = field(default_factory=dict)


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
        decisions = _apply_budget(decisions, outcomes, config)
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


@dataclass(frozen=True)
class _Tick:
    """One pool at one call: its observation, the settings, the clock and what the policy remembers."""

    obs: PoolObservation
    cfg: PolicyConfig
    now_s: float
    ps: PoolState
    arriving: bool = False  # capacity asked for is still on its way: only a larger need moves the pool now

    @property
    def current(self) -> int:
        return self.obs.replicas.ready + self.obs.replicas.starting  # starting replicas are capacity on its way

    @property
    def limits(self) -> PoolLimits:
        return self.cfg.limits_for(self.obs.pool)

    def hold(self, code: str, why: str, **details: float) -> Decision:
        return _hold(self.obs, self.current, code, why, **details)

    def move(self, desired: int, code: str, why: str, details: dict[str, float] | None = None) -> Decision:
        pool, current = self.obs.pool, self.current
        return Decision(pool, current, desired, f"{pool} {current}->{desired}: {why}", code, details or {})


class _Push(NamedTuple):
    """A reactive term: the replicas the present calls for, why, and its reason code ('' when none)."""

    replicas: int
    why: str
    code: str


@dataclass(frozen=True)
class _Plan:
    """What the pool needs this tick: the capacity model's sizing, the reactive and predictive terms, the target."""

    sizing: Sizing
    text: str  # "predicted 12 req/s (holt) needs 2.4 replicas at batch 24": the tail of most reasons
    details: dict[str, float]
    push: _Push
    predictive: int
    target: int


def _hold(obs: PoolObservation, current: int, code: str, why: str, **details: float) -> Decision:
    return Decision(obs.pool, current, current, f"{obs.pool} holds at {current}: {why}", code, dict(details))


def _required(obs: PoolObservation) -> tuple[str, ...]:
    if obs.pool == Pool.prefill:
        return ("prompt_tokens_mean", "ttft_ms")
    if obs.pool == Pool.decode:
        return ("prompt_tokens_mean", "output_tokens_mean", "tpot_ms")
    return ("prompt_tokens_mean", "output_tokens_mean", "ttft_ms", "tpot_ms")


# Guards: before any sizing.


def _stale(t: _Tick) -> Decision | None:
    age = t.now_s - t.obs.at_s
    return t.hold("MetricsStale", f"metrics are {age:.0f} s old") if age > t.cfg.stale_after_s else None


def _no_rate(t: _Tick) -> Decision | None:
    return t.hold("MetricsUnavailable", "arrival rate missing") if missing(t.obs.arrival_rate_rps) else None


def _out_of_bounds(t: _Tick) -> Decision | None:
    lo, hi = t.limits.min_replicas, t.limits.max_replicas
    if lo <= t.current <= hi:
        return None
    return t.move(min(max(t.current, lo), hi), "Bounds", f"bounds are {lo}..{hi}")


def _metrics_absent(t: _Tick) -> Decision | None:
    absent = [name for name in _required(t.obs) if missing(getattr(t.obs, name))]
    return t.hold("MetricsUnavailable", "missing " + ", ".join(absent)) if absent else None


def _is_idle(obs: PoolObservation) -> bool:
    return obs.arrival_rate_rps <= 0 and not (obs.queued_prompt_tokens or 0) > 0 and not (obs.running_sequences or 0) > 0 and not holds_demand(obs)  # type: ignore[operator]


# Up: the target is above the current count.


def _arriving_covers(t: _Tick, p: _Plan) -> Decision | None:
    if not t.arriving or max(p.sizing.need.replicas, p.sizing.now_need) > t.current:
        return None
    r = t.obs.replicas
    return t.hold("InFlight", f"waiting for {t.ps.target} (ready {r.ready}, starting {r.starting}, draining {r.draining})")


def _up_cooldown(t: _Tick, p: _Plan) -> Decision | None:
    since = t.now_s - t.ps.last_change_s
    if t.ps.last_direction > 0 and since < t.cfg.scale_up_cooldown_s:
        return t.hold("Cooldown", f"scaled up {since:.0f} s ago; " + p.text)
    return None


def _forecast_only(t: _Tick, p: _Plan) -> bool:
    return not (p.push.replicas > t.current and p.push.code)


def _confirming(t: _Tick, p: _Plan) -> Decision | None:
    """A forecast alone goes up once it held for `up_confirm_s` (the tick's state says since when it asks)."""
    since = t.ps.up_since_s
    if since is None or t.now_s - since >= t.cfg.up_confirm_s:
        return None
    return t.hold("Confirming", f"{p.text}; confirming for {t.cfg.up_confirm_s:.0f} s before going up", **p.details)


def _scale_up(t: _Tick, p: _Plan) -> Decision:
    push = p.push
    code = push.code if push.replicas >= p.sizing.need.replicas and push.code else "Forecast"
    why = f"{push.why}; {p.text}" if push.why else p.text
    return t.move(p.target, code, why, p.details)


# Down: the target is at or below the current count.


def _steady(t: _Tick, p: _Plan) -> Decision | None:
    if p.target == t.current or t.current <= t.limits.min_replicas:
        return t.hold("Steady", p.text, **p.details)
    return None


def _last_change_in_flight(t: _Tick, p: _Plan) -> Decision | None:
    r = t.obs.replicas
    if not (t.arriving or r.draining):
        return None
    why = f"{p.text}; waiting for the last change (starting {r.starting}, draining {r.draining}) before going down"
    return t.hold("InFlight", why, **p.details)


def _low_for(t: _Tick) -> float:
    """How long the need has stayed below the count (the tick's state holds since when)."""
    return t.now_s - t.ps.low_since_s if t.ps.low_since_s is not None else 0.0


def _stabilizing(t: _Tick, p: _Plan) -> Decision | None:
    waited, window = _low_for(t), t.cfg.stabilization_s
    if waited >= window:
        return None
    return t.hold("Stabilizing", f"{p.text}; stabilizing {waited:.0f}/{window:.0f} s before going down", **p.details)


def _down_cooldown(t: _Tick, p: _Plan) -> Decision | None:
    since = t.now_s - t.ps.last_change_s
    if t.ps.last_direction < 0 and since < t.cfg.scale_down_cooldown_s:
        return t.hold("Cooldown", f"{p.text}; stepped down {since:.0f} s ago", **p.details)
    return None


def _above_margin(t: _Tick, p: _Plan) -> Decision | None:
    s, margin = p.sizing, t.cfg.margin
    if s.observed_ms <= margin * s.slo_ms:
        return None
    why = f"{s.label} {s.observed_ms:.0f} ms is above {margin:.0%} of the {s.slo_ms:.0f} ms SLO; {p.text}"
    return t.hold("NoMargin", why, **p.details)


def _break_even(t: _Tick, p: _Plan) -> Decision | None:
    """Of the past quiet spells that outlasted this one so far, the typical one ends too soon for a removed
    replica to stay away longer than the cold start it costs to bring it back."""
    waited, cold = _low_for(t), t.cfg.cold_start
    longer = sorted(s for s in t.ps.quiet_spells_s if s > waited)
    if not longer or longer[len(longer) // 2] - waited >= cold:
        return None
    left = longer[len(longer) // 2] - waited
    why = (f"{p.text}; quiet spells this long ended about {left:.0f} s later, within a {cold:.0f} s "
           "cold start: a replica removed now would be wanted back before it paid off")  # fmt: skip
    return t.hold("BreakEven", why, **p.details)


def _step_down(t: _Tick, p: _Plan) -> Decision:
    """Down by up to `down_step_fraction` of the pool, to the fewest replicas that keep the SLO with margin."""
    current, share, label = t.current, p.sizing.latency_share, p.sizing.label
    bound = max(p.target, t.limits.min_replicas, current - max(1, math.floor(current * t.cfg.down_step_fraction)))
    desired = next((n for n in range(bound, current) if share(n) <= t.cfg.margin * t.cfg.hysteresis), current)
    if desired == current:
        why = f"{current - 1} replicas would run at {share(current - 1):.0%} of the {label} SLO; {p.text}"
        return t.hold("NoMargin", why, **p.details)
    return t.move(desired, "ScaleDown", f"{p.text}; {desired} replicas keep {label} at {share(desired):.0%} of the SLO", p.details)


_DOWN_RULES = (_last_change_in_flight, _stabilizing, _down_cooldown, _above_margin, _break_even)


def _first(rules: tuple[Callable[[_Tick, _Plan], Decision | None], ...], t: _Tick, p: _Plan) -> Decision | None:
    return next((d for rule in rules if (d := rule(t, p)) is not None), None)


def _decide_pool(obs: PoolObservation, ps: PoolState, cfg: PolicyConfig, now_s: float) -> _Outcome:
    t = _Tick(obs, cfg, now_s, ps)
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
    if d := _steady(t, p):
        return _Outcome(d, _end_quiet_spell(t.ps, now_s), share)
    t = replace(t, ps=replace(t.ps, low_since_s=now_s if t.ps.low_since_s is None else t.ps.low_since_s))
    return _Outcome(_first(_DOWN_RULES, t, p) or _step_down(t, p), t.ps, share)


def _track(t: _Tick) -> _Tick:
    """The forecaster sees the rate; a target is forgotten once reached, given up on, or nothing moves."""
    rate, ps, r = float(t.obs.arrival_rate_rps), t.ps, t.obs.replicas  # type: ignore[arg-type]
    forecaster = fc.start(rate, t.obs.at_s) if ps.forecaster is None else fc.observe(ps.forecaster, rate, t.obs.at_s)
    ps = replace(ps, forecaster=forecaster)
    arriving = False
    if ps.target is not None:
        arriving = r.starting > 0 or r.ready + r.starting < ps.target
        if t.now_s - ps.target_since_s >= t.cfg.in_flight_timeout_s or not (arriving or r.draining):
            ps, arriving = replace(ps, target=None), False
    return replace(t, ps=ps, arriving=arriving)


def _plan(t: _Tick, stalled: str) -> _Plan:
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
    if predictive > current:  # a forecast alone moves up only past a tolerance band (the SLO breach does not wait)
        loose = min(cfg.margin * (1 + cfg.up_tolerance), 0.95)
        predictive = max(current, size_pool(obs, cfg, floor_rate, loose).need.replicas)
    target = min(max(predictive, push.replicas, t.limits.min_replicas), t.limits.max_replicas)
    return _Plan(s, text + lagging, details, push, predictive, target)


def _push(t: _Tick, s: Sizing, stalled: str) -> tuple[_Push, str]:
    """The reactive term, strongest last: an SLO breach the present load still implies, the running batch,
    a growing prefill queue, a stall. Also a note for a breach the present load no longer implies."""
    current, lagging = t.current, ""
    push = _Push(0, "", "")
    breach = _breach(t, s)
    if breach:
        push = breach
    elif s.observed_ms > s.slo_ms:
        lagging = f"; {_breach_text(t, s)} but the present {s.now_source} implies {s.now_ms:.0f} ms"
    if s.now_need > max(push.replicas, s.need.replicas, current):
        push = _Push(s.now_need, f"{t.obs.running_sequences:.0f} running sequences need {s.now_need} replicas", "RunningBatch")
    growing = _queue_growing(t.obs, t.ps, t.cfg, current)
    if growing and push.replicas <= current:
        push = _Push(current + 1, growing, "QueueGrowing")
    if stalled and push.replicas <= current:
        push = _Push(current + 1, stalled, "Stalled")
    elif stalled:
        push = push._replace(why=f"{stalled}: {push.why}")
    return push, lagging


def _breach_text(t: _Tick, s: Sizing) -> str:
    return f"{s.label} p{t.cfg.slo.percentile:g} {s.observed_ms:.0f} ms > {s.slo_ms:.0f} ms SLO"


def _breach(t: _Tick, s: Sizing) -> _Push | None:
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
    return _Push(min(2 * current, max(current + 1, ratio_step)), _breach_text(t, s), "SLOBreach")


def _end_quiet_spell(ps: PoolState, now_s: float) -> PoolState:
    """The need reached the count again: remember how long it stayed below (the last few spells). A spell
    that ended in our own step down is not one: the need never came back."""
    if ps.low_since_s is None:
        return ps
    if ps.last_direction < 0 and ps.last_change_s >= ps.low_since_s:
        return replace(ps, low_since_s=None)
    return replace(ps, low_since_s=None, quiet_spells_s=(*ps.quiet_spells_s, now_s - ps.low_since_s)[-QUIET_SPELLS:])


def _stalled(obs: PoolObservation, cfg: PolicyConfig) -> tuple[PoolObservation, str]:
    """A pool with work waiting and no completion in the window is stalled: a breach, not missing data."""
    slo = cfg.slo
    prompt = obs.prompt_tokens_mean
    if obs.pool in (Pool.prefill, Pool.colocated) and missing(obs.ttft_ms) and (obs.queued_prompt_tokens or 0) > 0:
        backlog = float(obs.queued_prompt_tokens)  # type: ignore[arg-type]
        implied = 0.0
        if not missing(prompt) and prompt:
            per_ms = max(obs.replicas.ready, 1) * prompt / cfg.profile.prefill_ms(prompt)
            implied = backlog / per_ms
        ttft = max(implied, 2 * slo.ttft_ms)
        return replace(obs, ttft_ms=ttft), f"{backlog:.0f} prompt tokens wait and none finished in the window"
    if obs.pool in (Pool.decode, Pool.colocated) and missing(obs.tpot_ms) and (obs.running_sequences or 0) > 0:
        return replace(obs, tpot_ms=2 * slo.tpot_ms), f"{obs.running_sequences:.0f} sequences run and no token came in the window"
    return obs, ""


def _idle(obs: PoolObservation, ps: PoolState, cfg: PolicyConfig, now_s: float, current: int) -> _Outcome:
    idle_since = now_s if ps.idle_since_s is None else ps.idle_since_s
    ps = replace(ps, idle_since_s=idle_since)
    floor = cfg.limits_for(obs.pool).min_replicas
    if current <= floor:
        return _Outcome(_hold(obs, current, "Idle", "no traffic, at the minimum"), ps, lambda n: 0.0)
    waited = now_s - idle_since
    if waited < cfg.stabilization_s:
        why = f"no traffic for {waited:.0f} s; down to {floor} after {cfg.stabilization_s:.0f} s"
        return _Outcome(_hold(obs, current, "Idle", why), ps, lambda n: 0.0)
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
    tokens_per_s = current * prompt / (cfg.profile.prefill_ms(prompt) / 1000)
    drain_s = float(q) / max(tokens_per_s, 1e-9)  # type: ignore[arg-type]
    if drain_s * 1000 <= cfg.slo.ttft_ms:
        return ""
    growth = (float(q) - ps.last_queue_tokens) / dt  # type: ignore[arg-type]
    return f"prefill queue {q:.0f} tokens grows {growth:.0f} tokens/s and takes {drain_s:.1f} s to drain"


# --- the shared GPU budget ---------------------------------------------------------------------------------

_SATURATED = 1000.0  # a pool that cannot keep up at all ranks above any latency share


def _apply_budget(
    decisions: dict[Pool, Decision], outcomes: dict[Pool, _Outcome], cfg: PolicyConfig
) -> dict[Pool, Decision]:
    """Cut the desired counts to the budget: each GPU goes to the pool whose SLO gains most from it."""
    assert cfg.gpu_budget is not None
    gpus = {p: cfg.limits_for(p).gpus_per_replica for p in decisions}
    wanted = sum(d.desired * gpus[p] for p, d in decisions.items())
    if wanted <= cfg.gpu_budget:
        return decisions
    alloc = {p: min(cfg.limits_for(p).min_replicas, d.desired) for p, d in decisions.items()}
    left = cfg.gpu_budget - sum(alloc[p] * gpus[p] for p in alloc)

    def shortfall(p: Pool, n: int) -> float:
        """Predicted latency / SLO; past saturation, a large number that still falls with every replica."""
        share = outcomes[p].latency_share
        value = 0.0 if share is None else share(n)
        if math.isinf(value):
            return _SATURATED + max(decisions[p].details.get("load_replicas", 0.0) - n, 0.0) + 1.0
        return min(value, _SATURATED)

    def gain(p: Pool) -> float:
        drop = shortfall(p, alloc[p]) - shortfall(p, alloc[p] + 1)
        return drop / gpus[p] if gpus[p] else math.inf

    while True:
        open_pools = [p for p in alloc if alloc[p] < decisions[p].desired and gpus[p] <= left]
        if not open_pools:
            break
        best = max(open_pools, key=lambda p: (gain(p), decisions[p].desired - alloc[p]))
        alloc[best] += 1
        left -= gpus[best]
    out = {}
    for p, d in decisions.items():
        if alloc[p] >= d.desired:
            out[p] = d
            continue
        why = f"{d.reason}; GPU budget {cfg.gpu_budget} allows {alloc[p]}"
        out[p] = Decision(p, d.current, alloc[p], why.replace(f"{d.current}->{d.desired}", f"{d.current}->{alloc[p]}"), "GPUBudget", d.details)
    return out

"""The SLO policy: one pure call per interval turns per-pool observations into replica decisions with reasons.

Rules, in the order they apply to each pool:
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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tandem.operator.autoscale import forecast as fc
from tandem.operator.autoscale.capacity import (
    DecodeLoad,
    Need,
    PrefillLoad,
    burst_rate,
    decode_need,
    decode_tpot_ms,
    prefill_need,
    prefill_ttft_ms,
)
from tandem.operator.autoscale.config import PolicyConfig
from tandem.operator.autoscale.types import Decision, Pool, PoolObservation

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


# --- one pool ------------------------------------------------------------------------------------------


def _missing(value: float | None) -> bool:
    return value is None or math.isnan(value)


def _hold(obs: PoolObservation, current: int, code: str, why: str, **details: float) -> Decision:
    return Decision(obs.pool, current, current, f"{obs.pool} holds at {current}: {why}", code, dict(details))


def _required(obs: PoolObservation) -> tuple[str, ...]:
    if obs.pool == Pool.prefill:
        return ("prompt_tokens_mean", "ttft_ms")
    if obs.pool == Pool.decode:
        return ("prompt_tokens_mean", "output_tokens_mean", "tpot_ms")
    return ("prompt_tokens_mean", "output_tokens_mean", "ttft_ms", "tpot_ms")


def _decide_pool(obs: PoolObservation, ps: PoolState, cfg: PolicyConfig, now_s: float) -> _Outcome:
    r = obs.replicas
    current = r.ready + r.starting  # starting replicas are capacity on its way
    limits = cfg.limits_for(obs.pool)

    age = now_s - obs.at_s
    if age > cfg.stale_after_s:
        return _Outcome(_hold(obs, current, "MetricsStale", f"metrics are {age:.0f} s old"), ps)
    if _missing(obs.arrival_rate_rps):
        return _Outcome(_hold(obs, current, "MetricsUnavailable", "arrival rate missing"), ps)
    rate = float(obs.arrival_rate_rps)  # type: ignore[arg-type]

    forecaster = ps.forecaster
    forecaster = fc.start(rate, obs.at_s) if forecaster is None else fc.observe(forecaster, rate, obs.at_s)
    ps = replace(ps, forecaster=forecaster)

    arriving = False  # capacity asked for is still on its way: only a larger need moves the pool now
    if ps.target is not None:
        arriving = r.starting > 0 or r.ready + r.starting < ps.target
        if now_s - ps.target_since_s >= cfg.in_flight_timeout_s or not (arriving or r.draining):
            ps, arriving = replace(ps, target=None), False

    if current < limits.min_replicas or current > limits.max_replicas:
        desired = min(max(current, limits.min_replicas), limits.max_replicas)
        why = f"bounds are {limits.min_replicas}..{limits.max_replicas}"
        return _Outcome(Decision(obs.pool, current, desired, f"{obs.pool} {current}->{desired}: {why}", "Bounds"), ps)

    idle = rate <= 0 and not (obs.queued_prompt_tokens or 0) > 0 and not (obs.running_sequences or 0) > 0
    if idle:
        return _idle(obs, replace(ps, low_since_s=None), cfg, now_s, current)
    ps = replace(ps, idle_since_s=None)

    obs, stalled = _stalled(obs, cfg)
    absent = [name for name in _required(obs) if _missing(getattr(obs, name))]
    if absent:
        return _Outcome(_hold(obs, current, "MetricsUnavailable", "missing " + ", ".join(absent)), ps)

    predicted = fc.forecast(forecaster, cfg.horizon_s)
    floor_rate = max(rate, predicted.rate_rps)
    sizing = _sizing(obs, cfg, floor_rate)
    need, observed, slo_ms, label = sizing.need, sizing.observed_ms, sizing.slo_ms, sizing.label
    plan = (
        f"predicted {floor_rate:.3g} req/s ({predicted.model})"
        + (f", bursts of {sizing.rate_rps:.3g} req/s," if sizing.rate_rps > floor_rate * 1.05 else "")
        + f" needs {need.load_replicas:.2g} replicas"
        + (f" at batch {need.batch:.0f}" if need.batch else "")
    )
    details = {
        "rate_rps": rate,
        "predicted_rate_rps": floor_rate,
        "needed_replicas": float(need.replicas),
        "load_replicas": need.load_replicas,
        "observed_ms": observed,
        "slo_ms": slo_ms,
    }

    # Latency percentiles lag (a TPOT sample is a whole generation old): a breach acts only while the
    # pool's present backlog or batch still implies a latency above the margin.
    reactive, reactive_why, reactive_code = 0, "", ""
    breach = f"{label} p{cfg.slo.percentile:g} {observed:.0f} ms > {slo_ms:.0f} ms SLO"
    # Replicas shorten only the wait, never a prompt's own service time: prefill acts on the wait part,
    # in proportion (a queue drains faster with more servers). Decode: running sequences stay where they
    # are, so new replicas relieve only new arrivals: one more at a time, the running batch sizes the rest.
    allowed_wait = max(cfg.margin * slo_ms - sizing.service_ms, 0.1 * slo_ms)
    if observed > slo_ms and sizing.now_ms - sizing.service_ms > allowed_wait:
        if obs.pool == Pool.decode:
            ratio_step = current + 1
        else:
            ratio_step = math.ceil(current * (observed - sizing.service_ms) / allowed_wait)
        reactive = min(2 * current, max(current + 1, ratio_step))
        reactive_why, reactive_code = breach, "SLOBreach"
    elif observed > slo_ms:
        plan += f"; {breach} but the present {sizing.now_source} implies {sizing.now_ms:.0f} ms"
    if sizing.now_need > max(reactive, need.replicas, current):
        reactive = sizing.now_need
        reactive_why = f"{obs.running_sequences:.0f} running sequences need {sizing.now_need} replicas"
        reactive_code = "RunningBatch"
    growing = _queue_growing(obs, ps, cfg, current)
    ps = replace(ps, last_queue_tokens=obs.queued_prompt_tokens, last_queue_at_s=obs.at_s)
    if growing and reactive <= current:
        reactive = current + 1
        reactive_why, reactive_code = growing, "QueueGrowing"

    predictive = need.replicas
    if predictive > current:  # a forecast alone moves up only past a tolerance band (the SLO breach does not wait)
        loose = min(cfg.margin * (1 + cfg.up_tolerance), 0.95)
        predictive = max(current, _sizing(obs, cfg, floor_rate, loose).need.replicas)
    if stalled and reactive <= current:
        reactive, reactive_why, reactive_code = current + 1, stalled, "Stalled"
    elif stalled:
        reactive_why = f"{stalled}: {reactive_why}"
    target = min(max(predictive, reactive, limits.min_replicas), limits.max_replicas)
    share = sizing.latency_share
    if arriving and target > current and max(need.replicas, sizing.now_need) <= current:
        why = f"waiting for {ps.target} (ready {r.ready}, starting {r.starting}, draining {r.draining})"
        return _Outcome(_hold(obs, current, "InFlight", why), ps, share)

    if target > current:
        ps = _end_quiet_spell(ps, now_s)
        if ps.last_direction > 0 and now_s - ps.last_change_s < cfg.scale_up_cooldown_s:
            return _Outcome(_hold(obs, current, "Cooldown", f"scaled up {now_s - ps.last_change_s:.0f} s ago; " + plan), ps, share)
        forecast_only = not (reactive > current and reactive_code)
        if forecast_only:
            up_since = now_s if ps.up_since_s is None else ps.up_since_s
            ps = replace(ps, up_since_s=up_since)
            if now_s - up_since < cfg.up_confirm_s:
                why = f"{plan}; confirming for {cfg.up_confirm_s:.0f} s before going up"
                return _Outcome(_hold(obs, current, "Confirming", why, **details), ps, share)
        ps = replace(ps, up_since_s=None)
        code = reactive_code if reactive >= need.replicas and reactive_code else "Forecast"
        why = f"{reactive_why}; {plan}" if reactive_why else plan
        return _Outcome(Decision(obs.pool, current, target, f"{obs.pool} {current}->{target}: {why}", code, details), ps, share)

    ps = replace(ps, up_since_s=None)
    if target == current or current <= limits.min_replicas:
        return _Outcome(_hold(obs, current, "Steady", plan, **details), _end_quiet_spell(ps, now_s), share)

    low_since = now_s if ps.low_since_s is None else ps.low_since_s
    ps = replace(ps, low_since_s=low_since)
    waited = now_s - low_since
    if arriving or r.draining:
        why = f"{plan}; waiting for the last change (starting {r.starting}, draining {r.draining}) before going down"
        return _Outcome(_hold(obs, current, "InFlight", why, **details), ps, share)
    if waited < cfg.stabilization_s:
        why = f"{plan}; stabilizing {waited:.0f}/{cfg.stabilization_s:.0f} s before going down"
        return _Outcome(_hold(obs, current, "Stabilizing", why, **details), ps, share)
    if ps.last_direction < 0 and now_s - ps.last_change_s < cfg.scale_down_cooldown_s:
        why = f"{plan}; stepped down {now_s - ps.last_change_s:.0f} s ago"
        return _Outcome(_hold(obs, current, "Cooldown", why, **details), ps, share)
    if observed > cfg.margin * slo_ms:
        why = f"{label} {observed:.0f} ms is above {cfg.margin:.0%} of the {slo_ms:.0f} ms SLO; {plan}"
        return _Outcome(_hold(obs, current, "NoMargin", why, **details), ps, share)
    # Break-even: of the past quiet spells that outlasted this one so far, the typical one ends too soon
    # for a removed replica to stay away longer than the cold start it costs to bring it back.
    longer = sorted(s for s in ps.quiet_spells_s if s > waited)
    if longer and longer[len(longer) // 2] - waited < cfg.cold_start:
        left = longer[len(longer) // 2] - waited
        why = (f"{plan}; quiet spells this long ended about {left:.0f} s later, within a {cfg.cold_start:.0f} s "
               "cold start: a replica removed now would be wanted back before it paid off")  # fmt: skip
        return _Outcome(_hold(obs, current, "BreakEven", why, **details), ps, share)
    bound = max(target, limits.min_replicas, current - max(1, math.floor(current * cfg.down_step_fraction)))
    desired = next((n for n in range(bound, current) if share(n) <= cfg.margin * cfg.hysteresis), current)
    if desired == current:
        why = f"{current - 1} replicas would run at {share(current - 1):.0%} of the {label} SLO; {plan}"
        return _Outcome(_hold(obs, current, "NoMargin", why, **details), ps, share)
    why = f"{plan}; {desired} replicas keep {label} at {share(desired):.0%} of the SLO"
    return _Outcome(Decision(obs.pool, current, desired, f"{obs.pool} {current}->{desired}: {why}", "ScaleDown", details), ps, share)


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
    if obs.pool in (Pool.prefill, Pool.colocated) and _missing(obs.ttft_ms) and (obs.queued_prompt_tokens or 0) > 0:
        backlog = float(obs.queued_prompt_tokens)  # type: ignore[arg-type]
        implied = 0.0
        if not _missing(prompt) and prompt:
            per_ms = max(obs.replicas.ready, 1) * prompt / cfg.profile.prefill_ms(prompt)
            implied = backlog / per_ms
        ttft = max(implied, 2 * slo.ttft_ms)
        return replace(obs, ttft_ms=ttft), f"{backlog:.0f} prompt tokens wait and none finished in the window"
    if obs.pool in (Pool.decode, Pool.colocated) and _missing(obs.tpot_ms) and (obs.running_sequences or 0) > 0:
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


@dataclass(frozen=True)
class _Sizing:
    need: Need
    observed_ms: float  # the binding latency now
    slo_ms: float
    label: str
    latency_share: Callable[[int], float]  # worst predicted latency / SLO at N replicas
    now_ms: float  # the latency the present backlog (prefill) or batch (decode) implies on the ready replicas
    now_source: str = "load"
    now_need: int = 0  # decode: replicas the running sequences need at the target batch
    service_ms: float = 0.0  # prefill: the service time of a prompt at the SLO percentile (no replica helps)
    rate_rps: float = 0.0  # the rate the pool was sized for


def _sizing(obs: PoolObservation, cfg: PolicyConfig, rate: float, share: float | None = None) -> _Sizing:
    slo, profile = cfg.slo, cfg.profile
    margin = cfg.margin if share is None else share
    prompt = float(obs.prompt_tokens_mean or 0.0)
    prefill_load = PrefillLoad(
        rate_rps=rate,
        prompt_tokens_mean=prompt,
        prompt_tokens_p=float(obs.prompt_tokens_p90 if not _missing(obs.prompt_tokens_p90) else prompt),
        prefix_hit_rate=float(obs.prefix_hit_rate if not _missing(obs.prefix_hit_rate) else 0.0),
    )
    decode_load = DecodeLoad(rate, prompt, float(obs.output_tokens_mean or 0.0))
    if obs.arrival_rate_slices_rps:  # size for the bursts a request meets, not the window's mean
        burst = max(rate, burst_rate(obs.arrival_rate_slices_rps, slo.percentile))
        prefill_load = replace(prefill_load, rate_rps=burst)
        decode_load = replace(decode_load, rate_rps=burst)

    def ttft_share(n: int) -> float:
        return prefill_ttft_ms(profile, n, prefill_load, slo.percentile) / slo.ttft_ms

    def tpot_share(n: int) -> float:
        return decode_tpot_ms(profile, n, decode_load) / slo.tpot_ms

    ready = max(obs.replicas.ready, 1)
    if obs.pool == Pool.prefill:
        need = prefill_need(profile, prefill_load, slo, margin)
        observed = float(obs.ttft_ms)  # type: ignore[arg-type]
        now_ms = observed
        if not _missing(obs.queued_prompt_tokens) and prompt > 0:
            tokens_per_ms = ready * prompt / profile.prefill_ms(prompt)
            now_ms = float(obs.queued_prompt_tokens) / tokens_per_ms + profile.prefill_ms(prefill_load.prompt_tokens_p)  # type: ignore[arg-type]
        service = profile.prefill_ms(prefill_load.prompt_tokens_p * (1 - prefill_load.prefix_hit_rate))
        return _Sizing(
            need, observed, slo.ttft_ms, "TTFT", ttft_share, now_ms, "backlog", service_ms=service,
            rate_rps=prefill_load.rate_rps,
        )  # fmt: skip
    if obs.pool == Pool.decode:
        need = decode_need(profile, decode_load, slo, margin)
        observed = float(obs.tpot_ms)  # type: ignore[arg-type]
        now_ms, now_need = observed, 0
        if not _missing(obs.running_sequences):
            running = float(obs.running_sequences)  # type: ignore[arg-type]
            now_ms = profile.decode_step_ms(running / ready, decode_load.context_tokens)
            now_need = math.ceil(running / max(need.batch, 1.0) - 1e-9)
        return _Sizing(
            need, observed, slo.tpot_ms, "TPOT", tpot_share, now_ms, "batch", now_need, rate_rps=decode_load.rate_rps
        )  # fmt: skip
    p_need = prefill_need(profile, prefill_load, slo, margin)
    d_need = decode_need(profile, decode_load, slo, margin)
    ttft_ratio = float(obs.ttft_ms) / slo.ttft_ms  # type: ignore[arg-type]
    tpot_ratio = float(obs.tpot_ms) / slo.tpot_ms  # type: ignore[arg-type]
    need = p_need if p_need.replicas >= d_need.replicas else d_need
    observed, slo_ms, label = (
        (float(obs.ttft_ms), slo.ttft_ms, "TTFT")  # type: ignore[arg-type]
        if ttft_ratio >= tpot_ratio
        else (float(obs.tpot_ms), slo.tpot_ms, "TPOT")  # type: ignore[arg-type]
    )
    return _Sizing(
        need, observed, slo_ms, label, lambda n: max(ttft_share(n), tpot_share(n)), observed,
        rate_rps=prefill_load.rate_rps,
    )  # fmt: skip


def _queue_growing(obs: PoolObservation, ps: PoolState, cfg: PolicyConfig, current: int) -> str:
    """Why the prefill backlog calls for a replica now ('' if it does not)."""
    q = obs.queued_prompt_tokens
    if obs.pool == Pool.decode or _missing(q) or ps.last_queue_tokens is None or ps.last_queue_at_s is None:
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

"""The policies the simulator compares: tandem's, and what users have today (Dynamo's planner, HPA, static).

- `dynamo`: NVIDIA Dynamo's planner as its docs and code describe it. Throughput mode every 180 s with
  the constant ("last value") load predictor: prefill = max(ceil(demand / engine_rps), ceil(est_ttft /
  ttft_slo)), engine_rps from the profiled prefill time of the (prefix-discounted) mean prompt, no
  queueing; decode = ceil(demand / engine_rps) at the largest batch whose ITL meets the SLO at context
  isl + osl/2. Load mode every 5 s: +1 if any engine's estimated TTFT / ITL exceeds the SLO, -1 only
  if every engine is below 80% of it, never below the throughput bound; no decision while scaling.
  An interval without requests leaves the bound where it was; scale-down does not drain.
- `hpa`: the HorizontalPodAutoscaler's ratio rule `ceil(ready x metric / target)` with its 10%
  tolerance and its missing-pods rule (pods not ready count at 0% of the target going up, 100% going
  down), scale-up limit (double or +4 per 15 s) and 300 s scale-down stabilisation (the largest
  recommendation of the window). Metrics: prefill busy share (target 70%), decode batch per replica
  over the largest batch that meets the TPOT SLO (target 70%).
- `tandem-flips`: tandem's policy with role flips on (a breaching pool borrows warm workers of the other).
- `static-peak` / `static-mean`: fixed pools sized by tandem's capacity model for the trace's peak
  minute or its mean rate.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from tandem.operator.autoscale.core.capacity import (
    DecodeLoad,
    PrefillLoad,
    decode_max_batch,
    decode_need,
    prefill_need,
)
from tandem.operator.autoscale.core.colocated import colocated_need
from tandem.operator.autoscale.core.config import PolicyConfig, PoolLimits
from tandem.operator.autoscale.core.flip import FlipState, decide_with_flips
from tandem.operator.autoscale.core.hpa_rule import hpa_recommendation
from tandem.operator.autoscale.core.policy import PolicyState, decide
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.simulator import Control, Controller, Snapshot
from tandem.profile import Profile
from tandem.slo import Slo
from tandem.trace import TraceRequest

POOLS = (Pool.prefill, Pool.decode)


def _clamp(n: int, limits: PoolLimits) -> int:
    return min(max(n, limits.min_replicas), limits.max_replicas)


def tandem_controller(config: PolicyConfig) -> Controller:
    if config.flip_enabled:
        return _flipping_controller(config)
    state = PolicyState()

    def control(snap: Snapshot) -> dict[Pool, int]:
        nonlocal state
        decisions, state = decide(snap.observations, state, config, snap.at_s)
        return {pool: d.desired for pool, d in decisions.items()}

    return control


def _flipping_controller(config: PolicyConfig) -> Controller:
    """tandem's policy with role flips (operator/autoscale/core/flip.py): counts by role, then the flips."""
    state = FlipState()

    def control(snap: Snapshot) -> Control:
        nonlocal state
        decisions, flips, state = decide_with_flips(snap.observations, state, config, snap.at_s)
        return Control(
            {pool: d.desired for pool, d in decisions.items()},
            tuple((f.source, f.target, f.count) for f in flips),
        )

    return control


@dataclass
class DynamoPlanner:
    profile: Profile
    slo: Slo
    limits: dict[Pool, PoolLimits]
    throughput_interval_s: float = 180.0
    down_share: float = 0.8
    _bound: dict[Pool, int] = field(default_factory=dict)
    _last_throughput_s: float = 0.0
    _rates: list[tuple[float, float, float]] = field(default_factory=list)  # (rate, isl, osl) per load tick

    def __call__(self, snap: Snapshot) -> dict[Pool, int]:
        obs_p, obs_d = snap.observations[Pool.prefill], snap.observations[Pool.decode]
        if obs_p.arrival_rate_rps and obs_p.prompt_tokens_mean and obs_d.output_tokens_mean:
            self._rates.append((obs_p.arrival_rate_rps, obs_p.prompt_tokens_mean, obs_d.output_tokens_mean))
        if snap.at_s - self._last_throughput_s >= self.throughput_interval_s:
            self._throughput()
            self._last_throughput_s = snap.at_s
        return {pool: self._load(pool, snap) for pool in POOLS}

    def _throughput(self) -> None:
        samples, self._rates = self._rates, []
        if not samples:
            return  # no traffic data: the planner keeps its last bound (the zero-traffic stall)
        demand = sum(s[0] for s in samples) / len(samples)  # constant predictor: last interval's mean
        isl = sum(s[1] for s in samples) / len(samples)
        osl = sum(s[2] for s in samples) / len(samples)
        est_ttft = self.profile.prefill_ms(isl)
        engine_rps_p = 1000 / est_ttft
        sla_floor = math.ceil(est_ttft / self.slo.ttft_ms) if est_ttft > self.slo.ttft_ms else 1
        prefill = max(math.ceil(demand / engine_rps_p), sla_floor)
        context = isl + osl / 2
        batch = decode_max_batch(self.profile, context, self.slo.tpot_ms)
        itl_ms = self.profile.decode_step_ms(batch, context)
        engine_rps_d = batch / (osl * itl_ms / 1000)
        decode = math.ceil(demand / engine_rps_d)
        self._bound = {
            Pool.prefill: _clamp(prefill, self.limits[Pool.prefill]),
            Pool.decode: _clamp(decode, self.limits[Pool.decode]),
        }

    def _load(self, pool: Pool, snap: Snapshot) -> int:
        obs = snap.observations[pool]
        r = obs.replicas
        current = r.ready + r.starting
        if r.starting or r.draining:
            return current  # scaling in progress: observe only
        isl = obs.prompt_tokens_mean or 0.0
        if pool == Pool.prefill:
            per_engine = [self.profile.prefill_ms(q + isl) for q in snap.prefill_queued_tokens]
            slo = self.slo.ttft_ms
        else:
            per_engine = [
                self.profile.decode_step_ms(max(n, 1), snap.decode_context_mean) for n in snap.decode_running
            ]
            slo = self.slo.tpot_ms
        desired = current
        if per_engine and max(per_engine) > slo:
            desired = current + 1
        elif per_engine and all(e < self.down_share * slo for e in per_engine):
            desired = current - 1
        desired = max(desired, self._bound.get(pool, 0))
        return _clamp(desired, self.limits[pool])


@dataclass
class Hpa:
    profile: Profile
    slo: Slo
    limits: dict[Pool, PoolLimits]
    target: float = 0.7
    tolerance: float = 0.1
    stabilization_s: float = 300.0
    _history: dict[Pool, deque[tuple[float, int]]] = field(default_factory=dict)

    def __call__(self, snap: Snapshot) -> dict[Pool, int]:
        return {pool: self._one(pool, snap) for pool in POOLS}

    def _metric(self, pool: Pool, snap: Snapshot) -> float | None:
        if pool == Pool.prefill:
            return snap.prefill_busy_share if snap.prefill_queued_tokens else None
        if not snap.decode_running:
            return None
        batch = decode_max_batch(self.profile, snap.decode_context_mean, self.slo.tpot_ms)
        return sum(snap.decode_running) / len(snap.decode_running) / batch

    def _one(self, pool: Pool, snap: Snapshot) -> int:
        r = snap.observations[pool].replicas
        current = r.ready + r.starting
        metric = self._metric(pool, snap)
        recommendation = current
        if metric is not None and r.ready > 0:
            recommendation = hpa_recommendation(r.ready, r.starting, metric, self.target, self.tolerance)
        recommendation = min(recommendation, max(2 * current, current + 4))
        history = self._history.setdefault(pool, deque())
        history.append((snap.at_s, recommendation))
        while history and history[0][0] < snap.at_s - self.stabilization_s:
            history.popleft()
        # Up at once; down only to the largest recommendation of the stabilisation window.
        desired = recommendation if recommendation > current else min(current, max(v for _, v in history))
        return _clamp(desired, self.limits[pool])


def static_sizes(
    trace: list[TraceRequest],
    profile: Profile,
    slo: Slo,
    limits: dict[Pool, PoolLimits],
    margin: float,
    peak: bool,
) -> dict[Pool, int]:
    """Fixed pool sizes for the trace's peak minute (or its mean rate) by the capacity model."""
    if not trace:
        return {p: limits[p].min_replicas for p in POOLS}
    prefill, decode = trace_load(trace, slo, peak)
    p = prefill_need(profile, prefill, slo, margin).replicas
    d = decode_need(profile, decode, slo, margin).replicas
    return {Pool.prefill: _clamp(p, limits[Pool.prefill]), Pool.decode: _clamp(d, limits[Pool.decode])}


def static_colocated_size(
    trace: list[TraceRequest], profile: Profile, slo: Slo, limits: PoolLimits, margin: float, peak: bool
) -> int:
    """Fixed colocated workers for the trace's peak minute (or its mean rate) by the colocated capacity
    model."""
    if not trace:
        return limits.min_replicas
    prefill, decode = trace_load(trace, slo, peak)
    return _clamp(colocated_need(profile, prefill, decode, slo, margin).replicas, limits)


def trace_load(trace: list[TraceRequest], slo: Slo, peak: bool) -> tuple[PrefillLoad, DecodeLoad]:
    """A trace's load at its peak minute's rate (or its mean rate), with its prompt and output lengths."""
    duration = max(trace[-1].arrival_s, 1.0)
    if peak:
        minute = 60.0
        counts: dict[int, int] = {}
        for r in trace:
            counts[int(r.arrival_s // minute)] = counts.get(int(r.arrival_s // minute), 0) + 1
        rate = max(counts.values()) / min(minute, duration)
    else:
        rate = len(trace) / duration
    prompts = sorted(r.input_len for r in trace)
    prompt_mean = sum(prompts) / len(prompts)
    prompt_p = prompts[min(len(prompts) - 1, int(len(prompts) * slo.percentile / 100))]
    output_mean = sum(r.output_len for r in trace) / len(trace)
    return PrefillLoad(rate, prompt_mean, prompt_p), DecodeLoad(rate, prompt_mean, output_mean)


def static_controller(sizes: dict[Pool, int]) -> Controller:
    def control(_: Snapshot) -> dict[Pool, int]:
        return dict(sizes)

    return control

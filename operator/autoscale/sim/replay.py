"""One policy over one trace: build its controller, run the simulator, and summarise it (pure, no I/O)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from tandem.operator.autoscale.core.config import PolicyConfig, PoolLimits
from tandem.operator.autoscale.core.shape import ShapeConfig
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.auto import auto_controller, simulate_auto
from tandem.operator.autoscale.sim.baselines import (
    DynamoPlanner,
    Hpa,
    static_colocated_size,
    static_controller,
    static_sizes,
    tandem_controller,
)
from tandem.operator.autoscale.sim.colocated import simulate_colocated
from tandem.operator.autoscale.sim.flipping import simulate_with_flips
from tandem.operator.autoscale.sim.metrics import percentile
from tandem.operator.autoscale.sim.simulator import Controller, SimConfig, SimResult
from tandem.profile import Profile
from tandem.slo import Slo
from tandem.trace import TraceRequest

POLICIES = ("tandem", "tandem-flips", "dynamo", "hpa", "static-peak", "static-mean")
# Fixed colocated workers for the trace's peak minute (sim/colocated.py), counted as decode replicas.
COLOCATED_POLICIES = ("static-colocated",)
# The shape as the autoscaler's choice (sim/auto.py): the shape rule over tandem's policy, colocated or split.
AUTO_POLICIES = ("auto",)


@dataclass(frozen=True)
class Scenario:
    profile: Profile
    slo: Slo
    limits: dict[Pool, PoolLimits]
    interval_s: float = 15.0
    window_s: float = 60.0
    scrape_s: float = 15.0
    stabilization_s: float = 180.0
    scale_down_cooldown_s: float = 120.0
    margin: float = 0.8
    cold_start_s: float | None = None
    flip_s: float = (
        2.0  # tandem-flips and auto: a drained worker serves its new role this long after the flip
    )
    shape_dwell_s: float = 600.0  # auto: no shape change sooner than this after the last one
    shape_band: float = 0.1  # auto: the other shape must need at most 1 - band of the current one's GPUs


def warm_start(trace: list[TraceRequest], sc: Scenario, first_s: float = 300.0) -> dict[Pool, int]:
    """Every policy starts from the pools its first minutes' mean load needs, as a service already up
    would."""
    head = [r for r in trace if r.arrival_s <= first_s] or trace[:1]
    return static_sizes(head, sc.profile, sc.slo, sc.limits, sc.margin, peak=False)


def build(policy: str, trace: list[TraceRequest], sc: Scenario) -> tuple[Controller, SimConfig]:
    base = SimConfig(
        profile=sc.profile,
        interval_s=sc.interval_s,
        window_s=sc.window_s,
        cold_start_s=sc.cold_start_s,
        scrape_s=sc.scrape_s,
        percentile=sc.slo.percentile,
        initial=warm_start(trace, sc),
        flip_s=sc.flip_s,
    )
    if policy in ("tandem", "tandem-flips", "auto"):
        limits = (
            sc.limits if Pool.colocated in sc.limits else sc.limits | {Pool.colocated: sc.limits[Pool.decode]}
        )
        config = PolicyConfig(
            slo=sc.slo,
            profile=sc.profile,
            limits=limits,
            interval_s=sc.interval_s,
            stabilization_s=sc.stabilization_s,
            scale_down_cooldown_s=sc.scale_down_cooldown_s,
            margin=sc.margin,
            stale_after_s=3 * sc.interval_s,
            cold_start_s=sc.cold_start_s,
            flip_enabled=policy == "tandem-flips",
            flip_s=sc.flip_s,
        )
        if policy == "auto":
            shape = ShapeConfig.from_policy(config, dwell_s=sc.shape_dwell_s, band=sc.shape_band)
            return auto_controller(config, shape), base
        return tandem_controller(config), base
    if policy == "dynamo":
        return DynamoPlanner(sc.profile, sc.slo, sc.limits), replace(base, interval_s=5.0, drain=False)
    if policy == "hpa":
        return Hpa(sc.profile, sc.slo, sc.limits), base
    if policy in ("static-peak", "static-mean"):
        sizes = static_sizes(trace, sc.profile, sc.slo, sc.limits, sc.margin, peak=policy == "static-peak")
        return static_controller(sizes), replace(base, initial=sizes)
    if policy == "static-colocated":
        n = static_colocated_size(trace, sc.profile, sc.slo, sc.limits[Pool.decode], sc.margin, peak=True)
        return static_controller({Pool.decode: n}), replace(base, initial={Pool.decode: n})
    raise ValueError(
        f"unknown policy {policy!r}; choose from {', '.join(POLICIES + COLOCATED_POLICIES + AUTO_POLICIES)}"
    )


def run(policy: str, trace: list[TraceRequest], sc: Scenario) -> tuple[SimResult, dict[str, Any]]:
    controller, config = build(policy, trace, sc)
    simulate = (
        simulate_colocated
        if policy in COLOCATED_POLICIES
        else simulate_auto
        if policy in AUTO_POLICIES
        else simulate_with_flips
    )
    result = simulate(trace, config, controller)
    return result, summarise(policy, result, sc.slo)


def _reversals(actions: list[tuple[float, int, int]]) -> int:
    directions = [1 if to > frm else -1 for _, frm, to in actions if to != frm]
    return sum(1 for a, b in zip(directions, directions[1:], strict=False) if a != b)


def summarise(policy: str, result: SimResult, slo: Slo) -> dict[str, Any]:
    """The JSON fields `tandem simulate` prints; attainment is joint (TTFT and TPOT both within the SLO)."""
    reqs = result.requests
    ttfts = [
        (r.first_token_s - r.arrival_s) * 1000 for r in reqs if r.first_token_s is not None and not r.failed
    ]
    tpots = [
        (r.finish_s - r.first_token_s) / (r.output_len - 1) * 1000
        for r in reqs
        if r.finish_s is not None and r.first_token_s is not None and r.output_len > 1 and not r.failed
    ]
    good = ttft_good = tpot_good = 0
    for r in reqs:
        if r.failed or r.finish_s is None or r.first_token_s is None:
            continue
        ttft_ok = (r.first_token_s - r.arrival_s) * 1000 <= slo.ttft_ms
        tpot_ok = (
            r.output_len <= 1 or (r.finish_s - r.first_token_s) / (r.output_len - 1) * 1000 <= slo.tpot_ms
        )
        good += ttft_ok and tpot_ok
        ttft_good += ttft_ok
        tpot_good += tpot_ok
    hours = result.duration_s / 3600
    gpu_hours = result.gpu_seconds / 3600
    per_pool_reversals = {
        p.value: _reversals(a) / hours if hours else 0.0
        for p, a in result.actions.items()
        if a or p != Pool.colocated  # colocated workers only where the run had them
    }
    return {
        "policy": policy,
        "requests": len(reqs),
        "failed": sum(r.failed for r in reqs),
        "simulated_hours": round(hours, 4),
        "gpu_hours": round(gpu_hours, 4),
        "slo_attainment": round(good / len(reqs), 4) if reqs else math.nan,
        "ttft_attainment": round(ttft_good / len(reqs), 4) if reqs else math.nan,
        "tpot_attainment": round(tpot_good / len(reqs), 4) if reqs else math.nan,
        "ttft_p90_ms": round(percentile(ttfts, 90), 1) if ttfts else None,
        "tpot_p90_ms": round(percentile(tpots, 90), 2) if tpots else None,
        "scaling_actions": sum(len(a) for a in result.actions.values()),
        "flips": sum(n for *_, n in result.flips),
        "flips_per_hour": round(sum(n for *_, n in result.flips) / hours, 2) if hours else 0.0,
        "shape_changes": len(result.shape_changes),
        "shape_changes_per_hour": round(len(result.shape_changes) / hours, 2) if hours else 0.0,
        "reversals_per_hour": round(max(per_pool_reversals.values(), default=0.0), 2),
        "reversals_per_hour_by_pool": {k: round(v, 2) for k, v in per_pool_reversals.items()},
        "goodput_per_gpu_hour": round(good / gpu_hours, 1) if gpu_hours else None,
        "peak_replicas": {
            "prefill": max((p for _, p, _ in result.timeline), default=0),
            "decode": max((d for _, _, d in result.timeline), default=0),
            "colocated": max((c for _, c in result.colocated_timeline), default=0),
        },
    }

"""One case replayed on tandem's own simulator for the autoscaling benchmark (`--referee simulate`): the
policies by the names the Dynamo harness takes, plus fixed colocated workers (`colocated:N`) and the shape as
the autoscaler's choice (`auto`), which Dynamo's replay cannot express (a run there is disaggregated or
aggregated, fixed)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bench._anchor_replay import HPA_POLICY, Case
from tandem.operator.autoscale.core.config import PoolLimits
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.auto import simulate_auto
from tandem.operator.autoscale.sim.baselines import static_controller
from tandem.operator.autoscale.sim.colocated import simulate_colocated
from tandem.operator.autoscale.sim.flipping import simulate_with_flips
from tandem.operator.autoscale.sim.replay import Scenario, build, summarise
from tandem.operator.autoscale.sim.simulator import SimConfig, SimResult
from tandem.profile import profile_named
from tandem.slo import Slo
from tandem.trace import load_trace

TANDEM_POLICY = "module:tandem.operator.autoscale.backends.replay.dynamo.dynamo_policy"
AUTO_POLICY = "auto"
SCENARIO_FIELDS = (
    "margin",
    "stabilization_s",
    "scale_down_cooldown_s",
    "shape_dwell_s",
    "shape_band",
    "flip_s",
)


def scenario(case: Case, options: dict[str, Any]) -> Scenario:
    """The case's engine profile (default: NVIDIA's H200 profile, converted), SLO and cold start, each pool
    within the GPU budget."""
    unknown = set(options) - set(SCENARIO_FIELDS)
    if unknown:
        raise ValueError(
            f"options {sorted(unknown)} are not simulator settings ({', '.join(SCENARIO_FIELDS)})"
        )
    limits = {pool: PoolLimits(1, case.max_gpus - (pool != Pool.colocated)) for pool in Pool}
    sc = Scenario(
        profile_named(case.profile or None),
        Slo(case.slo_ttft_ms, case.slo_tpot_ms, 90.0),
        limits,
        cold_start_s=case.startup_s,
    )
    return replace(sc, **options)


def simulate_once(
    case: Case, policy: str, options: dict[str, Any] | None = None
) -> tuple[dict[str, Any], SimResult]:
    """The summary in the harness's keys (and the shape changes), and the run itself."""
    trace = load_trace(case.trace, "ms")
    sc = scenario(case, options or {})
    kind, _, arg = policy.partition(":")
    if kind == "static":
        p, d = (int(x) for x in arg.split(","))
        sizes = {Pool.prefill: p, Pool.decode: d}
        result = simulate_with_flips(trace, _config(sc, sizes), static_controller(sizes))
    elif kind == "colocated":
        sizes = {Pool.decode: int(arg)}  # sim/colocated.py counts its workers as the decode pool's
        result = simulate_colocated(trace, _config(sc, sizes), static_controller(sizes))
    elif policy in (TANDEM_POLICY, AUTO_POLICY):
        p, d = (int(x) for x in case.init.split(","))
        controller, config = build("tandem" if policy == TANDEM_POLICY else "auto", trace, sc)
        run = simulate_with_flips if policy == TANDEM_POLICY else simulate_auto
        result = run(trace, replace(config, initial={Pool.prefill: p, Pool.decode: d}), controller)
    elif policy == HPA_POLICY or kind == "dynamo":
        raise ValueError(f"--referee simulate runs static, colocated, tandem and auto, not {policy!r}")
    else:
        raise ValueError(f"unknown policy {policy!r}")
    summary = summarise(policy, result, sc.slo)
    return summary, result


def _config(sc: Scenario, initial: dict[Pool, int]) -> SimConfig:
    return SimConfig(
        profile=sc.profile,
        interval_s=sc.interval_s,
        window_s=sc.window_s,
        scrape_s=sc.scrape_s,
        cold_start_s=sc.cold_start_s,
        percentile=sc.slo.percentile,
        initial=initial,
    )


def gpu_timeline(result: SimResult, step_s: float = 300.0) -> list[tuple[float, int]]:
    """GPUs billed (every role) at each tick, one sample per `step_s`: what the day plot draws."""
    colocated = dict(result.colocated_timeline)
    out: list[tuple[float, int]] = []
    for t, p, d in result.timeline:
        if not out or t - out[-1][0] >= step_s:
            out.append((t, p + d + colocated.get(t, 0)))
    return out

"""tandem's simulator as bench.goodput_dynamo's replayer (`--referee simulate`): the same jobs as Dynamo's
replay (a Mooncake JSONL trace, an arrival speed-up, a fixed pool), on NVIDIA's H200 profile as tandem
converts it (`tandem simulate`'s default profile), in this process.

A pool is {"agg": N} (N colocated workers, sim/colocated.py) or {"prefill": P, "decode": D} (split pools,
sim/simulator.py); no cold start, no autoscaler: every worker is up at the first request. `live_auto` runs
the whole autoscaler of `spec.mode: auto` instead (sim/auto.py: the shape rule over the per-pool policy, at
their defaults), its workers within the budget per role (colocated up to N, each split pool up to N - 1),
warm at the first minutes' load, no cold start.
"""

from __future__ import annotations

from pathlib import Path

from bench._goodput_sweep import Latency
from tandem.operator.autoscale.core.config import PoolLimits
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.baselines import static_controller
from tandem.operator.autoscale.sim.colocated import simulate_colocated
from tandem.operator.autoscale.sim.replay import Scenario
from tandem.operator.autoscale.sim.replay import run as run_policy
from tandem.operator.autoscale.sim.simulator import Request, SimConfig, simulate
from tandem.profile import Profile, profile_named
from tandem.slo import Slo
from tandem.trace import TraceRequest, load_trace


def latency(r: Request) -> Latency:
    """What the sweep keeps of a simulated request (unfinished: failed)."""
    done = not r.failed and r.finish_s is not None and r.first_token_s is not None
    if not done:
        return Latency(False, None, None, r.input_len)
    assert r.finish_s is not None and r.first_token_s is not None
    tpot = (r.finish_s - r.first_token_s) / (r.output_len - 1) if r.output_len > 1 else 0.0
    return Latency(True, r.first_token_s - r.arrival_s, tpot, r.input_len)


def sped_up(trace: list[TraceRequest], speedup: float) -> list[TraceRequest]:
    """The trace's arrivals `speedup` times as fast (Dynamo's arrival_speedup_ratio)."""
    return [r._replace(arrival_s=r.arrival_s / speedup) for r in trace]


class SimReplayer:
    """Fixed pools replayed on tandem's simulator, one job at a time (the traces are read once each)."""

    def __init__(self, profile: Profile | None = None):
        self.profile = profile or profile_named(None)
        self.replays = 0
        self._traces: dict[Path, list[TraceRequest]] = {}

    def run(self, trace: Path, speedup: float, pool: dict[str, int]) -> list[Latency]:
        if trace not in self._traces:
            self._traces[trace] = load_trace(trace, "ms")
        reqs = sped_up(self._traces[trace], speedup)
        if "agg" in pool:
            sizes = {Pool.decode: pool["agg"]}  # sim/colocated.py counts its workers as the decode pool's
            run = simulate_colocated
        else:
            sizes = {Pool.prefill: pool["prefill"], Pool.decode: pool["decode"]}
            run = simulate
        config = SimConfig(profile=self.profile, cold_start_s=0.0, initial=sizes)
        result = run(reqs, config, static_controller(sizes))
        self.replays += 1
        return [latency(r) for r in result.requests]

    def live_auto(self, trace: Path, speedup: float, gpus: int, slo: Slo) -> tuple[list[Latency], float, int]:
        """The requests under `spec.mode: auto`'s autoscaler at `slo`, the GPUs it held on average, and its
        shape changes."""
        if trace not in self._traces:
            self._traces[trace] = load_trace(trace, "ms")
        limits = {
            Pool.colocated: PoolLimits(1, gpus),
            Pool.prefill: PoolLimits(1, gpus - 1),
            Pool.decode: PoolLimits(1, gpus - 1),
        }
        result, _ = run_policy(
            "auto",
            sped_up(self._traces[trace], speedup),
            Scenario(self.profile, slo, limits, cold_start_s=0.0),
        )
        self.replays += 1
        return (
            [latency(r) for r in result.requests],
            result.gpu_seconds / result.duration_s,
            len(result.shape_changes),
        )

    def close(self) -> None:
        pass

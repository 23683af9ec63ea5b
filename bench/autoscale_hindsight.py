"""A diurnal day in hindsight: each hour's fewest GPUs that reach the attainment target, known ahead.

    python -m bench.autoscale_hindsight --trace-names conv,code --day-hour-s 600
    python -m bench.autoscale_hindsight --smoke  # hours of 2 s, at most 3 GPUs: runs, measures nothing

Each hour of the day (bench.autoscale_dynamo's diurnal curve, x1 at 04:00 to x8 at 16:00) is replayed on its
own in tandem's simulator (NVIDIA's H200 profile converted) with fixed workers, from warm: the fewest GPUs,
colocated workers or a (P, D) split with up to two decode workers, that reach the joint attainment target
within that hour. The sum is what a policy that holds every hour to the target spends at best, knowing each
hour's traffic ahead, changing shape and count at each hour's edge for free and paying no cold start. (A
fixed pool is judged on the whole day, so it may miss in its busiest hours what its quiet ones make up.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench._smoke import add_smoke, smoke_sizes
from bench._traces import TRACES as TRACE_DIR
from bench.autoscale_dynamo import DAY_HIGH, DAY_LOW
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.baselines import static_controller
from tandem.operator.autoscale.sim.colocated import simulate_colocated
from tandem.operator.autoscale.sim.flipping import simulate_with_flips
from tandem.operator.autoscale.sim.replay import summarise
from tandem.operator.autoscale.sim.simulator import SimConfig
from tandem.profile import profile_named
from tandem.slo import Slo
from tandem.trace import TraceRequest, diurnal, load_trace


def attainment(hour: list[TraceRequest], shape: dict[Pool, int], slo: Slo) -> float:
    """Joint attainment of one hour on fixed workers (`Pool.decode` alone: colocated workers)."""
    config = SimConfig(profile=profile_named(None), percentile=slo.percentile, initial=shape)
    colocated = Pool.prefill not in shape
    run = simulate_colocated if colocated else simulate_with_flips
    return float(summarise("static", run(hour, config, static_controller(shape)), slo)["slo_attainment"])


def fewest(hour: list[TraceRequest], slo: Slo, target: float, max_gpus: int) -> tuple[int, str, float]:
    """The fewest GPUs (colocated first at each count, then splits with one or two decode workers)."""
    for gpus in range(1, max_gpus + 1):
        shapes = [(f"{gpus} colocated", {Pool.decode: gpus})] + [
            (f"{gpus - d}P+{d}D", {Pool.prefill: gpus - d, Pool.decode: d}) for d in (1, 2) if gpus - d >= 1
        ]
        for name, shape in shapes:
            if (a := attainment(hour, shape, slo)) >= target:
                return gpus, name, a
    return max_gpus, "none reaches the target", 0.0


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.autoscale_hindsight", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--traces", default=str(TRACE_DIR), help="folder with the Azure CSVs")
    p.add_argument("--trace-names", default="conv,code")
    p.add_argument("--day-hour-s", type=float, default=600.0, help="each hour of the day's curve this long")
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=50.0)
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--max-gpus", type=int, default=16)
    add_smoke(p)
    a = smoke_sizes(p.parse_args(), trace_names="conv", day_hour_s=2.0, max_gpus=3)
    slo = Slo(a.slo_ttft_ms, a.slo_tpot_ms, 90.0)
    for short in a.trace_names.split(","):
        day = diurnal(
            load_trace(Path(a.traces) / f"azure_llm_2023_{short}.csv"), 24, DAY_LOW, DAY_HIGH, a.day_hour_s
        )
        total = 0
        for h in range(24):
            start = h * a.day_hour_s
            hour = [
                TraceRequest(r.arrival_s - start, r.input_len, r.output_len)
                for r in day
                if start <= r.arrival_s < start + a.day_hour_s
            ]
            gpus, name, reached = fewest(hour, slo, a.target, a.max_gpus)
            total += gpus
            print(
                f"{short} hour {h:02d}: {len(hour) / a.day_hour_s:5.1f} req/s  {name} ({reached:.1%})",
                flush=True,
            )
        print(f"{short} day: {total * a.day_hour_s / 3600:.2f} GPU-h in hindsight, hour by hour", flush=True)


if __name__ == "__main__":
    main()

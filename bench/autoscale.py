"""Autoscaling policies on the Azure traces in the simulator, and the simulator checked against a real stack.

    python -m bench.autoscale                      # every policy on both traces in tandem's own simulator
    python -m bench.autoscale --validate           # + simulator vs a real `tandem up` 1P+1D, three loads
    python -m bench.autoscale --policies tandem,tandem-flips   # role flips off and on, side by side

The replay: each trace's full hour through the discrete-event simulator (`tandem simulate`), every policy from
the same warm start. Capacity comes from Dynamo's measured H200 profile of Llama-3.1-8B-FP8, converted
(`tandem/profiles/h200-llama-3.1-8b-fp8.json`; --prefill-speedup and --decode-speedup rescale it as a
what-if), replicas cold-start in --cold-start-s, SLOs are TTFT / TPOT at p90. The simulator is deterministic,
so one run per policy is the figure (no spread to report); it needs no time compression to run in minutes
(--time-scale is there to stress a policy with a faster trace).

--validate starts a real 1 prefill + 1 decode stack of the tiny model on this machine (CPU, one torch thread
per worker), replays a slice of the conversation trace at three rates (lengths shrunk to what a CPU serves;
200 requests per rate, 3 runs with the rates interleaved, the real stack's own spread beside the error), and
simulates the same requests on the same fixed pools, twice: with the profile as it is, and with the profile
calibrated at idle (one request at a time through the real stack, so the stack's own speed on this host,
router and transport included), which leaves the queueing and batching under load to the simulator. It prints
TTFT and TPOT percentiles of each and whether they agree within 25%. The profile must be measured on the
machine that runs the stack (`tandem profile --model DIR ...`; --profile to pass it), or the agreement only
measures how far two machines differ.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._smoke import add_smoke, smoke_sizes, write_tiny_trace
from bench._traces import TRACES as TRACE_DIR
from tandem.operator.autoscale.core.config import PoolLimits
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.metrics import percentile
from tandem.operator.autoscale.sim.replay import POLICIES, Scenario, run
from tandem.operator.autoscale.sim.simulator import SimConfig, scale_trace, simulate
from tandem.profile import Profile, profile_named, shipped_profile
from tandem.slo import Slo
from tandem.trace import AZURE_ATTRIBUTION, TraceRequest, load_trace

TRACES = ("azure_llm_2023_code.csv", "azure_llm_2023_conv.csv")
AGREEMENT = 0.25


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.autoscale", description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", default=str(TRACE_DIR), help="folder with the Azure CSVs")
    p.add_argument(
        "--profile", help="a `tandem profile` JSON or shipped name (default: Dynamo's H200 data, converted)"
    )
    p.add_argument("--prefill-speedup", type=float, default=1.0)
    p.add_argument("--decode-speedup", type=float, default=1.0)
    p.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=50.0)
    p.add_argument("--cold-start-s", type=float, default=60.0)
    p.add_argument("--max-replicas", type=int, default=32)
    p.add_argument("--stabilization-s", type=float, default=180.0)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--rate-scale", type=float, default=1.0, help="send each request this many times")
    p.add_argument(
        "--interval-s", type=float, default=15.0, help="the policy's interval and the scrape interval"
    )
    p.add_argument(
        "--decode-min", type=int, default=1, help="decode's minReplicas (a spare a flip can borrow)"
    )
    p.add_argument("--flip-s", type=float, default=2.0, help="tandem-flips: a drained worker's role change")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--json", help="also write every row to this file")
    p.add_argument(
        "--validate", action="store_true", help="check the simulator against a real tandem up stack"
    )
    p.add_argument("--validate-requests", type=int, default=200, help="requests per load level")
    p.add_argument(
        "--validate-runs", type=int, default=3, help="runs of every load (the real stack's own spread)"
    )
    add_smoke(p)
    return p


def base_profile(args: argparse.Namespace) -> Profile:
    return profile_named(args.profile)


def replay(args: argparse.Namespace) -> list[dict[str, Any]]:
    profile = base_profile(args).scaled(args.prefill_speedup, args.decode_speedup)
    limits = {
        Pool.prefill: PoolLimits(1, args.max_replicas),
        Pool.decode: PoolLimits(args.decode_min, args.max_replicas),
    }
    sc = Scenario(
        profile,
        Slo(args.slo_ttft_ms, args.slo_tpot_ms, 90),
        limits,
        stabilization_s=args.stabilization_s,
        scale_down_cooldown_s=120.0,
        cold_start_s=args.cold_start_s,
        interval_s=args.interval_s,
        scrape_s=args.interval_s,
        flip_s=args.flip_s,
    )
    rows = []
    for name in TRACES:
        path = Path(args.traces) / name
        if not path.exists():
            print(f"skip {name}: not found in {args.traces}", file=sys.stderr)
            continue
        trace = scale_trace(load_trace(path), args.time_scale, args.rate_scale)
        by_policy = {}
        for policy in args.policies.split(","):
            _, summary = run(policy, trace, sc)
            by_policy[policy] = summary
        for s in by_policy.values():
            s["trace"] = name.removeprefix("azure_llm_2023_").removesuffix(".csv")
            for base in ("dynamo", "hpa", "tandem"):
                if base in by_policy and by_policy[base]["gpu_hours"]:
                    s[f"gpu_hours_vs_{base}"] = round(s["gpu_hours"] / by_policy[base]["gpu_hours"], 2)
            rows.append(s)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| trace | policy | GPU-h | SLO met (joint) | TTFT met | TPOT met | TTFT p90 ms | TPOT p90 ms "
        "| GPU-h vs dynamo | GPU-h vs hpa | GPU-h vs tandem | flips/h | reversals/h (prefill, decode) | "
        "failed |"
    )
    lines = [head, "|" + " --- |" * 14]
    for r in rows:
        rev = r["reversals_per_hour_by_pool"]
        lines.append(
            f"| {r['trace']} | {r['policy']} | {r['gpu_hours']:.2f} | {r['slo_attainment']:.1%} "
            f"| {r['ttft_attainment']:.1%} | {r['tpot_attainment']:.1%} | {r['ttft_p90_ms']:.0f} "
            f"| {r['tpot_p90_ms']:.1f} | {r.get('gpu_hours_vs_dynamo', float('nan')):.2f} "
            f"| {r.get('gpu_hours_vs_hpa', float('nan')):.2f} | "
            f"{r.get('gpu_hours_vs_tandem', float('nan')):.2f} | {r['flips_per_hour']:.1f} | "
            f"{rev['prefill']:.1f}, {rev['decode']:.1f} | {r['failed']} |"
        )
    return "\n".join(lines)


# --- the simulator against a real stack ---------------------------------------------------------------


def validation_trace(n: int, rate_rps: float, traces: str) -> list[TraceRequest]:
    """`n` requests of the conversation trace, lengths shrunk to what a CPU serves, spaced at `rate_rps`
    with the trace's own inter-arrival pattern."""
    source = load_trace(Path(traces) / "azure_llm_2023_conv.csv")[:n]
    span = source[-1].arrival_s or 1.0
    stretch = (n - 1) / rate_rps / span
    return [
        TraceRequest(
            r.arrival_s * stretch, max(8, min(r.input_len // 8, 512)), max(2, min(r.output_len // 8, 48))
        )
        for r in source
    ]


def measure_real(url: str, model_dir: Path, trace: list[TraceRequest]) -> tuple[list[float], list[float]]:
    from tandem.loadgen.prompts import load_vocabulary
    from tandem.loadgen.runner import run_workload
    from tandem.loadgen.workload import RequestSpec

    specs = [RequestSpec(r.arrival_s, r.input_len, r.output_len) for r in trace]
    outcome = asyncio.run(
        run_workload(
            url, "completions", specs, vocab=load_vocabulary(model_dir), timeout_s=300, progress=False
        )
    )
    ttft = [r.ttft_s * 1000 for r in outcome.results if r.ok and r.ttft_s is not None]
    tpot = [r.tpot_s * 1000 for r in outcome.results if r.ok and r.tpot_s is not None]
    return ttft, tpot


def measure_sim(profile: Profile, trace: list[TraceRequest]) -> tuple[list[float], list[float]]:
    result = simulate(trace, SimConfig(profile, cold_start_s=0.0), lambda snap: {})
    ttft = [(r.first_token_s - r.arrival_s) * 1000 for r in result.requests if r.first_token_s is not None]
    tpot = [
        (r.finish_s - r.first_token_s) / (r.output_len - 1) * 1000
        for r in result.requests
        if r.finish_s is not None and r.first_token_s is not None and r.output_len > 1
    ]
    return ttft, tpot


def validate(args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench._stacks import running_stacks, service_object
    from tandem.worker.devtools.tiny import TinySpec, create_tiny_model

    kv_blocks = 1024
    measured = (
        profile_named(args.profile) if args.profile else shipped_profile("tiny-cpu")
    )  # the stack's model
    profile = measured.model_copy(update={"kv_capacity_tokens": kv_blocks * 16})
    rows = []
    with tempfile.TemporaryDirectory(prefix="tandem-autoscale-") as tmp:
        model_dir = create_tiny_model(Path(tmp) / "model", TinySpec())  # the shipped profile's model
        obj = service_object(
            "validate",
            model_dir,
            mode="disaggregated",
            prefill=1,
            decode=1,
            threads=1,
            num_kv_blocks=kv_blocks,
        )
        with running_stacks({"1p1d": obj}, Path(tmp) / "state") as stacks:
            _, url = stacks["1p1d"]
            mean_prompt = (
                sum(r.input_len for r in validation_trace(args.validate_requests, 1.0, args.traces))
                / args.validate_requests
            )
            service_s = profile.prefill_ms(mean_prompt) / 1000
            measure_real(url, model_dir, validation_trace(12, 1.0, args.traces))  # warm-up, not measured
            # Calibrate at idle (one request at a time): the stack's own speed on this host, router and
            # transport included, against the profile's; then check the queueing and batching under load.
            idle = validation_trace(12, 0.4, args.traces)
            idle_real, idle_sim = measure_real(url, model_dir, idle), measure_sim(profile, idle)
            prefill_x = percentile(idle_sim[0], 50) / percentile(idle_real[0], 50)
            decode_x = percentile(idle_sim[1], 50) / percentile(idle_real[1], 50)
            calibrated = profile.scaled(prefill_x, decode_x, note="calibrated at idle against the real stack")
            print(
                f"idle calibration: real prefill x{prefill_x:.2f}, decode x{decode_x:.2f} the profile's "
                "speed",
                flush=True,
            )
            loads = (0.2, 0.4, 0.6)  # offered prefill utilisation by the profile
            traces = {
                load: validation_trace(args.validate_requests, load / service_s, args.traces)
                for load in loads
            }
            real: dict[float, list[tuple[list[float], list[float]]]] = {load: [] for load in loads}
            for _ in range(args.validate_runs):  # loads interleaved, so host noise spreads over all of them
                for load in loads:
                    real[load].append(measure_real(url, model_dir, traces[load]))
            for load in loads:
                rows.append(
                    agreement_row(load, traces[load], real[load], {"sim": profile, "cal": calibrated})
                )
                rows[-1]["calibration"] = {"prefill": round(prefill_x, 3), "decode": round(decode_x, 3)}
                print(json.dumps(rows[-1]), flush=True)
    return rows


def agreement_row(
    load: float,
    trace: list[TraceRequest],
    runs: list[tuple[list[float], list[float]]],
    profiles: dict[str, Profile],
) -> dict[str, Any]:
    """The real stack's percentiles over its runs (median and spread) beside each simulated profile's, and
    whether the simulation lands within 25% of the real median."""
    row: dict[str, Any] = {"load": load, "requests": len(trace), "runs": len(runs)}
    sims = {label: measure_sim(prof, trace) for label, prof in profiles.items()}
    for i, name in enumerate(("ttft", "tpot")):
        for p in (50, 90):
            values = sorted(percentile(run[i], p) for run in runs if run[i])
            if not values:
                continue
            median = values[len(values) // 2]
            row[f"{name}_p{p}_real_ms"] = round(median, 1)
            row[f"{name}_p{p}_real_spread_ms"] = [round(values[0], 1), round(values[-1], 1)]
            for label, sim in sims.items():
                s_v = percentile(sim[i], p)
                row[f"{name}_p{p}_{label}_ms"] = round(s_v, 1)
                row[f"{name}_p{p}_{label}_agrees"] = abs(s_v - median) <= AGREEMENT * median
    return row


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:  # both traces, a few seconds of each
        folder = Path(tempfile.mkdtemp(prefix="tandem-autoscale-smoke-"))
        for name in TRACES:
            write_tiny_trace(folder / name)
        smoke_sizes(args, traces=str(folder))
    rows = replay(args)
    if rows:
        print(markdown(rows))
        source = args.profile or "Dynamo's H200 profile of Llama-3.1-8B-FP8 (converted)"
        print(
            f"\nprofile: {source}, prefill x{args.prefill_speedup:g}, decode x{args.decode_speedup:g}; "
            f"SLO TTFT {args.slo_ttft_ms:g} ms, TPOT {args.slo_tpot_ms:g} ms at p90; cold start "
            f"{args.cold_start_s:g} s; interval and scrape {args.interval_s:g} s; rate x{args.rate_scale:g}; "
            f"decode min {args.decode_min}; flip {args.flip_s:g} s"
        )
        print(f"traces: {AZURE_ATTRIBUTION}")
    checks = validate(args) if args.validate else []
    if args.json:
        Path(args.json).write_text(json.dumps({"replay": rows, "validation": checks}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

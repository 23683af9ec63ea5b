"""`tandem simulate`: replay a request trace through both pools under one or more autoscaling policies (or on
fixed colocated workers, `static-colocated`; or with the shape as the autoscaler's choice, `auto`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tandem.operator.autoscale.core.config import PoolLimits
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.replay import AUTO_POLICIES, COLOCATED_POLICIES, POLICIES, Scenario, run
from tandem.operator.autoscale.sim.simulator import SimResult, scale_trace
from tandem.profile import profile_named
from tandem.slo import Slo
from tandem.trace import attribution_for, load_trace

PROG = "tandem simulate"
COLUMNS = (
    ("policy", "policy", "{}"),
    ("gpu_hours", "GPU-h", "{:.2f}"),
    ("slo_attainment", "SLO met", "{:.1%}"),
    ("ttft_p90_ms", "TTFT p90 ms", "{:.0f}"),
    ("tpot_p90_ms", "TPOT p90 ms", "{:.1f}"),
    ("scaling_actions", "actions", "{}"),
    ("reversals_per_hour", "reversals/h", "{:.1f}"),
    ("flips_per_hour", "flips/h", "{:.1f}"),
    ("shape_changes", "shape changes", "{}"),
    ("goodput_per_gpu_hour", "good req/GPU-h", "{:.0f}"),
    ("failed", "failed", "{}"),
)


KNOWN = POLICIES + COLOCATED_POLICIES + AUTO_POLICIES


def _policies(text: str) -> list[str]:
    names = list(KNOWN) if text == "all" else [p.strip() for p in text.split(",") if p.strip()]
    unknown = [n for n in names if n not in KNOWN]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown)}; choose from {', '.join(KNOWN)} or all"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument(
        "--trace", required=True, help="Azure-style CSV or JSONL (timestamp, input and output lengths)"
    )
    p.add_argument(
        "--policy", type=_policies, default=["tandem"], help=f"{', '.join(KNOWN)}, a comma list, or all"
    )
    p.add_argument(
        "--profile",
        help="a `tandem profile` JSON or a shipped profile name (default: h200-llama-3.1-8b-fp8, Dynamo's "
        "H200 data)",
    )
    p.add_argument(
        "--profile-speedup", type=float, default=1.0, help="what-if: prefill and decode this much faster"
    )
    p.add_argument(
        "--prefill-speedup", type=float, default=1.0, help="what-if: prefill this much faster (again)"
    )
    p.add_argument(
        "--decode-speedup", type=float, default=1.0, help="what-if: decode this much faster (again)"
    )
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="compress the trace's time axis this many times"
    )
    p.add_argument(
        "--rate-scale", type=float, default=1.0, help="send each request this many times (0.5: half)"
    )
    p.add_argument("--limit", type=int, default=None, help="only the first N requests of the trace")
    p.add_argument(
        "--time-unit", choices=["auto", "s", "ms"], default="auto", help="JSONL numeric timestamps"
    )
    p.add_argument("--slo-ttft-ms", type=float, default=500.0)
    p.add_argument("--slo-tpot-ms", type=float, default=50.0)
    p.add_argument("--percentile", type=float, default=90.0)
    p.add_argument("--prefill-min", type=int, default=1)
    p.add_argument("--prefill-max", type=int, default=32)
    p.add_argument("--decode-min", type=int, default=1)
    p.add_argument("--decode-max", type=int, default=32)
    p.add_argument("--interval-s", type=float, default=15.0)
    p.add_argument("--window-s", type=float, default=60.0)
    p.add_argument(
        "--scrape-s",
        type=float,
        default=15.0,
        help="Prometheus' scrape interval: the policy sees counters and gauges as of the last scrape",
    )
    p.add_argument("--stabilization-s", type=float, default=180.0)
    p.add_argument("--scale-down-cooldown-s", type=float, default=120.0)
    p.add_argument("--cold-start-s", type=float, default=None, help="default: the profile's")
    p.add_argument(
        "--flip-s",
        type=float,
        default=2.0,
        help="tandem-flips and auto: a drained worker serves its new role after this",
    )
    p.add_argument(
        "--shape-dwell-s",
        type=float,
        default=600.0,
        help="auto: no shape change sooner than this after the last",
    )
    p.add_argument(
        "--shape-band",
        type=float,
        default=0.1,
        help="auto: change shape only when the other needs at most 1 - this of the current one's GPUs",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per policy")
    p.add_argument("--plot", help="draw replicas and latency against the SLO over time to this PNG")
    return p


def scenario(args: argparse.Namespace) -> Scenario:
    profile = profile_named(args.profile)
    prefill_x, decode_x = (
        args.profile_speedup * args.prefill_speedup,
        args.profile_speedup * args.decode_speedup,
    )
    if (prefill_x, decode_x) != (1.0, 1.0):
        profile = profile.scaled(prefill_x, decode_x)
    return Scenario(
        profile=profile,
        slo=Slo(args.slo_ttft_ms, args.slo_tpot_ms, args.percentile),
        limits={
            Pool.prefill: PoolLimits(args.prefill_min, args.prefill_max),
            Pool.decode: PoolLimits(args.decode_min, args.decode_max),
        },
        interval_s=args.interval_s,
        window_s=args.window_s,
        scrape_s=args.scrape_s,
        stabilization_s=args.stabilization_s,
        scale_down_cooldown_s=args.scale_down_cooldown_s,
        cold_start_s=args.cold_start_s,
        flip_s=args.flip_s,
        shape_dwell_s=args.shape_dwell_s,
        shape_band=args.shape_band,
    )


def table(rows: list[dict[str, Any]]) -> str:
    cells = [[h for _, h, _ in COLUMNS]]
    for row in rows:
        cells.append([fmt.format(row[k]) if row.get(k) is not None else "-" for k, _, fmt in COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in cells
    )


def plot(results: dict[str, SimResult], sc: Scenario, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    for name, res in results.items():
        t = [x[0] / 60 for x in res.timeline]
        axes[0][0].step(t, [x[1] for x in res.timeline], where="post", label=name)
        axes[0][1].step(t, [x[2] for x in res.timeline], where="post", label=name)
        lt = [x[0] / 60 for x in res.latency_timeline]
        axes[1][0].plot(
            lt, [x[1] if x[1] is not None else float("nan") for x in res.latency_timeline], label=name
        )
        axes[1][1].plot(
            lt, [x[2] if x[2] is not None else float("nan") for x in res.latency_timeline], label=name
        )
    axes[1][0].axhline(sc.slo.ttft_ms, color="k", linestyle="--", label="SLO")
    axes[1][1].axhline(sc.slo.tpot_ms, color="k", linestyle="--", label="SLO")
    titles = [
        "prefill replicas",
        "decode replicas",
        f"TTFT p{sc.slo.percentile:g} (ms)",
        f"TPOT p{sc.slo.percentile:g} (ms)",
    ]
    for ax, title in zip([a for row in axes for a in row], titles, strict=True):
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[1][0].set_yscale("log")
    axes[1][1].set_yscale("log")
    axes[1][0].set_xlabel("simulated minutes")
    axes[1][1].set_xlabel("simulated minutes")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not Path(args.trace).is_file():
        print(f"{PROG}: error: {args.trace}: no such trace file", file=sys.stderr)
        return 2
    trace = load_trace(args.trace, args.time_unit)[: args.limit]
    trace = scale_trace(trace, args.time_scale, args.rate_scale)
    sc = scenario(args)
    rows, results = [], {}
    for name in args.policy:
        result, summary = run(name, trace, sc)
        results[name] = result
        rows.append(summary)
        if args.json:
            print(json.dumps(summary), flush=True)
    if not args.json:
        print(table(rows))
        note = attribution_for(args.trace)
        if note:
            print(f"\ntrace: {note}")
    if args.plot:
        plot(results, sc, args.plot)
    return 0

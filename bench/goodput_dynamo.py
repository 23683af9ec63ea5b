"""Where the split wins on a GPU: goodput of aggregated against disaggregated pools at equal GPU count in
Dynamo's own replay, with NVIDIA's H200 profile, on both Azure traces, over bench.goodput's SLO scales.

    python -m bench.goodput_dynamo [--gpus 4] [--rows 6000] [--out bench/out/goodput_dynamo.json]

The referee is NVIDIA Dynamo 1.6.1's offline replay (its mocker engine model in its Rust loop) on its measured
H200 profile of Llama-3.1-8B-Instruct-FP8 (or `--profile FILE`: any tandem profile, e.g. tandem's own engine's
from `tandem profile`, exported in Dynamo's profiler layout), through the harness in `--replay-dir` (its
README sets up the Python that has ai-dynamo; pass it as `--dynamo-python`; tandem need not be installed
there: the replays run in a child process, bench/_dynamo_goodput_replay.py). KV moves between the pools for
free in that model, so the split's cost here is only the prefill pool's GPUs and the extra decode step before
the first token; what it buys is decode steps no prefill lands in.

For each trace (its first `--rows` rows, as Mooncake JSONL) and pool of `--gpus` GPUs (aggregated: that
many workers running both phases; disaggregated: every split into P prefill + D decode workers), the trace
is replayed at a grid of arrival rates (req/s per GPU, the trace's own arrival pattern sped up) until even
the loosest SLO misses. As in bench.goodput, the SLOs are multiples of the idle latencies (the median
request alone, the slower of the two modes on each metric), goodput is the rate where fewer than 90% of
the requests meet both TTFT and TPOT, interpolated on the grid, and two sweeps are reported: both SLOs at
s x idle, and TTFT at 5x idle while the TPOT scale moves. Disaggregated is its best split at each point.
Conditional disaggregation is not expressible in this replay (a pool is either kind); the table instead
shows where tandem's conditional rule sends the trace's prompts. The replay is deterministic: one run.

`spec.mode: auto` on the same GPUs (bench/_goodput_auto.py): at each rate the shape rule
(autoscale/core/shape.py, its capacity model of NVIDIA's profile as tandem converts it, the policy's margin)
chooses colocated or split for the trace's load at each point's SLO, and the table gives its choice at the
goodput and the goodput of the pools it chose, beside the aggregated and the best split. `--referee simulate`
replays the pools on tandem's own simulator instead of Dynamo's (bench/_goodput_sim.py, seconds a replay);
`--smoke` runs tiny traces on it in seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench._goodput_auto import auto_goodput, auto_walk, step_at
from bench._goodput_dynamo_grid import (
    AGGREGATED,
    ATTAINMENT,
    FIXED_TTFT_SCALE,
    Pool,
    best_split,
    cell,
    latencies,
    median_request,
    pools,
    share_local,
    sweep_points,
)
from bench._goodput_dynamo_report import report, write_plot
from bench._goodput_sim import SimReplayer
from bench._goodput_sweep import Goodput, Latency, attainment, goodput
from bench._smoke import add_smoke, smoke_sizes, write_tiny_trace
from bench._trace_shape import slo_from_idle
from bench._traces import TRACES as TRACE_DIR
from tandem.operator.autoscale.core.shape import ShapeConfig
from tandem.profile import profile_named
from tandem.profile_compare import profile_caption
from tandem.profile_dynamo import to_dynamo
from tandem.slo import Slo
from tandem.trace import TraceRequest, load_trace, to_mooncake_jsonl

ROOT = Path(__file__).resolve().parents[1]
TRACES = ("azure_llm_2023_conv.csv", "azure_llm_2023_code.csv")


# --- I/O --------------------------------------------------------------------------------------------------


class Replayer:
    """A child process of the Python that has ai-dynamo, replaying one job at a time."""

    def __init__(self, python: str, replay_dir: str, profile_dir: str | None = None):
        script = Path(__file__).with_name("_dynamo_goodput_replay.py")
        timing = ["--profile-dir", profile_dir] if profile_dir else []
        self.proc = subprocess.Popen(
            # -I: the script's folder stays off sys.path (bench/operator.py would shadow the standard library)
            [python, "-I", str(script), "--harness", replay_dir, *timing],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.replays = 0

    def run(self, trace: Path, speedup: float, pool: Pool) -> list[Latency]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"trace": str(trace), "speedup": speedup, "pool": pool}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the replay process ended (exit {self.proc.wait()}); see its stderr above")
        self.replays += 1
        return latencies(json.loads(line)["requests"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def write_jsonl(requests: list[TraceRequest], path: Path) -> Path:
    path.write_text("\n".join(to_mooncake_jsonl(requests)) + "\n")
    return path


def sweep_pool(
    replayer: Replayer | SimReplayer,
    trace: Path,
    native_rate: float,
    gpus: int,
    pool: Pool,
    grid: list[float],
    loosest: Slo,
) -> Iterator[tuple[float, list[Latency]]]:
    """(rate per GPU, latencies) up the grid, until even the loosest SLO misses the target."""
    for rate in grid:
        reqs = replayer.run(trace, rate * gpus / native_rate, pool)
        yield rate, reqs
        if attainment(reqs, loosest) < ATTAINMENT:
            return


def run_trace(
    replayer: Replayer | SimReplayer, path: Path, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    trace = load_trace(path)[: args.rows or None]
    native_rate = (len(trace) - 1) / (trace[-1].arrival_s - trace[0].arrival_s)
    med = median_request(trace)
    one = write_jsonl([med], tmp / f"{path.stem}-idle.jsonl")
    idle = {}
    for label, pool in ((AGGREGATED, {"agg": 1}), ("disaggregated", {"prefill": 1, "decode": 1})):
        (r,) = replayer.run(one, 1.0, pool)
        idle[label] = Slo.from_seconds(r.ttft_s or 0.0, r.tpot_s or 0.0)
    base = slo_from_idle(list(idle.values()), 1.0, 1.0)
    scales = [float(s) for s in args.scales.split(",")]
    loosest = base.scaled(max(scales + [FIXED_TTFT_SCALE]), max(scales))
    grid = [float(r) for r in args.rates.split(",")]
    jsonl = write_jsonl(trace, tmp / f"{path.stem}.jsonl")
    probes: dict[str, list[tuple[float, list[Latency]]]] = {}
    for label, pool in pools(args.gpus).items():
        probes[label] = list(sweep_pool(replayer, jsonl, native_rate, args.gpus, pool, grid, loosest))
        print(f"{path.name} {label}: {len(probes[label])} rates replayed", file=sys.stderr, flush=True)
    table = {}
    for title, points in sweep_points(scales).items():
        rows = []
        for point in points:
            slo = base.scaled(*point)
            curves = {label: [(r, attainment(q, slo)) for r, q in ps] for label, ps in probes.items()}
            per_pool = {label: goodput(c, ATTAINMENT) for label, c in curves.items()}
            split, best = best_split(per_pool)
            agg = per_pool[AGGREGATED]
            rows.append(
                {
                    "ttft_scale": point[0],
                    "tpot_scale": point[1],
                    "slo_ttft_ms": 1000 * slo.ttft_s,
                    "slo_tpot_ms": 1000 * slo.tpot_s,
                    "aggregated": cell(agg, grid),
                    "disaggregated": cell(best, grid),
                    "split": split,
                    "ratio": best.rate / agg.rate if agg.rate > 0 and best.rate > 0 else None,
                    "per_pool": {k: cell(v, grid) for k, v in per_pool.items()},
                    "curves": curves,
                    "auto": auto_cell(trace, grid, args.gpus, slo, curves, agg, best, split, args.profile),
                }
            )
        table[title] = rows
    if isinstance(replayer, SimReplayer) and args.live_auto_scales:
        for r in table[f"TTFT at {FIXED_TTFT_SCALE:g}x idle, TPOT at s x idle"]:
            if r["tpot_scale"] in [float(x) for x in args.live_auto_scales.split(",")]:
                slo = base.scaled(r["ttft_scale"], r["tpot_scale"])
                r["live_auto"] = live_auto(replayer, jsonl, native_rate, args.gpus, grid, slo)
    return {
        "trace": path.name,
        "rows": len(trace),
        "native_rate": native_rate,
        "median_request": {"input_len": med.input_len, "output_len": med.output_len},
        "idle": {k: {"ttft_ms": 1000 * v.ttft_s, "tpot_ms": 1000 * v.tpot_s} for k, v in idle.items()},
        "share_local": share_local(trace, args.local_prefill_max_tokens),
        "tables": table,
    }


def live_auto(
    replayer: SimReplayer, trace: Path, native_rate: float, gpus: int, grid: list[float], slo: Slo
) -> dict[str, Any]:
    """The autoscaler of `spec.mode: auto` up the grid at one SLO (until it misses): its goodput per budget
    GPU, and the GPUs it held and the shape changes it made at the last rate that met the target."""
    points, held, changes = [], None, None
    for rate in grid:
        reqs, gpus_held, shape_changes = replayer.live_auto(trace, rate * gpus / native_rate, gpus, slo)
        points.append((rate, attainment(reqs, slo)))
        if points[-1][1] < ATTAINMENT:
            break
        held, changes = gpus_held, shape_changes
    g = goodput(points, ATTAINMENT)
    return {"goodput": cell(g, grid), "rate": g.rate, "gpus_held": held, "shape_changes": changes}


def auto_cell(
    trace: list[TraceRequest],
    grid: list[float],
    gpus: int,
    slo: Slo,
    curves: dict[str, list[tuple[float, float]]],
    agg: Goodput,
    best: Goodput,
    best_split_label: str,
    profile: str = "",
) -> dict[str, Any]:
    """`auto` at one SLO: the rule's shape and pool at each rate, its goodput over the pools it chose and
    over its choice of kind alone (a split read as the best split), each with its ratio to the aggregated
    and the best split's."""
    steps = auto_walk(trace, grid, gpus, ShapeConfig(slo=slo, profile=profile_named(profile or None)))
    g = auto_goodput(steps, curves, ATTAINMENT)
    kind = auto_goodput(steps, curves, ATTAINMENT, split_as=best_split_label)
    at = step_at(steps, kind.rate)
    return {
        "goodput": cell(g, grid),
        "kind_goodput": cell(kind, grid),
        "kind_vs_aggregated": kind.rate / agg.rate if agg.rate > 0 and kind.rate > 0 else None,
        "kind_vs_disaggregated": kind.rate / best.rate if best.rate > 0 and kind.rate > 0 else None,
        "pool": at.pool,
        "shape": str(at.shape),
        "reason": at.reason,
        "pools": [s.pool for s in steps],
        "vs_aggregated": g.rate / agg.rate if agg.rate > 0 and g.rate > 0 else None,
        "vs_disaggregated": g.rate / best.rate if best.rate > 0 and g.rate > 0 else None,
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.goodput_dynamo", description=__doc__.splitlines()[0])
    p.add_argument("--dynamo-python", default=sys.executable, help="the Python that has ai-dynamo 1.6.1")
    p.add_argument(
        "--referee",
        choices=["dynamo", "simulate"],
        default="dynamo",
        help="Dynamo's replay, or tandem's own simulator (NVIDIA's profile as tandem converts it)",
    )
    p.add_argument(
        "--live-auto-scales",
        default="1.5,8",
        help="with --referee simulate, also run mode auto's whole autoscaler up the grid at these TPOT "
        "scales (TTFT 5x idle); '' for none",
    )
    add_smoke(p)
    p.add_argument("--replay-dir", default=str(ROOT.parent / "shared" / "tools" / "dynamo-replay"))
    p.add_argument("--traces", type=Path, default=TRACE_DIR, help="folder with the Azure CSVs")
    p.add_argument("--rows", type=int, default=6000, help="replay each trace's first this many rows (0: all)")
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--rates", default="0.5,0.71,1,1.41,2,2.83,4,5.66,8,11.3,16,22.6,32", help="req/s per GPU")
    p.add_argument("--scales", default="1.5,2,3,5,8", help="SLO scales (multiples of the idle latencies)")
    p.add_argument(
        "--local-prefill-max-tokens", type=int, default=512, help="the conditional rule's threshold"
    )
    p.add_argument(
        "--profile",
        default="",
        help="the engine's capacity profile (a file, or a shipped profile's name), exported in Dynamo's "
        "profiler layout to time its mocker; default: NVIDIA's H200 vLLM profile",
    )
    p.add_argument("--out", type=Path, default=Path("bench/out/goodput_dynamo.json"))
    p.add_argument("--from-json", type=Path, help="print the tables of an earlier --out; nothing is replayed")
    p.add_argument(
        "--plot", type=Path, help="draw the goodput curves here (PNG), after a run or from --plot-from"
    )
    p.add_argument(
        "--plot-from",
        type=Path,
        help="a JSON with an --out's traces' tables: draw --plot from it, nothing is replayed",
    )
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.smoke:  # tiny traces on tandem's simulator, 2 GPUs, TPOT at 1.5x and 8x idle, four rates
        folder = Path(tempfile.mkdtemp(prefix="tandem-goodput-dynamo-smoke-"))
        for name in TRACES:
            write_tiny_trace(folder / name)
        smoke_sizes(
            args,
            referee="simulate",
            traces=folder,
            rows=0,
            gpus=2,
            scales="1.5,8",
            rates="1,4,16,64",
            out=folder / "goodput_dynamo.json",
        )
    if args.plot_from:
        if not args.plot:
            raise SystemExit("--plot-from needs --plot FILE")
        print(f"wrote {write_plot(json.loads(args.plot_from.read_text())['traces'], args.plot)}")
        return 0
    if args.from_json:
        print(report(json.loads(args.from_json.read_text())))
        return 0
    with tempfile.TemporaryDirectory(prefix="tandem-goodput-dynamo-") as tmp:
        profile_dir = None
        if args.profile and args.referee != "simulate":
            profile_dir = str(Path(tmp) / "profile")
            to_dynamo(profile_named(args.profile), profile_dir)
        replayer: Replayer | SimReplayer = (
            SimReplayer(profile_named(args.profile or None))
            if args.referee == "simulate"
            else Replayer(args.dynamo_python, args.replay_dir, profile_dir)
        )
        try:
            traces = [run_trace(replayer, args.traces / name, args, Path(tmp)) for name in TRACES]
        finally:
            replayer.close()
    result = {
        "profile": profile_caption(args.profile),
        "traces": traces,
        "replays": replayer.replays,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    print(report(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        print(f"wrote {write_plot(traces, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

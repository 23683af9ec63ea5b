"""Goodput over a sweep of SLO scales: colocated (2 workers) against disaggregated and conditionally
disaggregated (1 prefill + 1 decode each), on both Azure traces.

    python -m bench.goodput [--repeats 3] [--out bench/out/goodput.json] [--png bench/out/goodput.png]

The three stacks run at once on loopback, every worker with the same torch thread count (default 1), so
each side has two single-threaded workers; probes take turns, one at a time, mode after mode at each rate,
so background load drifts over all three alike. Each trace is thinned to each probe's request count (rows
evenly spaced over the whole trace, shifted per repeat), lengths divided by --length-scale and capped, its
inter-arrival pattern stretched to the probed rate. The rates form a grid of multiples of the slower
stack's idle service rate (1 / idle end-to-end latency of the median request); every repeat runs the whole
grid for every mode.

Every request's TTFT and TPOT is kept, so the SLO is applied afterwards: at an SLO scale s, TTFT SLO =
s x the slower idle TTFT and TPOT SLO = s x the slower idle TPOT (idle: the median shaped request, one at a
time), and goodput is the rate where >= 90% of the requests sent stop meeting both, interpolated on the
grid (bench/_goodput_sweep.py). Two sweeps: one scale for both SLOs, and TTFT fixed at 5x while the TPOT
scale moves (where disaggregation pays). The spread is the min-max over repeats.

With --control a fourth stack runs: two more colocated workers, configured like the first pair (an A/A
control). Its ratio to colocated is what the host's noise alone does to a ratio at each point, and the
verdict adds a line that counts a point as a miss only where conditional's median ratio is below both 1
and the control's lowest repeat there, read both ways (a control at 1.25x colocated is colocated at 0.80x
the control).

The host's 1-minute load average is sampled before every probe and the share of its CPUs that processes
other than the benchmark's used is measured over every probe (Linux /proc); both are printed beside the
tables. A probe (or idle measurement) during which other work took more than 10% of the CPUs is run again,
at most --reruns times, and only the last attempt is kept: on a shared host a burst of hypervisor steal
costs a rerun rather than the verdict. When a kept probe still saw more than 10% (where that cannot be read:
when the load average went above --quiet-load, default the CPU count), the verdict lines are withheld: on a
busy host the stacks compete with other work for the cores, and the ratios say more about that than about
the modes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from bench._goodput_report import CONTROL, plot, report
from bench._goodput_sweep import Latency, Probe
from bench._host import CpuMeter, quietly
from bench._smoke import add_smoke, smoke_sizes, write_tiny_trace
from bench._stacks import ModelShape, make_model, run_completions, running_stacks, service_object, wait_idle
from bench._trace_shape import (
    LengthShaping,
    at_rate,
    median_lengths,
    requests_for_rate,
    slo_from_idle,
    thinned,
)
from bench._traces import CODE, CONV
from tandem.loadgen.prompts import Vocabulary, load_vocabulary
from tandem.loadgen.report import percentile
from tandem.loadgen.trace import AZURE_ATTRIBUTION, attribution_for, load_trace
from tandem.loadgen.workload import RequestSpec
from tandem.slo import Slo

ATTAINMENT = 0.9
COLOCATED, DISAGGREGATED, CONDITIONAL = "colocated", "disaggregated", "conditional"
SLO_AWARE = (
    "conditional-slo"  # conditional whose router keeps local prefills off decode workers near its TPOT SLO
)
MODES = (COLOCATED, DISAGGREGATED, CONDITIONAL, SLO_AWARE, CONTROL)
TRACES = (str(CONV), str(CODE))


def idle_latency(url: str, input_len: int, output_len: int, repeat: int, vocab: Vocabulary, seed: int) -> Slo:
    """Median TTFT and TPOT of `repeat` requests sent one after another to an otherwise idle stack."""
    outcome = run_completions(
        url, [RequestSpec(0.0, input_len, output_len)] * repeat, vocab, seed, 60.0, concurrency=1
    )
    ok = [r for r in outcome.results if r.ok]
    if len(ok) != repeat:
        raise RuntimeError(f"idle requests failed at {url}: {[r.error for r in outcome.results if not r.ok]}")
    tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
    return Slo.from_seconds(
        percentile([r.ttft_s for r in ok if r.ttft_s is not None], 50) or 0.0, percentile(tpots, 50) or 0.0
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.goodput", description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, action="append", help=f"repeatable (default: {', '.join(TRACES)})")
    p.add_argument("--length-scale", type=float, default=4.0, help="divide trace lengths by this")
    p.add_argument("--max-input-len", type=int, default=512)
    p.add_argument("--max-output-len", type=int, default=64)
    p.add_argument(
        "--local-prefill-max-tokens",
        type=int,
        default=512,
        help="conditional mode's threshold (default: the spec's, localPrefillMaxTokens 512)",
    )
    p.add_argument(
        "--short-prompt-tokens", type=int, default=32, help="the longest prompt the short-prompt table counts"
    )
    p.add_argument(
        "--prefill-queue-tokens", type=int, default=512, help="conditional mode's saturation bound"
    )
    p.add_argument(
        "--mixed-decode-ratio",
        type=float,
        default=1.0,
        help="conditional mode's mixedDecodeRatio: the prefill worker runs whole requests while it has fewer "
        "than this fraction of the decode worker's streams (0: off)",
    )
    p.add_argument(
        "--stall-free-tokens",
        type=int,
        default=None,
        help="engine.maxPrefillTokensWithDecodes of the --stall-free stacks (default: off)",
    )
    p.add_argument(
        "--stall-free",
        default="conditional",
        help="comma-separated modes whose workers get --stall-free-tokens",
    )
    p.add_argument(
        "--slo-aware-tpot-ms",
        type=float,
        default=None,
        help="add the conditional-slo stack: conditional, its router told this TPOT SLO and "
        "localPrefillMaxTpotFraction --slo-aware-fraction (default: not run)",
    )
    p.add_argument("--slo-aware-fraction", type=float, default=0.8)
    p.add_argument(
        "--control",
        action="store_true",
        help="add a second colocated stack, identical to the first (an A/A control): its ratio to colocated "
        "is what this host's noise alone does to a ratio, and the verdict also reads conditional against it",
    )
    p.add_argument(
        "--rates", default="0.6,1.2,2.4,4", help="probed rates, multiples of the idle service rate"
    )
    p.add_argument("--scales", default="1.5,2,3,5,8", help="SLO scales (multiples of the idle latencies)")
    p.add_argument("--repeats", type=int, default=3, help="runs of the whole rate grid per mode")
    p.add_argument("--idle-repeat", type=int, default=3)
    p.add_argument("--probe-seconds", type=float, default=6.0, help="seconds of arrivals per probe")
    p.add_argument("--min-requests", type=int, default=12)
    p.add_argument("--max-requests", type=int, default=40)
    p.add_argument(
        "--request-timeout", type=float, default=20.0, help="seconds without a byte before a request fails"
    )
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads of every worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--reruns",
        type=int,
        default=2,
        help="times a probe (or idle measurement) is run again while other work took more than 10%% of the "
        "CPUs",
    )
    p.add_argument(
        "--quiet-load",
        type=float,
        default=float(os.cpu_count() or 2),
        help="where other processes' CPU time cannot be read: the highest 1-minute load average "
        "the verdict is called at",
    )
    p.add_argument("--out", type=Path, default=Path("bench/out/goodput.json"), help="results as JSON")
    p.add_argument("--from-json", type=Path, help="print the tables and draw the curves of an earlier --out")
    p.add_argument("--png", type=Path, default=Path("bench/out/goodput.png"), help="the goodput curves")
    add_smoke(p)
    args = p.parse_args(argv)
    if args.smoke:  # one short trace, one rate and scale, results beside it in a folder of its own
        folder = Path(tempfile.mkdtemp(prefix="tandem-goodput-smoke-"))
        smoke_sizes(
            args,
            trace=[write_tiny_trace(folder / "trace.csv", rows=8)],
            out=folder / "goodput.json",
            png=folder / "goodput.png",
            max_input_len=64,
            max_output_len=8,
            rates="1",
            scales="2",
            repeats=1,
            idle_repeat=1,
            probe_seconds=1.0,
            min_requests=2,
            max_requests=3,
            hidden=64,
            layers=2,
            reruns=0,
        )
    return args


def stack_objects(model_dir: Path, args: argparse.Namespace) -> dict[str, dict]:
    common = dict(
        threads=args.threads, num_kv_blocks=2048, max_context=args.max_input_len + args.max_output_len + 64
    )
    conditional = {
        "disaggregation": {
            "mode": "conditional",
            "localPrefillMaxTokens": args.local_prefill_max_tokens,
            "prefillQueueTokens": args.prefill_queue_tokens,
            "mixedDecodeRatio": args.mixed_decode_ratio,
        }
    }
    stall_free = set(args.stall_free.split(",")) if args.stall_free_tokens else set()
    if stall_free - set(MODES):
        raise SystemExit(f"--stall-free: unknown modes {sorted(stall_free - set(MODES))}")

    def engine(mode: str) -> dict:
        return {"maxPrefillTokensWithDecodes": args.stall_free_tokens} if mode in stall_free else {}

    stacks = {
        COLOCATED: service_object(
            "goodput-colo", model_dir, mode="colocated", decode=2, engine=engine(COLOCATED), **common
        ),
        DISAGGREGATED: service_object(
            "goodput-disagg", model_dir, mode="disaggregated", engine=engine(DISAGGREGATED), **common
        ),
        CONDITIONAL: service_object(
            "goodput-cond",
            model_dir,
            mode="disaggregated",
            router=conditional,
            engine=engine(CONDITIONAL),
            **common,
        ),
    }
    if args.control:
        stacks[CONTROL] = service_object(
            "goodput-colo-b", model_dir, mode="colocated", decode=2, engine=engine(CONTROL), **common
        )
    if args.slo_aware_tpot_ms:
        aware = {
            "disaggregation": {
                **conditional["disaggregation"],
                "localPrefillMaxTpotFraction": args.slo_aware_fraction,
            }
        }
        stacks[SLO_AWARE] = service_object(
            "goodput-cond-slo",
            model_dir,
            mode="disaggregated",
            router=aware,
            engine=engine(SLO_AWARE),
            **common,
        )
        stacks[SLO_AWARE]["spec"]["slo"] = {"tpotMs": max(1, round(args.slo_aware_tpot_ms))}
    return stacks


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.from_json:  # the tables and curves again from recorded probes: no stack runs
        result = json.loads(args.from_json.read_text())
        print(report(result))
        print(f"wrote {plot(result, args.png)}")
        return 0
    started = time.monotonic()
    traces = args.trace or [Path(t) for t in TRACES]
    shaping = LengthShaping(args.length_scale, args.max_input_len, args.max_output_len)
    multipliers = [float(x) for x in args.rates.split(",")]
    seeds = itertools.count(args.seed * 1000)
    loaded = [(path, load_trace(path)) for path in traces]  # a missing trace fails before any stack starts
    per_trace = []
    loads: list[float] = [os.getloadavg()[0]]
    host: dict[str, list] = {
        "foreign_cpu_share": [],
        "steal_cpu_share": [],
        "interrupt_cpu_share": [],
        "rerun": [],
    }
    with tempfile.TemporaryDirectory(prefix="tandem-goodput-") as tmp:
        model_dir = make_model(Path(tmp) / "model", ModelShape(args.hidden, args.layers))
        vocab = load_vocabulary(model_dir)
        with running_stacks(stack_objects(model_dir, args), Path(tmp) / "logs") as running:
            for path, trace in loaded:
                per_trace.append(
                    sweep_trace(path, trace, running, shaping, multipliers, vocab, seeds, args, loads, host)
                )
    result = {
        "attainment_target": ATTAINMENT,
        "scales": [float(s) for s in args.scales.split(",")],
        "traces": per_trace,
        "config": {
            **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "trace"},
            "traces": [str(t) for t in traces],
            "model": vars(ModelShape(args.hidden, args.layers).tiny_spec()),
        },
        "trace_attribution": attribution_for(traces[0]) or AZURE_ATTRIBUTION,
        "wall_s": time.monotonic() - started,
        "load_average": loads,
        **host,
    }
    print(report(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} and {plot(result, args.png)}")
    return 0


def sweep_trace(
    path: Path,
    trace: list[RequestSpec],
    running: dict,
    shaping: LengthShaping,
    multipliers: list[float],
    vocab: Vocabulary,
    seeds,
    args: argparse.Namespace,
    loads: list[float],
    host: dict[str, list],
) -> dict:
    """Idle latencies, then every repeat of the rate grid, mode after mode, on one trace."""
    med_in, med_out = median_lengths(thinned(trace, min(len(trace), 1000), shaping))
    for _, url in running.values():  # warm up at this trace's lengths: first calls pay for lazy init
        run_completions(
            url, [RequestSpec(0.0, med_in, med_out)] * 2, vocab, next(seeds), args.request_timeout
        )

    def meter() -> CpuMeter:
        return CpuMeter(
            lambda: [os.getpid(), *(p.pid for s, _ in running.values() for p in s.running.values())]
        )

    def measured(what: str, measure, before=lambda: None):
        """`measure()` run again while other work disturbed it; its host shares (and the reruns') kept."""
        result, shares, discarded = quietly(measure, meter, args.reruns, before=before)
        for key, value in shares.items():
            host[key].append(value)
        host["rerun"] += [{"what": what, **d} for d in discarded]
        for d in discarded:
            print(f"  rerun {what}: other work took {d['foreign_cpu_share']:.0%} of the CPUs", flush=True)
        return result

    idle = {
        mode: measured(
            f"idle {mode}",
            lambda url=url: idle_latency(url, med_in, med_out, args.idle_repeat, vocab, next(seeds)),
        )
        for mode, (_, url) in running.items()
    }
    base = slo_from_idle(
        [s for m, s in idle.items() if m != CONTROL], 1.0, 1.0
    )  # the control leaves the SLO as it is
    service_rate = 1.0 / (base.ttft_s + max(0, med_out - 1) * base.tpot_s)
    rates = [round(m * service_rate, 3) for m in multipliers]
    print(
        f"{path.name}: median {med_in} in / {med_out} out; idle "
        + ", ".join(
            f"{m} TTFT {1000 * s.ttft_s:.0f} ms TPOT {1000 * s.tpot_s:.1f} ms" for m, s in idle.items()
        )
        + f"; rates {rates} req/s",
        flush=True,
    )
    probes: list[Probe] = []
    for repeat in range(args.repeats):
        shift = repeat / args.repeats
        for rate in rates:
            n = requests_for_rate(rate, args.probe_seconds, args.min_requests, args.max_requests)
            specs = at_rate(thinned(trace, n, shaping, shift), rate)
            modes = [m for m in MODES if m in running]
            order = modes[repeat % len(modes) :] + modes[: repeat % len(modes)]
            for mode in order:
                stack, url = running[mode]

                def settle(stack=stack):
                    wait_idle(stack)
                    loads.append(os.getloadavg()[0])

                outcome = measured(
                    f"{mode} at {rate} req/s",
                    lambda url=url, specs=specs: run_completions(
                        url, specs, vocab, next(seeds), args.request_timeout
                    ),
                    before=settle,
                )
                probe = Probe(
                    mode,
                    repeat,
                    rate,
                    tuple(Latency(r.ok, r.ttft_s, r.tpot_s, r.input_len) for r in outcome.results),
                )
                probes.append(probe)
                failed = sum(not r.ok for r in probe.requests)
                print(
                    f"  repeat {repeat} {mode:<13} rate {rate:6.3f} req/s n={n:<3} failed {failed}",
                    flush=True,
                )
    return {
        "trace": path.name,
        "median_input_len": med_in,
        "median_output_len": med_out,
        "trace_rows": len(trace),
        "idle": {m: {"ttft_s": s.ttft_s, "tpot_s": s.tpot_s} for m, s in idle.items()},
        "slo_base": {"ttft_s": base.ttft_s, "tpot_s": base.tpot_s},
        "rates": rates,
        "probes": [asdict(p) for p in probes],
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Idle TTFT and TPOT, disaggregated (1 prefill + 1 decode) against colocated (1 worker), in one run.

    python -m bench.disagg_idle [--runs 3] [--requests 8] [--prompt-len 256] [--max-tokens 64] [--out r.json]

Both stacks run at once on loopback with the same model and torch thread count per worker. One request at a
time, alternating stacks (the order flips every request, so background load drifting over the run hits both
alike), each a fresh random prompt of exactly --prompt-len token ids, streamed, timed at the client. A run
reports each stack's median TTFT and TPOT and their ratios; --runs runs give the spread (min-max). A
disaggregated request pays the reservation, the KV push and one more hop before its first token (the TTFT
overhead); once its KV has arrived its decode worker should decode as fast as a colocated worker (the TPOT
ratio, target <= 1.05).

Beside the wall clock, each run counts the CPU time every process of both stacks spent per output token
(from /proc): a per-token cost on the disaggregated path shows there even when a busy host blurs the clock.
The host's load average, and the share of its CPUs that other processes used during the run, are printed
beside every run: on a shared host the ratio is what counts, and the verdict is withheld when other
processes used more than 10% of the CPUs in any run (where /proc cannot tell, when the 1-minute load
average exceeded --quiet-load, default the CPU count: the benchmark's own processes count there too).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from bench._host import CpuMeter, busy_reason, load_average
from bench._smoke import add_smoke, smoke_sizes
from bench._stacks import (
    ModelShape,
    make_model,
    median,
    round_order,
    running_stacks,
    service_object,
    timed_round,
    vocab_size,
    warm_up,
)

COLOCATED, DISAGGREGATED = "colocated", "disaggregated"
TPOT_TARGET = 1.05


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux /proc; 0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stack_cpu(running: dict) -> dict[str, dict[str, float]]:
    """CPU seconds so far of every process of every stack: {stack: {process name: seconds}}."""
    return {
        mode: {name: cpu_seconds(proc.pid) for name, proc in stack.running.items()}
        for mode, (stack, _) in running.items()
    }


def cpu_per_token(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], tokens: dict[str, int]
) -> dict:
    """CPU milliseconds per output token of each stack's processes between two readings (pure)."""
    return {
        mode: {
            name: round(1000 * (after[mode][name] - before[mode].get(name, 0.0)) / max(1, tokens[mode]), 3)
            for name in after[mode]
        }
        for mode in after
    }


def run_summary(ttft: dict[str, list[float]], tpot: dict[str, list[float]], loads: list[float]) -> dict:
    """One run: medians per stack (ms), disaggregated / colocated ratios, the load averages seen (pure)."""
    med_ttft = {m: 1000 * median(v) for m, v in ttft.items()}
    med_tpot = {m: 1000 * median(v) for m, v in tpot.items()}
    return {
        "ttft_ms": med_ttft,
        "tpot_ms": med_tpot,
        "ttft_overhead_ms": med_ttft[DISAGGREGATED] - med_ttft[COLOCATED],
        "tpot_ratio": med_tpot[DISAGGREGATED] / med_tpot[COLOCATED],
        "ttft_ratio": med_ttft[DISAGGREGATED] / med_ttft[COLOCATED],
        "load_average": [round(x, 2) for x in loads],
    }


def verdict(runs: list[dict], quiet_load: float, target: float = TPOT_TARGET) -> str:
    """Met / missed on the worst run's TPOT ratio, or no verdict when any run saw a busy host (pure)."""
    busy = busy_reason(
        [x for r in runs for x in r["load_average"]], [r.get("foreign_cpu_share") for r in runs], quiet_load
    )
    if busy:
        return f"no verdict: {busy}; rerun on a quiet host"
    worst = max(r["tpot_ratio"] for r in runs)
    verdict = "met" if worst <= target else "MISSED"
    return f"TPOT disaggregated / colocated <= {target:.2f} in every run: {verdict} (worst {worst:.3f})"


def _share(share: float | None) -> str:
    return "unknown" if share is None else f"{share:.0%}"


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    """median (min-max) of `values`."""
    return f"{fmt.format(median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.disagg_idle", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--requests", type=int, default=8, help="timed requests per stack per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed requests per stack first")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--transport", default="auto", help="the disaggregated stack's kvTransfer.transport")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads of every worker")
    p.add_argument(
        "--quiet-load",
        type=float,
        default=float(os.cpu_count() or 2),
        help="where other processes' CPU time cannot be read: the highest 1-minute load average "
        "a verdict is called at",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    add_smoke(p)
    return smoke_sizes(
        p.parse_args(argv), runs=1, requests=1, warmup=0, prompt_len=16, max_tokens=3, hidden=64, layers=2
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    shape = ModelShape(args.hidden, args.layers)
    rng = random.Random(args.seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tandem-idle-") as tmp:
        model_dir = make_model(Path(tmp) / "model", shape)
        vocab = vocab_size(model_dir)
        blocks = 4 * (args.prompt_len + args.max_tokens) // 16 + 64
        common = dict(
            threads=args.threads, num_kv_blocks=blocks, max_context=args.prompt_len + args.max_tokens + 64
        )
        objects = {
            COLOCATED: service_object("idle-colo", model_dir, mode="colocated", **common),
            DISAGGREGATED: service_object(
                "idle-disagg", model_dir, mode="disaggregated", transport=args.transport, **common
            ),
        }
        runs = []
        with running_stacks(objects, Path(tmp) / "logs") as running:
            modes = list(objects)
            warm_up(running, args.warmup, args.prompt_len, args.max_tokens, rng, vocab)
            for run in range(args.runs):
                ttft: dict[str, list[float]] = {m: [] for m in modes}
                tpot: dict[str, list[float]] = {m: [] for m in modes}
                loads = [load_average()]
                tokens = dict.fromkeys(modes, 0)
                cpu_before = stack_cpu(running)
                meter = CpuMeter(
                    lambda: [os.getpid(), *(p.pid for s, _ in running.values() for p in s.running.values())]
                ).start()
                for i in range(args.requests):
                    # two stacks: the order flips every request
                    for mode, t in timed_round(
                        running, round_order(modes, i + run), args.prompt_len, args.max_tokens, rng, vocab
                    ).items():
                        if t.tpot_s is None:
                            raise RuntimeError(
                                f"{mode}: one token came back; --max-tokens must be at least 2"
                            )
                        ttft[mode].append(t.ttft_s)
                        tpot[mode].append(t.tpot_s)
                        tokens[mode] += args.max_tokens
                loads.append(load_average())
                runs.append(run_summary(ttft, tpot, loads))
                r = runs[-1]
                r["cpu_ms_per_token"] = cpu_per_token(cpu_before, stack_cpu(running), tokens)
                r["foreign_cpu_share"] = meter.share()
                print(
                    f"  run {run}: TTFT colocated {r['ttft_ms'][COLOCATED]:.1f} ms, disaggregated "
                    f"{r['ttft_ms'][DISAGGREGATED]:.1f} ms; TPOT {r['tpot_ms'][COLOCATED]:.2f} / "
                    f"{r['tpot_ms'][DISAGGREGATED]:.2f} ms = {r['tpot_ratio']:.3f}; load "
                    f"{r['load_average']}, other processes {_share(r['foreign_cpu_share'])} of the CPUs; "
                    f"CPU ms per token {r['cpu_ms_per_token']}",
                    flush=True,
                )
    result = {
        "runs": runs,
        "verdict": verdict(runs, args.quiet_load),
        "config": {
            **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "model": vars(shape.tiny_spec()),
        },
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(report(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def report(result: dict) -> str:
    cfg, runs = result["config"], result["runs"]

    def col(key: str, mode: str) -> list[float]:
        return [r[key][mode] for r in runs]

    lines = [
        f"Idle latency, disaggregated (1 prefill + 1 decode, KV over {cfg['transport']}) vs colocated (1 "
        f"worker): {cfg['prompt_len']}-token prompts, {cfg['max_tokens']} tokens out, {cfg['requests']} "
        f"requests per stack per run, {len(runs)} runs, median (min-max) over runs; hidden {cfg['hidden']}, "
        f"{cfg['layers']} layers, {cfg['threads']} torch thread(s) per worker",
        "",
        "| | colocated | disaggregated | disaggregated / colocated |",
        "| --- | --- | --- | --- |",
        f"| TTFT, ms | {spread(col('ttft_ms', COLOCATED), '{:.1f}')} | "
        f"{spread(col('ttft_ms', DISAGGREGATED), '{:.1f}')} | {spread([r['ttft_ratio'] for r in runs])} "
        f"(+{spread([r['ttft_overhead_ms'] for r in runs], '{:.1f}')} ms) |",
        f"| TPOT, ms | {spread(col('tpot_ms', COLOCATED), '{:.2f}')} | "
        f"{spread(col('tpot_ms', DISAGGREGATED), '{:.2f}')} | {spread([r['tpot_ratio'] for r in runs])} |",
        "",
        "CPU ms per output token, per process (median (min-max) over runs): "
        + "; ".join(
            f"{mode} {name} {spread([r['cpu_ms_per_token'][mode][name] for r in runs], '{:.2f}')}"
            for mode in runs[0]["cpu_ms_per_token"]
            for name in runs[0]["cpu_ms_per_token"][mode]
        ),
        "load average (1 min) at the start and end of each run: "
        + "; ".join(str(r["load_average"]) for r in runs)
        + "; CPU share other processes used, per run: "
        + ", ".join(_share(r.get("foreign_cpu_share")) for r in runs),
        result["verdict"],
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

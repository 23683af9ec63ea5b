"""The first request after every worker is Ready against the steady state, on the README's local stack.

    python -m bench.first_request [--runs 3] [--steady 10] [--max-tokens 16] [--out r.json]

Each run starts a fresh `tandem up` with the README's spec (examples/tiny.yaml: mutual TLS, one prefill and
one decode worker, the tiny random model), waits until the router routes to both workers, then sends one
streamed request and --steady identical ones after it. TTFT is timed at the client. A run reports the first
TTFT, the median steady TTFT and their ratio (the target: 1.5x or less), how long the stack took to be
routable and each worker's start-up phases (as tandem_worker_startup_seconds has them), so a slow start and a
cold first request are told apart. --runs runs give the spread (median, min-max).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench._smoke import add_smoke, smoke_sizes
from bench.wake_from_zero import START_TIMEOUT_S, first_token, spread, wait_for
from tandem.testing.local_up import launch, routable

README_SPEC = Path(__file__).resolve().parent.parent / "examples" / "tiny.yaml"


def stack_spec(model_dir: Path) -> dict:
    """The README's spec, with the model where this bench keeps it."""
    spec = yaml.safe_load(README_SPEC.read_text())
    spec["spec"]["model"]["source"]["path"] = str(model_dir)
    return spec


STARTED = re.compile(r"started: weights loaded in ([\d.]+) s, warmed up in ([\d.]+) s")


def startup_phases(log_dir: Path) -> dict[str, dict[str, float]]:
    """Each worker's start-up phases as its log states them (pool -> phase -> seconds): the same figures as
    its tandem_worker_startup_seconds gauge."""
    out: dict[str, dict[str, float]] = {}
    for path in sorted(log_dir.glob("*-0.log")):
        if m := STARTED.search(path.read_text(errors="replace")):
            out[path.stem.rsplit("-", 1)[0]] = {"load": float(m.group(1)), "warmup": float(m.group(2))}
    return out


def one_run(work: Path, model_dir: Path, steady: int, max_tokens: int) -> dict:
    """A fresh stack: wait for both workers to be routable, then the first request and `steady` after it."""
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    started = time.monotonic()
    up, url = launch(stack_spec(model_dir), run_dir, "--create-tiny")
    try:
        wait_for(
            "both workers routable",
            lambda: up.poll() is not None or (routable(url, "prefill") >= 1 and routable(url, "decode") >= 1),
            START_TIMEOUT_S,
        )
        if up.poll() is not None:
            raise RuntimeError((run_dir / "tandem-up.log").read_text()[-2000:])
        ready_s = time.monotonic() - started
        first_ms, _ = first_token(url, max_tokens)
        steady_ms = [first_token(url, max_tokens)[0] for _ in range(steady)]
        phases = startup_phases(run_dir / "logs")
    finally:
        up.terminate()
        up.wait(timeout=60)
    median = statistics.median(steady_ms)
    return {
        "ready_s": ready_s,
        "first_ttft_ms": first_ms,
        "steady_ttft_ms": median,
        "ratio": first_ms / median,
        **phases,
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.first_request", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steady", type=int, default=10, help="identical requests after the first")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--out", default=None, help="write the runs as JSON here")
    add_smoke(p)
    return smoke_sizes(p.parse_args(argv), runs=1, steady=1, max_tokens=2)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tandem-first-request-"))
    runs = []
    for i in range(args.runs):
        run = one_run(work, work / "model", args.steady, args.max_tokens)
        runs.append(run)
        print(
            f"run {i + 1}: first TTFT {run['first_ttft_ms']:.1f} ms, steady {run['steady_ttft_ms']:.1f} ms, "
            f"ratio {run['ratio']:.2f}; routable {run['ready_s']:.1f} s after start; start-up phases "
            f"{json.dumps(run.get('prefill', {}))} (prefill) {json.dumps(run.get('decode', {}))} (decode)",
            flush=True,
        )
    col = {k: [r[k] for r in runs] for k in ("first_ttft_ms", "steady_ttft_ms", "ratio")}
    print(
        f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {args.runs} runs, "
        "median (min-max)"
    )
    print("| README stack, CPU | first TTFT, ms | steady TTFT, ms | first / steady |")
    print("| --- | --- | --- | --- |")
    print(
        f"| tiny model, `tandem up`, mTLS | {spread(col['first_ttft_ms'], '{:.1f}')} | "
        f"{spread(col['steady_ttft_ms'], '{:.1f}')} | {spread(col['ratio'], '{:.2f}')}x |"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""First-request TTFT from zero against warm, side by side in one run of `tandem up` on the tiny model.

    python -m bench.wake_from_zero [--runs 3] [--warm 3] [--max-tokens 16] [--out r.json]

Starts `tandem up --create-tiny` with both pools at `minReplicas: 0` and the autoscaler ticking every second.
Each run waits until both pools are back at zero (the autoscaler's idle rule), sends one streamed request
(held by the router while the autoscaler starts a prefill and a decode worker: the cold start), then
--warm requests to the pools it woke. TTFT is timed at the client; the router's X-Tandem-Cold-Start-Ms says
how much of the first TTFT was the wait for the workers. A run reports the cold TTFT, the median warm TTFT
and their ratio; --runs runs give the spread (median, min-max). The host's load average is printed beside
the table: worker start-up is CPU-bound (torch import, model load), so a busy host lengthens the cold start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench._smoke import add_smoke, smoke_sizes
from tandem import names
from tandem.testing.local_up import launch, routable_workers

START_TIMEOUT_S = 300.0


def stack_spec(model_dir: Path) -> dict:
    pool = {"replicas": 0, "minReplicas": 0, "maxReplicas": 1, "resources": {"gpus": 0}}
    return {
        "apiVersion": "serving.tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "wake"},
        "spec": {
            "model": {"source": {"path": str(model_dir)}, "servedName": "tiny", "dtype": "float32"},
            "prefill": dict(pool),
            "decode": dict(pool),
            "engine": {"numKvBlocks": 512, "threads": 1},
            "autoscaling": {
                "enabled": True,
                "intervalSeconds": 1,
                "windowSeconds": 4,
                "stabilizationSeconds": 4,
                "scaleUpCooldownSeconds": 0,
                "scaleDownCooldownSeconds": 1,
            },
        },
    }


def wait_for(what: str, check, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.25)


def first_token(url: str, max_tokens: int) -> tuple[float, float | None]:
    """One streamed chat request: (client TTFT in ms, the router's X-Tandem-Cold-Start-Ms or None)."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    start = time.perf_counter()
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, timeout=START_TIMEOUT_S, trust_env=False
    ) as r:
        if r.status_code != 200:
            raise RuntimeError(f"router answered {r.status_code}: {r.read().decode()[:300]}")
        cold = r.headers.get(names.COLD_START_HEADER)
        ttft = None
        for line in r.iter_lines():  # to the end: the next request finds the pools idle again
            if ttft is None and line.startswith("data: {") and '"content"' in line:
                ttft = (time.perf_counter() - start) * 1000
    if ttft is None:
        raise RuntimeError("no token came back")
    return ttft, float(cold) if cold is not None else None


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.wake_from_zero", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warm", type=int, default=3, help="warm requests per run")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--out", default=None, help="write the runs as JSON here")
    add_smoke(p)
    return smoke_sizes(p.parse_args(argv), runs=1, warm=1, max_tokens=2)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tandem-wake-bench-"))
    up, url = launch(stack_spec(work / "model"), work, "--create-tiny")
    runs = []
    try:
        wait_for("the router", lambda: _healthy(url) or up.poll() is not None, START_TIMEOUT_S)
        if up.poll() is not None:
            raise RuntimeError((work / "tandem-up.log").read_text()[-2000:])
        for i in range(args.runs):
            wait_for("both pools at zero", lambda: not any(routable_workers(url).values()), START_TIMEOUT_S)
            cold_ms, held_ms = first_token(url, args.max_tokens)
            warm = [first_token(url, args.max_tokens)[0] for _ in range(args.warm)]
            run = {
                "cold_ttft_ms": cold_ms,
                "cold_start_header_ms": held_ms,
                "warm_ttft_ms": statistics.median(warm),
            }
            run["ratio"] = cold_ms / run["warm_ttft_ms"]
            runs.append(run)
            print(
                f"run {i + 1}: cold TTFT {cold_ms:.0f} ms (held {held_ms} ms), warm TTFT "
                f"{run['warm_ttft_ms']:.1f} ms",
                flush=True,
            )
    finally:
        up.terminate()
        up.wait(timeout=30)
    col = {k: [r[k] for r in runs] for k in ("cold_ttft_ms", "cold_start_header_ms", "warm_ttft_ms", "ratio")}
    print(
        f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {args.runs} runs, median "
        "(min-max)"
    )
    print("| first request TTFT, ms | from zero | warm | from zero / warm |")
    print("| --- | --- | --- | --- |")
    print(
        f"| tiny model, `tandem up`, CPU | {spread(col['cold_ttft_ms'])} (held "
        f"{spread(col['cold_start_header_ms'])}) | {spread(col['warm_ttft_ms'], '{:.1f}')} | "
        f"{spread(col['ratio'], '{:.0f}')}x |"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(runs, indent=2))
    return 0


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

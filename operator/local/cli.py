"""`tandem up -f SPEC.yaml`: run an InferenceService as router and worker processes on this machine
(operator/local/stack.py). With `--demo`, one streamed chat request is sent once the stack is up, its TTFT
and TPOT printed, and the stack stopped again.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tandem.context_limit import beyond_model
from tandem.loadgen.client import stream_chunks
from tandem.operator.local.plan import model_dir
from tandem.operator.local.stack import LocalStack, serving
from tandem.spec import InferenceService, load_file


def demo(router_url: str, model: str, prompt: str, max_tokens: int) -> dict[str, float]:
    """Stream one chat completion to stdout; return its TTFT and TPOT in milliseconds."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    arrivals: list[float] = []
    tokens = 0
    print(f"\n> {prompt}\n", flush=True)
    with httpx.stream("POST", f"{router_url}/v1/chat/completions", json=body, timeout=120) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"router answered {resp.status_code}: {resp.read().decode()}")
        for chunk in stream_chunks(resp.iter_lines()):
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                text = choice.get("delta", {}).get("content")
                if text:
                    arrivals.append(time.perf_counter())
                    print(text, end="", flush=True)
    end = time.perf_counter()
    if not arrivals:
        raise RuntimeError("no tokens came back")
    ttft = (arrivals[0] - start) * 1000
    tokens = tokens or len(arrivals)
    tpot = (end - arrivals[0]) * 1000 / max(1, tokens - 1)
    print(f"\n\nTTFT {ttft:.1f} ms | TPOT {tpot:.1f} ms | {tokens} tokens", flush=True)
    return {"ttft_ms": ttft, "tpot_ms": tpot, "tokens": tokens}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tandem up", description=__doc__.splitlines()[0])
    p.add_argument("-f", "--file", required=True, help="InferenceService YAML")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--worker-port", type=int, default=50100, help="first gRPC port for workers")
    p.add_argument(
        "--create-tiny", action="store_true", help="create the tiny random model if the model path is empty"
    )
    p.add_argument("--demo", action="store_true", help="send one streamed request, print TTFT/TPOT, stop")
    p.add_argument("--prompt", default="Tell me about prefill and decode.")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--log-dir", default=None)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        svc = load_file(args.file)
        mdir = model_dir(svc, Path.cwd())
    except (OSError, ValueError) as e:
        print(f"tandem up: {args.file}: {e}", file=sys.stderr)
        return 2
    if not (mdir / "config.json").exists():
        if not args.create_tiny:
            print(
                f"tandem up: no model at {mdir} (pass --create-tiny for the tiny demo model)", file=sys.stderr
            )
            return 2
        subprocess.run([sys.executable, "-m", "tandem", "model", "create-tiny", str(mdir)], check=True)
    if why := beyond_model(svc.spec.model.max_context_length, model_positions(mdir)):
        print(f"tandem up: {why}", file=sys.stderr)
    state = Path(args.log_dir or tempfile.mkdtemp(prefix=f"tandem-{svc.name}-"))
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with serving(svc, state, args.host, args.port, args.worker_port) as (stack, url):
            return _serve_until_stopped(args, svc, stack, url, state)
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0
    except (RuntimeError, TimeoutError) as e:
        print(f"tandem up: {e}", file=sys.stderr)
        return 1


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _serve_until_stopped(
    args: argparse.Namespace, svc: InferenceService, stack: LocalStack, url: str, state: Path
) -> int:
    name = svc.spec.model.served_name
    print(f"{svc.name} ready: OpenAI API at {url}/v1 (model {name!r}), metrics at {url}/metrics", flush=True)
    if args.demo:
        demo(url, name, args.prompt, args.max_tokens)
        return 0
    autoscaler = _start_autoscaler(svc, stack, state)
    try:
        while True:  # the supervisor thread restarts what crashes; this thread waits for Ctrl-C or SIGTERM
            time.sleep(1)
    finally:
        if autoscaler is not None:
            autoscaler.stop()


def _start_autoscaler(svc: InferenceService, stack: LocalStack, state: Path):
    """With spec.autoscaling.enabled, the SLO autoscaler resizes the local pools
    (tandem.operator.autoscale.backends.local.loop)."""
    if not svc.spec.autoscaling.enabled:
        return None
    from tandem.operator.autoscale.backends.local.loop import LocalAutoscaleThread, local_autoscaler
    from tandem.operator.local.scale import LocalPools

    pools = LocalPools(stack, svc, Path.cwd(), state / "workers.json", threads=svc.spec.engine.threads or 1)
    print(f"autoscaling {svc.name} every {svc.spec.autoscaling.interval_seconds}s on its SLO", flush=True)
    return LocalAutoscaleThread(
        local_autoscaler(pools, svc, Path.cwd()), svc.spec.autoscaling.interval_seconds
    ).start()


def model_positions(mdir: Path) -> int | None:
    """The model's max_position_embeddings from its config.json; None when it does not say."""
    try:
        value = json.loads((mdir / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None

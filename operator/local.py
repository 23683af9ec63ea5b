"""`tandem up -f SPEC.yaml`: run an InferenceService as router and worker processes on this machine.

The same YAML a user would `kubectl apply`. Ctrl-C (or SIGTERM) stops every process cleanly. With
`--demo`, one streamed chat request is sent once the stack is up, its TTFT and TPOT printed, and the
stack stopped again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from tandem.operator.local_plan import ProcessPlan, model_dir, plan, workers_document
from tandem.spec import InferenceService, load_file


class LocalStack:
    def __init__(self, procs: list[ProcessPlan], log_dir: Path, quiet: bool = False):
        self.plans, self.log_dir, self.quiet = procs, log_dir, quiet
        self.running: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for p in self.plans:
            self.spawn(p)

    def spawn(self, p: ProcessPlan) -> subprocess.Popen:
        """Start one planned process (logging to `<name>.log`); the stack stops it with the rest."""
        if p not in self.plans:
            self.plans.append(p)
        log = open(self.log_dir / f"{p.name}.log", "wb")  # noqa: SIM115 - owned by the child
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **p.env}
        proc = self.running[p.name] = subprocess.Popen(
            p.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        return proc

    def wait_ready(self, router_url: str, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.running.items():
                if proc.poll() is not None:
                    tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{name} exited with code {proc.returncode}:\n{tail}")
            try:
                if httpx.get(f"{router_url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"the stack was not ready after {timeout_s:.0f}s; logs in {self.log_dir}")

    def stop(self, grace_s: float = 10.0) -> None:
        for proc in self.running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.running.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def free_port_block(n: int) -> int:
    """A base port with `n` consecutive free loopback ports above it (best effort), for a stack's
    router and workers."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65000:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port block")


@contextmanager
def serving(svc: InferenceService, state: Path, host: str = "127.0.0.1", port: int = 8000, worker_port: int = 50100):
    """Start the stack for `svc`, wait until the router is healthy, yield (stack, router URL), stop it."""
    state.mkdir(parents=True, exist_ok=True)
    workers_file = state / "workers.json"
    procs = plan(svc, Path.cwd(), host, port, worker_port, workers_file)
    workers_file.write_text(json.dumps(workers_document(procs)))
    stack = LocalStack(procs, state)
    url = f"http://{host}:{port}"
    try:
        stack.start()
        print(f"starting {svc.name}: {', '.join(p.name for p in procs)} (logs in {state})", flush=True)
        stack.wait_ready(url)
        yield stack, url
    finally:
        stack.stop()


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
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
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
    p.add_argument("--create-tiny", action="store_true", help="create the tiny random model if the model path is empty")
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
            print(f"tandem up: no model at {mdir} (pass --create-tiny for the tiny demo model)", file=sys.stderr)
            return 2
        subprocess.run([sys.executable, "-m", "tandem", "model", "create-tiny", str(mdir)], check=True)
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


def _serve_until_stopped(args: argparse.Namespace, svc: InferenceService, stack: LocalStack, url: str, state: Path) -> int:
    name = svc.spec.model.served_name
    print(f"{svc.name} ready: OpenAI API at {url}/v1 (model {name!r}), metrics at {url}/metrics", flush=True)
    if args.demo:
        demo(url, name, args.prompt, args.max_tokens)
        return 0
    while True:
        time.sleep(1)
        for proc_name, proc in stack.running.items():
            if proc.poll() is not None:
                print(f"{proc_name} exited with code {proc.returncode}; see {state / (proc_name + '.log')}", file=sys.stderr)
                return 1

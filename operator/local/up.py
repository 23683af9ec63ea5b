"""`tandem up -f SPEC.yaml`: run an InferenceService as router and worker processes on this machine.

The same YAML a user would `kubectl apply`. A process that crashes is restarted with backoff while the
rest keeps serving; no process outlives `tandem up`, even killed with SIGKILL; Ctrl-C (or SIGTERM) stops
every process within a few seconds; shared-memory segments a killed run left behind are removed at the
next start. With `--demo`, one streamed chat request is sent once the stack is
up, its TTFT and TPOT printed, and the stack stopped again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import httpx

from tandem import names
from tandem.context_limit import beyond_model
from tandem.launch import worker_pools
from tandem.lifecycle import die_with_parent_env
from tandem.operator.certs import write_local
from tandem.operator.local.plan import ProcessPlan, local_tls_root, model_dir, plan, workers_document
from tandem.operator.local.supervisor import ChildState
from tandem.shm_segments import sweep_dead_segments
from tandem.spec import InferenceService, load_file

STOP_GRACE_S = 5.0


class LocalStack:
    """The stack's processes, started and watched by one supervisor thread: the parent of every child
    (their parent-death signal is tied to it), which restarts a child that exits once `arm()` was called."""

    def __init__(self, procs: list[ProcessPlan], log_dir: Path, quiet: bool = False, poll_s: float = 0.1):
        self.plans, self.log_dir, self.quiet, self.poll_s = procs, log_dir, quiet, poll_s
        self.running: dict[str, subprocess.Popen] = {}
        self.children: dict[str, ChildState] = {}
        self._lock = threading.Lock()
        self._armed, self._stopping, self._reaped = threading.Event(), threading.Event(), threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="tandem-up-supervisor", daemon=True)
        self._error: BaseException | None = None
        self._asked: queue.SimpleQueue[tuple[ProcessPlan, Future[subprocess.Popen]]] = queue.SimpleQueue()

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise RuntimeError(f"could not start the stack: {self._error}") from self._error

    def arm(self) -> None:
        """From now on a child that exits is restarted (before, an exit is a failed start)."""
        self._armed.set()

    def spawn(self, p: ProcessPlan) -> subprocess.Popen:
        """Start one planned process (logging to `<name>.log`); the stack restarts it if it crashes and
        stops it with the rest. It is started on the supervisor thread, whatever thread asks."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            with self._lock:
                return self._spawn(p)
        asked: Future[subprocess.Popen] = Future()
        self._asked.put((p, asked))
        return asked.result(timeout=60)

    def _spawn(self, p: ProcessPlan) -> subprocess.Popen:
        """Start `p` now (the caller holds the lock) and watch it as the stack's."""
        if p not in self.plans:
            self.plans.append(p)
        log = open(self.log_dir / f"{p.name}.log", "ab")  # noqa: SIM115 - owned by the child
        # No preexec_fn (Python code between fork and exec deadlocks a threaded parent now and then): the
        # child asks to die with this thread itself (tandem.lifecycle).
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **die_with_parent_env(), **p.env}
        try:
            proc = subprocess.Popen(p.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        finally:
            log.close()
        self.running[p.name] = proc
        self.children.setdefault(p.name, ChildState(started_at=time.monotonic()))
        return proc

    def _supervise(self) -> None:
        try:
            with self._lock:
                for p in list(self.plans):
                    self._spawn(p)
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
        self._started.set()
        while not self._stopping.wait(self.poll_s):
            with self._lock:
                if self._stopping.is_set():
                    break
                self._serve_spawn_requests()
                self._restart_exited(time.monotonic())
        self._reaped.wait()  # stay the children's parent until stop() has seen them exit

    def _serve_spawn_requests(self) -> None:
        while not self._asked.empty():
            p, asked = self._asked.get_nowait()
            try:
                asked.set_result(self._spawn(p))
            except BaseException as e:  # noqa: BLE001 - raised in the thread that asked
                asked.set_exception(e)

    def _restart_exited(self, now: float) -> None:
        """Schedule a restart for each of the stack's processes that exited; start those that are due.
        A process taken out of `running` (a drained worker) is no longer the stack's: it is let go."""
        by_name = {p.name: p for p in self.plans}
        for name, proc in list(self.running.items()):
            child, p = self.children.get(name), by_name.get(name)
            if child is None or p is None:
                continue
            if child.restart_at is None and self._armed.is_set() and proc.poll() is not None:
                delay = child.exited(now)
                self._say(f"{name} exited with code {proc.returncode}; restarting in {delay:.1f}s")
            if child.restart_at is not None and now >= child.restart_at and self.running.get(name) is proc:
                self._spawn(p)
                child.restarted(now)
                self._say(f"{name} restarted (restart {child.restarts})")

    def _say(self, message: str) -> None:
        if not self.quiet:
            print(f"tandem up: {message}", file=sys.stderr, flush=True)

    def wait_ready(self, router_url: str, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in list(self.running.items()):
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

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM every child, SIGKILL (its whole session) what is left after `grace_s`; no restarts."""
        with self._lock:
            self._stopping.set()
            procs = list(self.running.values())
            while not self._asked.empty():
                self._asked.get_nowait()[1].set_exception(RuntimeError("the stack is stopping"))
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._reaped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def free_port_block(n: int, low: int = 20000, high: int = 32000) -> int:
    """A base port with `n` consecutive free loopback ports above it, for a stack's router and workers;
    below the kernel's ephemeral range (32768 and up), so no outgoing connection (the router's, a client's)
    can take one of them while a worker that died is restarted on its ports."""
    for _ in range(200):
        base = random.randrange(low, high - n)
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
    sweep_dead_segments()  # staging rings a run killed with SIGKILL could not remove
    workers_file = state / "workers.json"
    tls_root = local_tls_root(svc, Path.cwd(), state)
    if tls_root is None:
        print(f"tandem up: WARNING {svc.name}: security.tls is off; its gRPC ports take plaintext calls from anyone "
              "who can reach them", file=sys.stderr, flush=True)
    elif not svc.spec.security.tls.dir:
        write_local(tls_root, svc.name, (*worker_pools(svc.spec), names.POOL_ROUTER), flippable=svc.spec.role_flip)
    procs = plan(svc, Path.cwd(), host, port, worker_port, workers_file, tls_root=tls_root)
    workers_file.write_text(json.dumps(workers_document(procs)))
    stack = LocalStack(procs, state)
    url = f"http://{host}:{port}"
    try:
        stack.start()
        print(f"starting {svc.name}: {', '.join(p.name for p in procs)} (logs in {state})", flush=True)
        stack.wait_ready(url)
        stack.arm()
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


def model_positions(mdir: Path) -> int | None:
    """The model's max_position_embeddings from its config.json; None when it does not say."""
    try:
        value = json.loads((mdir / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _serve_until_stopped(args: argparse.Namespace, svc: InferenceService, stack: LocalStack, url: str, state: Path) -> int:
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
    """With spec.autoscaling.enabled, the SLO autoscaler resizes the local pools (tandem.operator.local.autoscale)."""
    if not svc.spec.autoscaling.enabled:
        return None
    from tandem.operator.local.autoscale import LocalAutoscaleThread, local_autoscaler
    from tandem.operator.local.scale import LocalPools

    pools = LocalPools(stack, svc, Path.cwd(), state / "workers.json", threads=svc.spec.engine.threads or 1)
    print(f"autoscaling {svc.name} every {svc.spec.autoscaling.interval_seconds}s on its SLO", flush=True)
    return LocalAutoscaleThread(local_autoscaler(pools, svc, Path.cwd()), svc.spec.autoscaling.interval_seconds).start()

"""The processes of a `tandem up` stack: started, supervised and restarted with backoff, stopped together.

The same YAML a user would `kubectl apply`. A process that crashes is restarted with backoff while the
rest keeps serving; no process outlives `tandem up`, even killed with SIGKILL; Ctrl-C (or SIGTERM) stops
every process within a few seconds; shared-memory segments a killed run left behind are removed at the
next start.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import httpx

from tandem import names
from tandem.launch import worker_pools
from tandem.lifecycle import die_with_parent_env
from tandem.operator.certs import write_local
from tandem.operator.local.plan import ProcessPlan, local_tls_root, plan, workers_document
from tandem.operator.local.supervisor import ChildState
from tandem.shm_segments import sweep_dead_segments
from tandem.spec import InferenceService, Mode

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
            proc = subprocess.Popen(
                p.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
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
def serving(
    svc: InferenceService, state: Path, host: str = "127.0.0.1", port: int = 8000, worker_port: int = 50100
):
    """Start the stack for `svc`, wait until the router is healthy, yield (stack, router URL), stop it."""
    state.mkdir(parents=True, exist_ok=True)
    sweep_dead_segments()  # staging rings a run killed with SIGKILL could not remove
    workers_file = state / "workers.json"
    tls_root = local_tls_root(svc, Path.cwd(), state)
    if tls_root is None:
        print(
            f"tandem up: WARNING {svc.name}: security.tls is off; its gRPC ports take plaintext calls from "
            "anyone who can reach them",
            file=sys.stderr,
            flush=True,
        )
    elif not svc.spec.security.tls.dir:
        shaped = (
            (names.POOL_COLOCATED,) if svc.spec.mode is Mode.auto else ()
        )  # mode auto may start colocated workers
        write_local(
            tls_root,
            svc.name,
            (*worker_pools(svc.spec), *shaped, names.POOL_ROUTER),
            flippable=svc.spec.role_flip,
        )
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

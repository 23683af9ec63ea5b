"""Faults under steady streaming load on a local stack (the `tandem up` supervisor, real processes):
SIGKILL of each role in turn and a burst of malformed requests. Prints one row per fault: requests
sent, failed with a clear error, lost (no answer and no error: cut, truncated or past the deadline),
KV blocks still held once the load stops, and the time until the stack is whole again (the killed
process replaced and routed to: about a worker's start time).

    python -m bench.faults [--clients 4] [--settle 4] [--repeat 1]

Soak mode replays the conversation trace for N minutes with a kill -9 or a decode scale step every
cycle, and prints each process's RSS growth after its warm-up (target < 5%), the answers by outcome and
the KV blocks still held at the end:

    python -m bench.faults --soak [--soak-minutes 30] [--trace bench/traces/azure_llm_2023_conv.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench._smoke import add_smoke, smoke_sizes
from bench._stacks import SERVED_NAME, ModelShape, make_model, running_stacks, service_object, worker_load
from bench._traces import CONV
from tandem.testing.local_up import routable

OUTPUT_TOKENS = 24
DEADLINE_S = 60.0  # a client gives up on a request after this long: counted as lost
BAD_BODIES = [
    {"seed": -(2**63) - 1},
    {"seed": 2**64},
    {"top_k": 2**40},
    {"top_k": -5},
    {"stop_token_ids": [-1]},
    {"max_tokens": 2**40},
    {"max_tokens": 0},
    {"logprobs": 5},
    {"temperature": -1},
    {"top_p": 0},
    {"stop": [""]},
    {"prompt": [10**9]},
    {"prompt": 7},
    {"n": 3},
    {"model": "nope"},
]


@dataclass
class Outcome:
    start: float
    kind: str  # ok | failed | lost


@dataclass
class Load:
    """Client threads streaming completions back to back; each outcome is recorded with its start time."""

    url: str
    clients: int
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.clients)
        ]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=DEADLINE_S + 5)

    def between(self, t0: float, t1: float) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if t0 <= o.start < t1]

    def _run(self, client: int) -> None:
        n = 0
        with httpx.Client(timeout=httpx.Timeout(DEADLINE_S, connect=5), trust_env=False) as http:
            while not self.stop.is_set():
                n += 1
                start = time.monotonic()
                kind = one_stream(http, self.url, f"client {client} request {n} " + "word " * (n % 5 * 30))
                with self._lock:
                    self.outcomes.append(Outcome(start, kind))
                if kind != "ok":
                    time.sleep(0.2)  # a client backs off a little after a failure


def one_stream(http: httpx.Client, url: str, prompt: str) -> str:
    """ok: every token and [DONE]; failed: an HTTP error answer, a refused connection or an error event;
    lost: anything else (cut mid-stream, truncated, past the deadline)."""
    body = {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    tokens, done, error = 0, False, False
    try:
        with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                resp.read()
                return "failed"
            for line in resp.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    error = error or "error" in chunk
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
    except httpx.ConnectError:
        return "failed"  # the router is down: the client is told at once
    except httpx.HTTPError:
        return "lost"
    if error and done:
        return "failed"
    return "ok" if done and tokens == OUTPUT_TOKENS else "lost"


def whole(url: str, stack) -> bool:
    """The router answers and routes to every planned worker."""
    try:
        if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code != 200:
            return False
    except httpx.HTTPError:
        return False
    wanted = {role: sum(1 for p in stack.plans if p.role == role) for role in ("prefill", "decode")}
    return all(routable(url, role) == n for role, n in wanted.items())


def held_blocks(stack, timeout_s: float = 30.0) -> int:
    """KV blocks still in use on the workers once nothing runs (0 when every transfer and sequence freed)."""
    deadline = time.monotonic() + timeout_s
    held = -1
    while time.monotonic() < deadline:
        try:
            reports = [
                worker_load(p) for p in stack.plans if p.role != "router" and p.name in stack.running
            ]  # a drained worker has left
        except Exception:  # a worker still restarting
            time.sleep(0.5)
            continue
        held = sum(r.total_kv_blocks - r.free_kv_blocks for r in reports)
        if held == 0 and all(r.running_sequences == 0 for r in reports):
            return 0
        time.sleep(0.25)
    return held


def kill(stack, name: str) -> Callable[[], Callable[[], bool]]:
    """SIGKILL the process; the stack is whole again once a new process took its place."""

    def fault() -> Callable[[], bool]:
        pid = stack.running[name].pid
        os.kill(pid, signal.SIGKILL)
        return lambda: stack.running[name].pid != pid

    return fault


def bad_input(url: str, stats: dict) -> Callable[[], Callable[[], bool]]:
    def fault() -> Callable[[], bool]:
        with httpx.Client(timeout=30, trust_env=False) as http:
            for i in range(100):
                body = {"model": SERVED_NAME, "prompt": "x", **BAD_BODIES[i % len(BAD_BODIES)]}
                r = http.post(f"{url}/v1/completions", json=body)
                stats["5xx"] = stats.get("5xx", 0) + (r.status_code >= 500)
            for raw in (b"{", b"[]", b'{"model": "' + SERVED_NAME.encode() + b'", "prompt": "\\ud800"}'):
                r = http.post(
                    f"{url}/v1/completions", content=raw, headers={"content-type": "application/json"}
                )
                stats["5xx"] += r.status_code >= 500
        return lambda: True

    return fault


def run(clients: int, settle_s: float, state: Path, repeat: int = 1) -> list[tuple]:
    model = make_model(state / "model", ModelShape(hidden=128, layers=2))
    obj = service_object("faults", model, mode="disaggregated", prefill=2, decode=2, num_kv_blocks=512)
    rows = []
    with running_stacks({"faults": obj}, state) as stacks:
        stack, url = stacks["faults"]
        for role in ("prefill", "decode"):  # /health is green with one worker per pool: wait for all
            deadline = time.monotonic() + 180
            while routable(url, role) < 2 and time.monotonic() < deadline:
                time.sleep(0.5)
        stats: dict = {}
        kills = [
            (f"kill -9 {role}" + (f" #{r + 1}" if repeat > 1 else ""), kill(stack, name))
            for r in range(repeat)
            for role, name in (
                ("prefill worker", f"prefill-{r % 2}"),
                ("decode worker", f"decode-{r % 2}"),
                ("router", "router"),
            )
        ]
        faults = [
            *kills,
            ("100 malformed requests", bad_input(url, stats)),
        ]
        names_ = [p.name for p in stack.plans]
        for label, fault in faults:
            missing = [
                n for n in ("prefill-0", "prefill-1", "decode-0", "decode-1", "router") if n not in names_
            ]
            if missing:
                raise RuntimeError(f"no process named {missing} in the plan: {names_}")
            load = Load(url, clients)
            time.sleep(settle_s)
            t0 = time.monotonic()
            replaced = fault()
            recovered = None
            while time.monotonic() - t0 < 240:
                if replaced() and whole(url, stack):
                    recovered = time.monotonic() - t0
                    break
                time.sleep(0.2)
            time.sleep(settle_s)
            load.close()
            outcomes = load.between(0, time.monotonic())
            leaked = held_blocks(stack)
            sent = len(outcomes)
            failed = sum(o.kind == "failed" for o in outcomes)
            lost = sum(o.kind == "lost" for o in outcomes)
            note = f"{stats.get('5xx', 0)} answered 5xx" if label.startswith("100") else ""
            rows.append((label, sent, failed, lost, leaked, recovered, note))
            print(
                f"  {label}: {sent} sent, {failed} failed, {lost} lost, {leaked} blocks held, "
                f"whole again after {recovered if recovered is None else round(recovered, 1)} s {note}",
                flush=True,
            )
    return rows


def soak(args: argparse.Namespace, state: Path) -> None:
    from bench._soak import Soak
    from tandem.operator.local.scale import LocalPools
    from tandem.spec import parse_object

    model = make_model(state / "model", ModelShape(hidden=128, layers=2))
    obj = service_object("soak", model, mode="disaggregated", prefill=2, decode=2, num_kv_blocks=512)
    with running_stacks({"soak": obj}, state) as stacks:
        stack, url = stacks["soak"]
        pools = LocalPools(stack, parse_object(obj), Path.cwd(), state / "soak" / "workers.json")
        run_ = Soak(
            stack,
            url,
            pools,
            SERVED_NAME,
            args.trace,
            args.soak_minutes,
            rate_rps=args.rate,
            cycle_s=args.cycle,
            warmup_s=args.warmup,
        )
        rows, kinds, events = run_.run()
        time.sleep(5)
        leaked = held_blocks(stack, timeout_s=60)
    print("\n".join(["", "events:", *events]))
    print(f"\nanswers: {kinds}; KV blocks held at the end: {leaked}")
    print(
        f"\n{'process':<12} {'pid':>7} {'RSS after warm-up MiB':>22} {'at end MiB':>10} {'over s':>7} "
        f"{'growth':>7}"
    )
    for g in rows:
        print(
            f"{g.name:<12} {g.pid:>7} {g.baseline_kib / 1024:>22.1f} {g.end_kib / 1024:>10.1f} "
            f"{g.span_s:>7.0f} {g.percent:>6.1f}%"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--settle", type=float, default=4.0, help="seconds of load before and after each fault")
    p.add_argument(
        "--repeat", type=int, default=1, help="kill each role this many times (alternating workers)"
    )
    p.add_argument("--soak", action="store_true", help="soak mode instead of the fault table")
    p.add_argument("--soak-minutes", type=float, default=30.0, help="how long the soak runs")
    p.add_argument("--trace", type=Path, default=CONV)
    p.add_argument("--rate", type=float, default=1.5, help="soak: mean requests per second")
    p.add_argument("--cycle", type=float, default=60.0, help="soak: seconds between kill or scale steps")
    p.add_argument(
        "--warmup",
        type=float,
        default=60.0,
        help="soak: seconds of each process's life before its RSS baseline",
    )
    add_smoke(p)
    args = smoke_sizes(p.parse_args(), clients=1, settle=0.5, repeat=1)
    if args.soak:
        with tempfile.TemporaryDirectory(prefix="tandem-soak-") as tmp:
            soak(args, Path(tmp))
        return
    with tempfile.TemporaryDirectory(prefix="tandem-faults-") as tmp:
        rows = run(args.clients, args.settle, Path(tmp), args.repeat)
    print(
        f"\n{'fault':<26} {'sent':>5} {'failed':>6} {'lost':>5} {'blocks leaked':>13} {'recovery s':>10}  "
        "note"
    )
    for label, sent, failed, lost, leaked, recovered, note in rows:
        rec = "never" if recovered is None else f"{recovered:.1f}"
        print(f"{label:<26} {sent:>5} {failed:>6} {lost:>5} {leaked:>13} {rec:>10}  {note}")


if __name__ == "__main__":
    main()

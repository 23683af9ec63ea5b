"""Overload on loopback: one router, one prefill and one decode worker under a ramp to many concurrent
streaming clients, then a burst of clients that disconnect at random points.

Prints requests by outcome (ok / 429 / 503 / error event / other, and silent truncations: a 200 stream that
ends without a finish reason or an error), the p99 latency of the workers' gRPC health checks and the router's
/livez during the ramp, worker restarts, KV blocks and held requests left 2 s after the burst, peak RSS of the
router and the workers, and the time until the stack is back at its unloaded throughput. Bounded in clients
(--clients, --burst) and time (--ramp-s, --hold-s, --recover-s); every connection goes to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench._smoke import add_smoke, smoke_sizes
from bench._soak import rss_kib
from bench._stacks import SERVED_NAME, ModelShape, make_model, running_stacks, service_object, worker_load
from tandem import names
from tandem.operator.local.scale import dial

WORDS = "the quick brown fox jumps over a lazy dog while prefill and decode share the work".split()


def request_bytes(host: str, prompt: str, max_tokens: int) -> bytes:
    body = json.dumps(
        {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def dechunk(body: bytes) -> bytes:
    """The payload of a chunked HTTP body (what there is of it, if it was cut)."""
    out, pos = bytearray(), 0
    while pos < len(body):
        end = body.find(b"\r\n", pos)
        if end < 0:
            break
        try:
            size = int(body[pos:end].split(b";")[0], 16)
        except ValueError:
            break
        if size == 0:
            break
        out += body[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2
    return bytes(out)


def outcome(raw: bytes) -> str:
    """ok | 429 | 503 | error-event | truncated | other, from a whole HTTP response (pure)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1] if head.startswith(b"HTTP/") else b""
    if status in (b"429", b"503"):
        return status.decode() + ("" if b"retry-after:" in head.lower() else " without Retry-After")
    if status != b"200":
        return f"other ({status.decode() or 'no answer'})"
    payload = dechunk(body) if b"transfer-encoding: chunked" in head.lower() else body
    events = [e[len(b"data: ") :] for e in payload.split(b"\n\n") if e.startswith(b"data: ")]
    if any(e.startswith(b'{"error"') for e in events):
        return "error-event"
    finished = any(b'"finish_reason":"stop"' in e or b'"finish_reason":"length"' in e for e in events)
    return "ok" if finished and events[-1:] == [b"[DONE]"] else "truncated"


async def one_request(port: int, prompt: str, max_tokens: int, leave_after_s: float | None = None) -> str:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
    except (OSError, TimeoutError):
        return "other (connect failed)"
    try:
        writer.write(request_bytes("router", prompt, max_tokens))
        await writer.drain()
        if leave_after_s is not None:  # a client that disconnects
            await asyncio.sleep(leave_after_s)
            return "left"
        raw = await asyncio.wait_for(reader.read(), 300)
        return outcome(raw)
    except (OSError, TimeoutError):
        return "other (connection error)"
    finally:
        writer.close()


def prompt_of(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 64)))


async def ramp(port: int, clients: int, ramp_s: float, hold_s: float, max_tokens: int, seed: int) -> Counter:
    """`clients` closed-loop streaming clients, started evenly over `ramp_s`, all stopping at ramp + hold; a
    refused client waits about the Retry-After it was given before its next request."""
    rng = random.Random(seed)
    counts: Counter = Counter()
    stop_at = time.monotonic() + ramp_s + hold_s

    async def client(i: int) -> None:
        await asyncio.sleep(i * ramp_s / clients)
        while time.monotonic() < stop_at:
            result = await one_request(port, prompt_of(rng), max_tokens)
            counts[result] += 1
            if result in (
                "429",
                "503",
            ):  # as a well-behaved client does: wait out Retry-After (1 s), jittered
                await asyncio.sleep(rng.uniform(0.5, 1.5))

    await asyncio.gather(*(client(i) for i in range(clients)))
    return counts


async def burst(port: int, clients: int, max_tokens: int, seed: int) -> Counter:
    """`clients` streaming requests whose clients leave at random points: at once, or within 3 s."""
    rng = random.Random(seed)
    leave = [0.0 if rng.random() < 0.3 else rng.uniform(0.0, 3.0) for _ in range(clients)]
    results = await asyncio.gather(*(one_request(port, prompt_of(rng), max_tokens, s) for s in leave))
    return Counter(results)


class Sampler(threading.Thread):
    """Health-check latency of every worker (gRPC) and the router (/livez), and RSS of every process."""

    def __init__(self, stack, url: str, every_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.stack, self.url, self.every_s = stack, url, every_s
        self.latencies: dict[str, list[float]] = {}  # per process: worker gRPC health, router /livez
        self.peak_rss_kib: dict[str, int] = {}
        self.measuring = threading.Event()
        self.stopped = threading.Event()

    def run(self) -> None:
        channels = {p.name: dial(p) for p in self.stack.plans if p.role != "router"}
        with httpx.Client(timeout=5, trust_env=False) as http:
            while not self.stopped.wait(self.every_s):
                for name, proc in list(self.stack.running.items()):
                    if (rss := rss_kib(proc.pid)) is not None:
                        self.peak_rss_kib[name] = max(self.peak_rss_kib.get(name, 0), rss)
                if not self.measuring.is_set():
                    continue
                for name, channel in channels.items():
                    self.latencies.setdefault(name, []).append(_timed_health(channel))
                start = time.monotonic()
                try:
                    http.get(f"{self.url}{names.LIVENESS_PATH}")
                    self.latencies.setdefault("router", []).append(time.monotonic() - start)
                except httpx.HTTPError:
                    self.latencies.setdefault("router", []).append(5.0)
        for channel in channels.values():
            channel.close()


def _timed_health(channel: grpc.Channel) -> float:
    start = time.monotonic()
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    except grpc.RpcError:
        return 5.0
    return time.monotonic() - start


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[int(0.99 * (len(xs) - 1))] if xs else 0.0


def held(stack) -> dict[str, tuple[int, int]]:
    """Per worker: KV blocks in use and requests held (from its /metrics)."""
    out = {}
    for p in stack.plans:
        if p.role == "router":
            continue
        host = p.address.rsplit(":", 1)[0]
        text = httpx.get(f"http://{host}:{p.metrics_port}/metrics", timeout=5, trust_env=False).text

        def gauge(name: str, text: str = text) -> int:
            return int(sum(float(li.split()[-1]) for li in text.splitlines() if li.startswith(name + "{")))

        reserved = worker_load(p).reserved_kv_blocks if p.role == "decode" else 0
        out[p.name] = (gauge(names.KV_BLOCKS_USED) + reserved, gauge(names.WORKER_HELD_REQUESTS))
    return out


async def throughput(
    port: int, clients: int, seconds: float, max_tokens: int, seed: int
) -> tuple[list[float], Counter]:
    """Completion times of `clients` closed-loop clients over `seconds` (ok answers), and every outcome."""
    rng = random.Random(seed)
    done: list[float] = []
    counts: Counter = Counter()
    stop_at = time.monotonic() + seconds

    async def client() -> None:
        while time.monotonic() < stop_at:
            result = await one_request(port, prompt_of(rng), max_tokens)
            counts[result] += 1
            if result == "ok":
                done.append(time.monotonic())
            elif result in ("429", "503"):
                await asyncio.sleep(rng.uniform(0.5, 1.5))

    await asyncio.gather(*(client() for _ in range(clients)))
    return done, counts


def best_rate(done: list[float], window_s: float = 2.0) -> float:
    """The most completions per second over any `window_s` window (pure)."""
    return max((sum(t - window_s < d <= t for d in done) / window_s for t in done), default=0.0)


def recovery_s(done: list[float], start: float, baseline_rps: float, window_s: float = 2.0) -> float | None:
    """Seconds from `start` until a `window_s` window first completes >= 90% of the baseline rate (pure)."""
    for t in sorted(done):
        if sum(t - window_s < d <= t for d in done) / window_s >= 0.9 * baseline_rps:
            return max(0.0, t - start)
    return None


def run(args: argparse.Namespace, state: Path) -> dict:
    model = make_model(state / "model", ModelShape(hidden=128, layers=2))
    obj = service_object("load", model, mode="disaggregated", num_kv_blocks=args.kv_blocks)
    with running_stacks({"load": obj}, state) as stacks:
        stack, url = stacks["load"]
        port = int(url.rsplit(":", 1)[1])
        base, _ = asyncio.run(throughput(port, args.base_clients, args.base_s, args.max_tokens, 1))
        baseline_rps = len(base) / args.base_s
        sampler = Sampler(stack, url)
        sampler.start()
        sampler.measuring.set()
        counts = asyncio.run(ramp(port, args.clients, args.ramp_s, args.hold_s, args.max_tokens, args.seed))
        sampler.measuring.clear()
        left = asyncio.run(burst(port, args.burst, args.max_tokens, args.seed + 1))
        time.sleep(2.0)
        leftover = held(stack)
        again = time.monotonic()
        done, after = asyncio.run(throughput(port, args.base_clients, args.recover_s, args.max_tokens, 2))
        sampler.stopped.set()
        sampler.join(timeout=10)
        lat = sorted(x for xs in sampler.latencies.values() for x in xs)
        return {
            "requests": dict(counts),
            "burst": dict(left),
            "health_p99_s": lat[int(0.99 * (len(lat) - 1))] if lat else None,
            "health_max_s": lat[-1] if lat else None,
            "health_checks": len(lat),
            "health_p99_by_process_s": {k: round(p99(v), 3) for k, v in sorted(sampler.latencies.items())},
            "restarts": sum(c.restarts for c in stack.children.values()),
            "held_2s_after_burst": leftover,
            "peak_rss_mib": {k: round(v / 1024) for k, v in sorted(sampler.peak_rss_kib.items())},
            "baseline_rps": round(baseline_rps, 2),
            "recovered_after_s": recovery_s(
                done, again, baseline_rps
            ),  # from the first request after the check
            "after_burst": dict(after),
            "after_burst_best_rps": round(best_rate(done), 2),
        }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=1000, help="concurrent streaming clients at the ramp's top")
    p.add_argument("--ramp-s", type=float, default=30.0)
    p.add_argument("--hold-s", type=float, default=15.0)
    p.add_argument("--burst", type=int, default=500, help="clients that disconnect at random points")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--kv-blocks", type=int, default=1024)
    p.add_argument("--base-clients", type=int, default=4, help="closed-loop clients measuring throughput")
    p.add_argument("--base-s", type=float, default=10.0)
    p.add_argument(
        "--recover-s", type=float, default=60.0, help="how long to watch for full throughput again"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    add_smoke(p)
    args = smoke_sizes(
        p.parse_args(),
        clients=4,
        ramp_s=1.0,
        hold_s=1.0,
        burst=4,
        kv_blocks=128,
        base_clients=1,
        base_s=1.0,
        recover_s=10.0,
    )
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        report = run(args, Path(tmp))
    if args.json:
        print(json.dumps(report))
        return
    r = report
    print(f"ramp to {args.clients} clients over {args.ramp_s:g} s, held {args.hold_s:g} s: {r['requests']}")
    print(f"burst of {args.burst} leaving clients: {r['burst']}")
    print(
        f"health checks (workers' gRPC, router /livez) during the ramp: p99 {r['health_p99_s']:.3f} s, "
        f"max {r['health_max_s']:.3f} s over {r['health_checks']}; p99 by process "
        f"{r['health_p99_by_process_s']}"
    )
    print(f"worker restarts: {r['restarts']}")
    print(
        "2 s after the burst, per worker (KV blocks used or reserved, requests held): "
        f"{r['held_2s_after_burst']}"
    )
    print(f"peak RSS (MiB): {r['peak_rss_mib']}")
    rec = r["recovered_after_s"]
    back = f"after {rec:.1f} s" if rec is not None else f"not within {args.recover_s:g} s"
    print(
        f"baseline {r['baseline_rps']} req/s with {args.base_clients} clients; after the burst's check, "
        f"90% of it over a 2 s window {back} (best {r['after_burst_best_rps']} req/s; {r['after_burst']})"
    )


if __name__ == "__main__":
    main()

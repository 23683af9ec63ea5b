"""Drain-safe scale-down on the local stack: pools shrink and grow again and again under steady streaming
load, and not one request fails or comes back short."""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tandem.operator.local.scale import LocalPools
from tandem.operator.local.stack import free_port_block, serving
from tandem.spec import parse_object
from tests.integration.stacks import spec

pytestmark = pytest.mark.slow

# Each cycle starts a worker process (most of the test's time, about 30 s a cycle on 2 cores): 2 per pool in
# CI, the second replacement starting while the first victim drains; TANDEM_DRAIN_CYCLES=20 is the longer soak
# (bench/faults.py soaks kills and scaling for minutes).
CYCLES = int(os.environ.get("TANDEM_DRAIN_CYCLES", "2"))
OUTPUT_TOKENS = 24


class StreamingLoad:
    """Client threads that stream completions back to back and check every answer is whole."""

    def __init__(self, url: str, clients: int, words: int | None = None):
        """`words`: every prompt's padding in words (about two tokens each); by default it cycles 0-240."""
        self.url, self.clients, self.words = url, clients, words
        self.stop = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> StreamingLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def _run(self, client: int) -> None:
        body = {
            "model": "tiny",
            "max_tokens": OUTPUT_TOKENS,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        n = 0
        with httpx.Client(timeout=60) as http:
            while not self.stop.is_set():
                n += 1
                words = n % 7 * 40 if self.words is None else self.words
                problem = self._one(
                    http, {**body, "prompt": f"client {client} request {n} " + "word " * words}
                )
                with self._lock:
                    if problem:
                        self.failures.append(problem)
                    else:
                        self.ok += 1

    def _one(self, http: httpx.Client, body: dict) -> str | None:
        """None when the stream ended with [DONE], every token, finish reason `length`; else what went
        wrong."""
        tokens, finish, done = 0, None, False
        try:
            with http.stream("POST", f"{self.url}/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    return f"HTTP {resp.status_code}: {resp.read().decode()[:200]}"
                for line in resp.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return f"error chunk: {chunk['error']}"
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                    for choice in chunk.get("choices", []):
                        finish = choice.get("finish_reason") or finish
        except httpx.HTTPError as e:
            return f"{type(e).__name__}: {e}"
        if not done or tokens != OUTPUT_TOKENS or finish != "length":
            return f"truncated: done={done} tokens={tokens} finish={finish}"
        return None


def _wait_ready(pools: LocalPools, role: str, want: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while pools.replicas(role).ready < want:
        for p in pools.members(role):
            code = pools.stack.running[p.name].poll()
            assert code is None, (
                f"{p.name} exited with {code}: "
                f"{(pools.stack.log_dir / (p.name + '.log')).read_text()[-2000:]}"
            )
        assert time.monotonic() < deadline, f"{role}: {pools.replicas(role)} after {timeout_s}s"
        time.sleep(0.2)


def _cycles(pools: LocalPools, role: str, cycles: int) -> list[tuple[str, int, int]]:
    """Shrink `role` by its busiest worker `cycles` times, a replacement starting while each drains (so
    starts overlap drains); per drain: (name, sequences it held when told to go, its exit code)."""
    serving = len(pools.members(role))
    pools.scale(role, serving + 1)
    drained: list[tuple[str, int, int]] = []
    for i in range(cycles):
        _wait_ready(pools, role, serving + 1)
        time.sleep(0.5)  # the router has seen the new worker and sends it work too
        held = _busiest_moment(pools, role)
        victim = max(held, key=lambda n: _held(held[n]))
        pools.drain([victim])
        if i < cycles - 1:
            pools.scale(role, serving + 1)  # the next replacement starts while the victim drains
        deadline = time.monotonic() + 120
        while pools.reap() is not None and victim not in pools.exited:
            assert time.monotonic() < deadline, f"{victim} did not exit after draining"
            time.sleep(0.1)
        drained.append((victim, _held(held[victim]), pools.exited[victim]))
    return drained


def _busiest_moment(pools: LocalPools, role: str, within_s: float = 5.0) -> dict:
    """Each member's load report, sampled until one holds work (a prefill holds a prompt for a few steps
    only, so one snapshot often finds them all idle) or `within_s` passes."""
    deadline = time.monotonic() + within_s
    while True:
        held = {p.name: pools.load(p) for p in pools.members(role)}
        if any(_held(r) > 0 for r in held.values()) or time.monotonic() >= deadline:
            return held
        time.sleep(0.02)


def _held(report) -> int:
    return (
        0
        if report is None
        else report.running_sequences + report.waiting_sequences + report.queued_prompt_tokens
    )


@pytest.mark.timeout(1800)
def test_scale_down_cycles_under_streaming_load_fail_nothing(tiny_model_dir, tmp_path: Path):
    svc = parse_object(spec("drain", tiny_model_dir, prefill=2, decode=2, prefillChunkTokens=32))
    base = free_port_block(8)
    with serving(svc, tmp_path, port=base, worker_port=base + 2) as (stack, url):
        pools = LocalPools(stack, svc, Path.cwd(), tmp_path / "workers.json")
        with StreamingLoad(url, clients=4) as load, ThreadPoolExecutor(2) as both:
            time.sleep(1.0)
            runs = {role: both.submit(_cycles, pools, role, CYCLES) for role in ("prefill", "decode")}
            drained = {role: run.result() for role, run in runs.items()}
            time.sleep(0.5)
        pools.close()
    assert load.failures == [], (
        f"{len(load.failures)} failed of {load.ok + len(load.failures)}: {load.failures[:5]}"
    )
    for role, drains in drained.items():
        assert len(drains) == CYCLES, role
        assert all(code == 0 for _, _, code in drains), drains
    # the victims held work when told to go (the busiest was chosen), so the drains were really tested;
    # a prefill is over in a few steps, so a prefill victim holds work less often than a decode one
    assert sum(1 for _, held, _ in drained["decode"] if held > 0) >= CYCLES // 2, drained["decode"]
    assert any(held > 0 for _, held, _ in drained["prefill"]), drained["prefill"]
    assert load.ok >= 2 * CYCLES  # traffic really ran through the cycles

"""Soak for bench/faults.py: a trace replayed against a local stack for minutes while workers and the router
are killed and the decode pool is scaled up and back, with every process's resident memory sampled from
/proc; the report is each process's RSS growth after its warm-up (the target is under 5%)."""

from __future__ import annotations

import os
import random
import signal
import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from tandem.testing.fault_load import stream_one
from tandem.trace import TraceRequest, load_trace

WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "ember", "north", "quiet")


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the soak started
    name: str  # the process's role name (router, prefill-0, ...), or "supervisor" for this process
    pid: int
    rss_kib: int


@dataclass(frozen=True)
class Growth:
    name: str
    pid: int
    baseline_kib: int  # median of the first samples after warm-up
    end_kib: int  # median of the last samples
    span_s: float  # time between the two

    @property
    def percent(self) -> float:
        return 100.0 * (self.end_kib - self.baseline_kib) / self.baseline_kib


def rss_kib(pid: int) -> int | None:
    """Resident set size from /proc/<pid>/status (None when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def growth(samples: Sequence[Sample], warmup_s: float, min_span_s: float, window: int = 3) -> list[Growth]:
    """Per process incarnation (name, pid) that lived `warmup_s` and then `min_span_s` more: RSS at the end
    against RSS just after its own warm-up, each the median of `window` samples. Pure."""
    by: dict[tuple[str, int], list[Sample]] = {}
    for s in samples:
        by.setdefault((s.name, s.pid), []).append(s)
    out = []
    for (name, pid), series in by.items():
        series.sort(key=lambda s: s.t)
        after = [s for s in series if s.t >= series[0].t + warmup_s]
        if len(after) < 2 * window or after[-1].t - after[0].t < min_span_s:
            continue
        head, tail = after[:window], after[-window:]
        out.append(
            Growth(
                name,
                pid,
                int(statistics.median(s.rss_kib for s in head)),
                int(statistics.median(s.rss_kib for s in tail)),
                tail[-1].t - head[0].t,
            )
        )
    return sorted(out, key=lambda g: g.name)


def replay_specs(
    trace: Sequence[TraceRequest], rate_rps: float, seed: int = 0
) -> list[tuple[float, int, int]]:
    """(arrival s, prompt words, output tokens): the trace's inter-arrival pattern at `rate_rps` on average,
    lengths shrunk to what a CPU model serves in a soak. Pure."""
    span = (trace[-1].arrival_s - trace[0].arrival_s) or 1.0
    stretch = (len(trace) - 1) / rate_rps / span
    rng = random.Random(seed)
    return [
        (
            (r.arrival_s - trace[0].arrival_s) * stretch,
            max(8, min(r.input_len // 8, 200)) + rng.randrange(4),
            max(4, min(r.output_len // 8, 32)),
        )
        for r in trace
    ]


class Soak:
    """Replay, kill/scale cycles and RSS sampling against one running stack; run() returns the report."""

    def __init__(
        self,
        stack,
        url: str,
        pools,
        model: str,
        trace: Path,
        minutes: float,
        *,
        rate_rps: float = 1.5,
        cycle_s: float = 60.0,
        sample_s: float = 5.0,
        warmup_s: float = 60.0,
        deadline_s: float = 60.0,
    ):
        self.stack, self.url, self.pools, self.model, self.trace = stack, url, pools, model, trace
        self.duration_s, self.rate_rps, self.cycle_s = minutes * 60, rate_rps, cycle_s
        self.sample_s, self.warmup_s, self.deadline_s = sample_s, warmup_s, deadline_s
        self.samples: list[Sample] = []
        self.answers: list = []
        self.events: list[str] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _sample_forever(self) -> None:
        while not self._stop.is_set():
            procs = {"supervisor": os.getpid(), **{n: p.pid for n, p in list(self.stack.running.items())}}
            for name, pid in procs.items():
                if (rss := rss_kib(pid)) is not None:
                    self.samples.append(Sample(self._now(), name, pid, rss))
            self._stop.wait(self.sample_s)

    def _replay(self) -> None:
        specs = replay_specs(load_trace(self.trace)[:2000], self.rate_rps)
        http = httpx.Client(
            timeout=httpx.Timeout(self.deadline_s, connect=5),
            trust_env=False,
            limits=httpx.Limits(max_connections=32),
        )
        with http, ThreadPoolExecutor(max_workers=16) as pool:
            lap = 0.0
            while not self._stop.is_set():
                for i, (at, words, out) in enumerate(specs):
                    delay = lap + at - self._now()
                    if self._stop.wait(max(0.0, delay)):
                        break
                    prompt = f"soak {lap:.0f} {i} " + " ".join(
                        WORDS[(i + k) % len(WORDS)] for k in range(words)
                    )
                    pool.submit(
                        lambda p=prompt, o=out: self.answers.append(
                            stream_one(http, self.url, self.model, p, o, self.deadline_s)
                        )
                    )
                lap = self._now()

    def _cycle(self, n: int) -> None:
        """Odd cycles scale decode up by one and back; even ones SIGKILL the next process in turn."""
        if n % 2:
            members = len(self.pools.members("decode"))
            up = n % 4 == 1
            started, drained = self.pools.scale("decode", members + 1 if up else members - 1)
            self.events.append(
                f"{self._now():.0f}s scale decode {members}->{members + (1 if up else -1)} "
                f"{started or drained}"
            )
        else:
            order = ["prefill-0", "decode-0", "router", "prefill-1", "decode-1"]
            name = order[(n // 2) % len(order)]
            if name in self.stack.running:
                os.kill(self.stack.running[name].pid, signal.SIGKILL)
                self.events.append(f"{self._now():.0f}s kill -9 {name}")

    def run(self) -> tuple[list[Growth], dict[str, int], list[str]]:
        threads = [threading.Thread(target=f, daemon=True) for f in (self._sample_forever, self._replay)]
        for t in threads:
            t.start()
        n = 0
        while self._now() < self.duration_s:
            time.sleep(min(self.cycle_s, max(0.0, self.duration_s - self._now())))
            if self._now() < self.duration_s - 1:
                n += 1
                self._cycle(n)
        self._stop.set()
        for t in threads:
            t.join(timeout=self.deadline_s + 10)
        kinds: dict[str, int] = {}
        for a in self.answers:
            kinds[a.kind] = kinds.get(a.kind, 0) + 1
        return growth(self.samples, self.warmup_s, min_span_s=self.cycle_s), kinds, self.events

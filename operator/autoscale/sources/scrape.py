"""Metric source without Prometheus: scrape the router's and workers' /metrics directly and compute the
same windowed figures promql.py asks Prometheus for (rates and histogram quantiles from the counters'
change over the window, gauges summed over the pool's replicas)."""

from __future__ import annotations

import itertools
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tandem import names
from tandem.operator.autoscale.core.source import MetricsUnavailable, Target
from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas
from tandem.operator.autoscale.sources.observation import Figure, observation

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]
ROUTER = names.POOL_ROUTER


def parse(text: str) -> Samples:
    """Prometheus text exposition -> {(sample name, sorted labels): value}."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.endswith("_created"):
                out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (le, count) buckets: linear within the bucket the
    rank falls in; the highest finite bound when it falls in +Inf; NaN with no observations."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return math.nan
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return lower_bound
            if count == lower_count:
                return le
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    return ordered[-1][0]


@dataclass(frozen=True)
class Snapshot:
    at_s: float
    samples: Samples


class Window:
    """What one scraped endpoint said over time, enough to difference its counters across the window."""

    def __init__(self) -> None:
        self.history: deque[Snapshot] = deque()

    def add(self, snap: Snapshot, window_s: float) -> None:
        self.history.append(snap)
        while len(self.history) > 2 and self.history[1].at_s <= snap.at_s - window_s:
            self.history.popleft()  # keep one snapshot at or before the window's start

    def delta(self, name: str) -> dict[Labels, float]:
        """Counter increase per series between the oldest kept and the newest snapshot (a reset counts
        from zero)."""
        if len(self.history) < 2:
            return {}
        old, new = self.history[0].samples, self.history[-1].samples
        out = {}
        for (n, labels), value in new.items():
            if n == name:
                before = old.get((n, labels), 0.0)
                out[labels] = value - before if value >= before else value
        return out

    def slice_rates(self, name: str) -> tuple[float, ...]:
        """The counter's increase per second between consecutive snapshots (summed over series), oldest first:
        the window cut at each scrape, so a burst shorter than the window shows."""
        out = []
        for old, new in itertools.pairwise(self.history):
            dt = new.at_s - old.at_s
            if dt <= 0:
                continue
            grew = 0.0
            for (n, labels), value in new.samples.items():
                if n == name:
                    before = old.samples.get((n, labels), 0.0)
                    grew += value - before if value >= before else value
            out.append(grew / dt)
        return tuple(out)

    def current(self, name: str) -> dict[Labels, float]:
        if not self.history:
            return {}
        return {labels: v for (n, labels), v in self.history[-1].samples.items() if n == name}

    @property
    def span_s(self) -> float:
        return self.history[-1].at_s - self.history[0].at_s if len(self.history) >= 2 else 0.0


def summed_slices(per_router: list[tuple[float, ...]]) -> tuple[float, ...]:
    """The routers' slices added up, newest with newest: every router is scraped at the same ticks, and one
    that came up later has only the newer slices."""
    n = max(map(len, per_router), default=0)
    padded = [(0.0,) * (n - len(r)) + r for r in per_router]
    return tuple(sum(column) for column in zip(*padded, strict=True)) if padded else ()


def _sum(windows: Iterable[Window], pick: Callable[[Window], dict[Labels, float]]) -> float | None:
    values = [v for w in windows for v in pick(w).values()]
    return sum(values) if values else None


def _buckets(windows: Iterable[Window], name: str) -> list[tuple[float, float]]:
    by_le: dict[float, float] = {}
    for w in windows:
        for labels, v in w.delta(f"{name}_bucket").items():
            le = float(dict(labels)["le"])
            by_le[le] = by_le.get(le, 0.0) + v
    return list(by_le.items())


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def figures(pool: Pool, router: list[Window], workers: list[Window], percentile: float) -> dict[str, Figure]:
    """The PoolObservation fields promql.pool_queries names, from scraped windows (seconds for latencies)."""
    span = max((w.span_s for w in router), default=0.0)
    q = percentile / 100

    def rate(windows: list[Window], name: str) -> float | None:
        total = _sum(windows, lambda w: w.delta(name))
        return total / span if total is not None and span > 0 else None

    def mean(name: str) -> float | None:
        return _ratio(
            _sum(router, lambda w: w.delta(f"{name}_sum")), _sum(router, lambda w: w.delta(f"{name}_count"))
        )

    def quantile(windows: list[Window], name: str, qq: float) -> float | None:
        buckets = _buckets(windows, name)
        return histogram_quantile(qq, buckets) if buckets else None

    out: dict[str, Figure] = {
        "arrival_rate_rps": rate(router, names.REQUEST_ARRIVALS_TOTAL),
        "prompt_tokens_mean": mean(names.REQUEST_PROMPT_TOKENS),
        "prompt_tokens_p90": quantile(router, names.REQUEST_PROMPT_TOKENS, 0.9),
        "output_tokens_mean": mean(names.REQUEST_OUTPUT_TOKENS),
        "prefix_hit_rate": _ratio(
            _sum(workers, lambda w: w.delta(names.PREFIX_CACHE_HIT_TOKENS_TOTAL)),
            _sum(workers, lambda w: w.delta(names.PREFIX_CACHE_QUERIED_TOKENS_TOTAL)),
        ),
        "kv_usage": _ratio(
            _sum(workers, lambda w: w.current(names.KV_BLOCKS_USED)),
            _sum(workers, lambda w: w.current(names.KV_BLOCKS_TOTAL)),
        ),
    }
    slices = summed_slices([w.slice_rates(names.REQUEST_ARRIVALS_TOTAL) for w in router])
    out["arrival_rate_slices_rps"] = slices if len(slices) > 1 else None
    held_for = pool.value

    def for_pool(name: str) -> Callable[[Window], dict[Labels, float]]:
        return lambda w: {
            labels: v for labels, v in w.current(name).items() if dict(labels).get("role") == held_for
        }

    out["held_requests"] = _sum(router, for_pool(names.ROUTER_HELD_REQUESTS))
    oldest = [v for w in router for v in for_pool(names.ROUTER_HELD_OLDEST_SECONDS)(w).values()]
    out["held_oldest_s"] = max(oldest) if oldest else None
    if pool in (Pool.prefill, Pool.colocated):
        out["ttft_ms"] = quantile(router, names.TTFT_SECONDS, q)
        out["queued_prompt_tokens"] = _sum(workers, lambda w: w.current(names.PREFILL_QUEUED_TOKENS))
    if pool in (Pool.decode, Pool.colocated):
        out["tpot_ms"] = quantile(router, names.TPOT_SECONDS, q)
        out["running_sequences"] = _sum(workers, lambda w: w.current(names.DECODE_RUNNING_SEQUENCES))
    return out


MAX_SCRAPE_BYTES = 4 << 20  # a tandem pod's /metrics is tens of KiB; past this the target is skipped


def read_bounded(client: httpx.Client, url: str, limit: int) -> str:
    """The body at `url`, read as it streams in and given up past `limit` bytes (ValueError), so a pod that
    serves a huge or endless /metrics cannot grow the operator's memory."""
    with client.stream("GET", url) as resp:
        resp.raise_for_status()
        body = bytearray()
        for chunk in resp.iter_bytes():
            body += chunk
            if len(body) > limit:
                raise ValueError(f"{url}: /metrics larger than {limit} bytes")
    return body.decode("utf-8", errors="replace")


class ScrapeSource:
    """Scrapes every endpoint `targets()` names (keys: "router" and the pool names) on each observe."""

    def __init__(
        self,
        targets: Callable[[], Mapping[str, list[str]]],
        timeout_s: float = 2.0,
        client: httpx.Client | None = None,
    ):
        self.targets = targets
        self.client = client or httpx.Client(timeout=timeout_s)
        self.windows: dict[str, Window] = {}
        self._lock = threading.Lock()

    def _scrape(self, url: str, now_s: float, window_s: float) -> Window | None:
        try:
            samples = parse(read_bounded(self.client, url, MAX_SCRAPE_BYTES))
        except (httpx.HTTPError, ValueError):
            return None
        window = self.windows.setdefault(url, Window())
        window.add(Snapshot(now_s, samples), window_s)
        return window

    def observe(
        self, target: Target, replicas: Mapping[Pool, Replicas], now_s: float
    ) -> dict[Pool, PoolObservation]:
        with self._lock:
            urls = self.targets()
            scraped = {
                role: [w for w in (self._scrape(u, now_s, target.window_s) for u in us) if w is not None]
                for role, us in urls.items()
            }
            for gone in set(self.windows) - {u for us in urls.values() for u in us}:
                del self.windows[gone]  # a replica that left
        router = scraped.get(ROUTER, [])
        if not router:
            raise MetricsUnavailable(
                f"no router /metrics answered ({', '.join(urls.get(ROUTER, [])) or 'none known'})"
            )
        return {
            pool: observation(
                pool,
                figures(pool, router, scraped.get(pool.value, []), target.percentile),
                replicas.get(pool, Replicas(0)),
                now_s,
                target.window_s,
            )
            for pool in target.pools
        }

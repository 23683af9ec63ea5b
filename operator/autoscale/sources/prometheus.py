"""Metric source: the Prometheus HTTP API, running the queries of promql.py for each pool."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import httpx
import numpy as np

from tandem.operator.autoscale.core.source import MetricsUnavailable, Target
from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas
from tandem.operator.autoscale.sources import promql
from tandem.operator.autoscale.sources.observation import Figure, observation

Samples = Sequence[tuple[float, float]]  # one series' (time in seconds, counter value), oldest first


def slice_rates(series: Sequence[Samples], slice_s: float, count: int) -> tuple[float, ...] | None:
    """The rate of a counter in the last `count` slices of `slice_s` up to its newest sample, oldest first,
    summed over its series: each series' count (a reset counts from zero) read at the slices' edges, linear
    between its samples and flat outside them, so the slices are what the direct scrape cuts at each tick (a
    gap in the samples spreads its arrivals evenly over the slices it spans). Slices before the oldest sample
    are left out; None with fewer than two (a fresh Prometheus, no sample in the window): one slice is the
    window's mean, and the policy then sizes for the mean rate."""
    series = [s for s in series if s]
    if not series or slice_s <= 0:
        return None
    end, start = max(s[-1][0] for s in series), min(s[0][0] for s in series)
    edges = np.array([end - k * slice_s for k in range(count, -1, -1) if end - k * slice_s >= start])
    if len(edges) < 3:
        return None
    grown = np.zeros(len(edges) - 1)
    for s in series:
        times, values = np.array([t for t, _ in s]), np.array([v for _, v in s])
        steps = np.diff(values)
        counted = np.concatenate(([0.0], np.cumsum(np.where(steps >= 0, steps, values[1:]))))
        grown += np.diff(np.interp(edges, times, counted))
    return tuple(float(g) / slice_s for g in grown)


class PrometheusSource:
    def __init__(self, url: str, timeout_s: float = 5.0, client: httpx.Client | None = None):
        self.url = url.rstrip("/")
        self.client = client or httpx.Client(timeout=timeout_s)

    def _result(self, expr: str, at_s: float | None = None) -> list[dict]:
        """An instant query's result list. Raises MetricsUnavailable when Prometheus cannot answer."""
        params = {"query": expr} | ({"time": f"{at_s:.3f}"} if at_s is not None else {})
        try:
            resp = self.client.get(f"{self.url}/api/v1/query", params=params)
            body = resp.json()
        except (httpx.HTTPError, ValueError) as e:
            raise MetricsUnavailable(f"Prometheus at {self.url}: {e}") from e
        if resp.status_code != 200 or body.get("status") != "success":
            raise MetricsUnavailable(f"Prometheus at {self.url}: {resp.status_code} {body.get('error', '')}")
        return body["data"]["result"]

    def query(self, expr: str, at_s: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query: (labels, value) per series; an answer with no series is an empty list."""
        return [(s.get("metric", {}), float(s["value"][1])) for s in self._result(expr, at_s)]

    def samples(self, expr: str) -> list[list[tuple[float, float]]]:
        """A range selector's raw samples: (time, value) per series, oldest first."""
        return [[(float(t), float(v)) for t, v in s.get("values", [])] for s in self._result(expr)]

    def arrival_slices(self, target: Target) -> tuple[float, ...] | None:
        """The router's arrival rate in slices of the loop's interval over the window, oldest first."""
        count = max(1, math.ceil(target.window_s / target.interval_s - 1e-9))
        span = f"{math.ceil((count + 2) * target.interval_s)}s"  # a sample at or before the first edge
        expr = promql.arrival_samples(target.namespace, target.service, span)
        return slice_rates(self.samples(expr), target.interval_s, count)

    def observe(
        self, target: Target, replicas: Mapping[Pool, Replicas], now_s: float
    ) -> dict[Pool, PoolObservation]:
        window = f"{int(target.window_s)}s"
        slices = self.arrival_slices(target)
        out = {}
        for pool in target.pools:
            values: dict[str, Figure] = {"arrival_rate_slices_rps": slices}
            for name, expr in promql.pool_queries(
                pool, target.namespace, target.service, window, target.percentile
            ).items():
                series = self.query(expr)
                values[name] = series[0][1] if series else None
            out[pool] = observation(pool, values, replicas.get(pool, Replicas(0)), now_s, target.window_s)
        return out

    def held_by_pod(self, target: Target, pool: Pool) -> dict[str, float]:
        """Pod name -> work it holds now (running sequences or queued prompt tokens)."""
        expr = promql.held_by_pod(target.namespace, target.service, pool)
        return {labels["pod"]: value for labels, value in self.query(expr) if "pod" in labels}

    def attainment(self, target: Target) -> dict[str, float]:
        """SLO attainment over the window, by `slo` (ttft, tpot); absent when no request completed."""
        expr = promql.attainment(target.namespace, target.service, f"{int(target.window_s)}s")
        return {labels.get("slo", ""): value for labels, value in self.query(expr) if value == value}

"""Metric source: the Prometheus HTTP API, running the queries of promql.py for each pool."""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from tandem.operator.autoscale.core.source import MetricsUnavailable, Target
from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas
from tandem.operator.autoscale.sources import promql
from tandem.operator.autoscale.sources.observation import observation


class PrometheusSource:
    def __init__(self, url: str, timeout_s: float = 5.0, client: httpx.Client | None = None):
        self.url = url.rstrip("/")
        self.client = client or httpx.Client(timeout=timeout_s)

    def query(self, expr: str, at_s: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query: (labels, value) per series. Raises MetricsUnavailable when Prometheus cannot
        answer; an answer with no series is an empty list."""
        params = {"query": expr} | ({"time": f"{at_s:.3f}"} if at_s is not None else {})
        try:
            resp = self.client.get(f"{self.url}/api/v1/query", params=params)
            body = resp.json()
        except (httpx.HTTPError, ValueError) as e:
            raise MetricsUnavailable(f"Prometheus at {self.url}: {e}") from e
        if resp.status_code != 200 or body.get("status") != "success":
            raise MetricsUnavailable(f"Prometheus at {self.url}: {resp.status_code} {body.get('error', '')}")
        return [(s.get("metric", {}), float(s["value"][1])) for s in body["data"]["result"]]

    def observe(
        self, target: Target, replicas: Mapping[Pool, Replicas], now_s: float
    ) -> dict[Pool, PoolObservation]:
        window = f"{int(target.window_s)}s"
        out = {}
        for pool in target.pools:
            values: dict[str, float | None] = {}
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

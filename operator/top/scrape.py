"""`tandem top --router URL`: read routers' /metrics directly (no Prometheus), e.g. a local `tandem up`
stack. Counters are differenced between polls: latency quantiles over the recent window, SLO attainment
since the first poll (or since the router started, on the first one)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tandem import names
from tandem.operator.top.view import PoolState, ServiceState, histogram_quantile


@dataclass
class Sample:
    """One scrape of one service's router series (cumulative counters)."""

    at: float
    ttft: dict[float, float] = field(default_factory=dict)  # bucket upper bound -> cumulative count
    tpot: dict[float, float] = field(default_factory=dict)
    slo: dict[tuple[str, str], float] = field(default_factory=dict)  # (slo, met) -> count
    requests: dict[str, float] = field(default_factory=dict)  # status -> count
    targets: dict[str, float] = field(default_factory=dict)  # slo -> seconds
    objective: float | None = None
    workers: dict[str, float] = field(default_factory=dict)  # role -> routable workers


def parse(text: str, at: float) -> dict[str, Sample]:
    """A router's exposition text, by the `service` label of its series."""
    out: dict[str, Sample] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            service = s.labels.get("service")
            if service is None:
                continue
            sample = out.setdefault(service, Sample(at))
            if s.name in (names.TTFT_SECONDS + "_bucket", names.TPOT_SECONDS + "_bucket"):
                target = sample.ttft if s.name.startswith(names.TTFT_SECONDS) else sample.tpot
                target[float(s.labels["le"])] = target.get(float(s.labels["le"]), 0.0) + s.value
            elif s.name == names.SLO_REQUESTS_TOTAL:
                key = (s.labels["slo"], s.labels["met"])
                sample.slo[key] = sample.slo.get(key, 0.0) + s.value
            elif s.name == names.REQUESTS_TOTAL:
                sample.requests[s.labels["status"]] = sample.requests.get(s.labels["status"], 0.0) + s.value
            elif s.name == names.SLO_TARGET_SECONDS:
                sample.targets[s.labels["slo"]] = s.value
            elif s.name == names.SLO_OBJECTIVE_RATIO:
                sample.objective = s.value
            elif s.name == names.ROUTER_ROUTABLE_WORKERS:
                sample.workers[s.labels["role"]] = sample.workers.get(s.labels["role"], 0.0) + s.value
    return out


def merge(samples: Sequence[dict[str, Sample]]) -> dict[str, Sample]:
    """Several routers of one service add up (a service's router pool may have replicas)."""
    out: dict[str, Sample] = {}
    for by_service in samples:
        for service, s in by_service.items():
            if service not in out:
                out[service] = s
                continue
            o = out[service]
            for mine, theirs in (
                (o.ttft, s.ttft),
                (o.tpot, s.tpot),
                (o.slo, s.slo),
                (o.requests, s.requests),
                (o.workers, s.workers),
            ):
                _add(mine, theirs)
            o.targets.update(s.targets)
            o.objective = s.objective if s.objective is not None else o.objective
    return out


def _add(into: dict[Any, float], more: dict[Any, float]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0.0) + v


def _delta(cur: dict, prev: dict | None) -> dict:
    if prev is None:
        return dict(cur)
    return {k: v - prev.get(k, 0.0) for k, v in cur.items()}


def state(service: str, cur: Sample, window_start: Sample | None, first: Sample | None) -> ServiceState:
    """What the view shows for one service: quantiles between `window_start` and `cur`, attainment and
    rates between `first` and `cur` (each None: since the router started)."""
    q = cur.objective or 0.9
    win = window_start if window_start is not cur else None
    base = first if first is not cur else None
    st = ServiceState(service)
    st.ttft_s = histogram_quantile(q, list(_delta(cur.ttft, win.ttft if win else None).items()))
    st.tpot_s = histogram_quantile(q, list(_delta(cur.tpot, win.tpot if win else None).items()))
    st.slo_ttft_s, st.slo_tpot_s, st.objective = (
        cur.targets.get("ttft"),
        cur.targets.get("tpot"),
        cur.objective,
    )
    slo = _delta(cur.slo, base.slo if base else None)
    for name in ("ttft", "tpot"):
        met, missed = slo.get((name, "true"), 0.0), slo.get((name, "false"), 0.0)
        if met + missed > 0:
            st.attainment[name] = met / (met + missed)
    if base is not None and cur.at > base.at:
        req = _delta(cur.requests, base.requests)
        span = cur.at - base.at
        st.requests_per_s = sum(req.values()) / span
        st.errors_per_s = sum(v for k, v in req.items() if not k.startswith("2")) / span
    roles = ["colocated"] if cur.workers.get("colocated", 0) > 0 else ["prefill", "decode"]
    st.pools = {role: PoolState(ready=int(cur.workers[role])) for role in roles if role in cur.workers}
    return st


class RouterScrape:
    """Polls routers' /metrics; keeps recent samples to difference."""

    def __init__(self, urls: Sequence[str], window_s: float = 30.0, namespace: str | None = None):
        self.urls = [u.rstrip("/") + ("" if u.rstrip("/").endswith("/metrics") else "/metrics") for u in urls]
        self.window_s, self.namespace = window_s, namespace
        self.samples: deque[tuple[float, dict[str, Sample]]] = deque()
        self.first: dict[str, Sample] = {}
        self.http = httpx.Client(timeout=5)

    def poll(self) -> list[ServiceState]:
        now = time.monotonic()
        scraped, failed = [], []
        for url in self.urls:
            try:
                resp = self.http.get(url)
                resp.raise_for_status()
                scraped.append(parse(resp.text, now))
            except httpx.HTTPError as e:
                failed.append(f"{url}: {e}")  # a router away for a moment: show what the others say
        if failed and not scraped:
            raise RuntimeError("; ".join(failed))
        cur = merge(scraped)
        self.samples.append((now, cur))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()
        out = []
        for service, sample in cur.items():
            self.first.setdefault(service, sample)
            start = self.samples[0][1].get(service, sample)
            st = state(service, sample, start, self.first[service])
            st.namespace = self.namespace
            out.append(st)
        return out

    def close(self) -> None:
        self.http.close()

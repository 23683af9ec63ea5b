"""The router's Prometheus metrics: per-request latency histograms, request outcomes and queue depth, and
the per-request ones again under vLLM's names and buckets."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tandem import names
from tandem.names import (
    E2E_SECONDS,
    ITL_SECONDS,
    LENGTH_BUCKETS,
    METRIC_LABELS,
    POOL_ROUTER,
    PREFILL_ROUTE_LABEL,
    PREFILL_ROUTE_NONE,
    REQUEST_ARRIVALS_TOTAL,
    REQUEST_OUTPUT_TOKENS,
    REQUEST_PROMPT_TOKENS,
    REQUESTS_TOTAL,
    ROUTER_CONNECTED_WORKERS,
    ROUTER_DISCOVERY_STALE,
    ROUTER_HELD_OLDEST_SECONDS,
    ROUTER_HELD_REQUESTS,
    ROUTER_KV_PAIRS_CONNECTED,
    ROUTER_QUEUE_DEPTH,
    ROUTER_ROUTABLE_WORKERS,
    SLO_OBJECTIVE_RATIO,
    SLO_REQUESTS_TOTAL,
    SLO_TARGET_SECONDS,
    SLO_TPOT,
    SLO_TTFT,
    TOKEN_BUCKETS,
    TPOT_SECONDS,
    TTFT_BUCKETS,
    TTFT_SECONDS,
)
from tandem.slo import Slo
from tandem.worker.router.disaggregation import PrefillRoute
from tandem.worker.router.wake_queue import WakeQueue


@runtime_checkable
class Connections(Protocol):
    """The connections a backend opens before the first request needs them."""

    def connected_workers(self) -> dict[str, int]: ...

    def kv_pairs_connected(self) -> int: ...


E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600)

# vLLM's buckets for its names (vllm/v1/metrics/loggers.py), so its dashboards' quantiles read the same.
VLLM_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
VLLM_ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
VLLM_E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)

# Values of the `status` label of REQUESTS_TOTAL: the HTTP status the request ended with, as text.
# A stream that fails after it started counts with the error's status; a client that went away, 499.
STATUS_CLIENT_GONE = "499"

WORKER_ROLES = ("prefill", "decode", "colocated")  # the `role` label of the per-pool gauges


def mean_time_per_output_token(first_token_s: float, last_token_s: float, tokens: int) -> float | None:
    """TPOT of one request: decode time spread over the tokens after the first; None below two tokens."""
    if tokens < 2:
        return None
    return (last_token_s - first_token_s) / (tokens - 1)


def slo_outcomes(slo: Slo, ttft_s: float | None, tpot_s: float | None) -> dict[str, bool]:
    """Which SLOs one completed request met, by `slo` label value; a latency it lacks is not judged."""
    out = {}
    if ttft_s is not None:
        out[SLO_TTFT] = ttft_s <= slo.ttft_s
    if tpot_s is not None:
        out[SLO_TPOT] = tpot_s <= slo.tpot_s
    return out


class RouterMetrics:
    """The metric families of one router, in their own registry (so several apps can coexist)."""

    def __init__(
        self,
        service: str,
        queue_depth: Callable[[], float],
        registry: CollectorRegistry | None = None,
        slo: Slo | None = None,
        routable_workers: Callable[[], dict[str, int]] | None = None,
        discovery_stale: Callable[[], float] | None = None,
        connections: Connections | None = None,
        model_name: str = "model",
        wake_queue: WakeQueue | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.slo = slo or Slo()
        self.labels = {"service": service, "pool": POOL_ROUTER}
        assert tuple(self.labels) == METRIC_LABELS
        self.ttft, self.tpot, self.itl, self.e2e = self._latencies()
        self.vllm = VllmRequestMetrics(self.registry, model_name)
        self.requests, self.arrivals, self.prompt_tokens, self.output_tokens = self._request_counts()
        self._load_gauges(queue_depth, routable_workers, discovery_stale)
        if wake_queue is not None:
            self._held_gauges(wake_queue)
        if connections is not None:
            self._connection_gauges(connections)
        self.slo_requests = self._slo_series()

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        """A histogram under this router's labels alone."""
        return Histogram(name, doc, METRIC_LABELS, registry=self.registry, buckets=buckets).labels(
            **self.labels
        )

    def _latencies(self) -> tuple[Histogram, Histogram, Histogram, Histogram]:
        """TTFT (by where the prompt ran), TPOT, inter-token and end-to-end latency."""
        ttft = Histogram(
            TTFT_SECONDS,
            "Request arrival at the router to the first token out, by where the prompt ran",
            (*METRIC_LABELS, PREFILL_ROUTE_LABEL),
            registry=self.registry,
            buckets=TTFT_BUCKETS,
        )
        for route in (*PrefillRoute, "colocated", PREFILL_ROUTE_NONE):  # at 0 from the first scrape, so a
            ttft.labels(**self.labels, prefill=route)  # rate() in Prometheus counts a route's first requests
        tpot = self._histogram(
            TPOT_SECONDS, "Per-request mean time per output token after the first", TOKEN_BUCKETS
        )
        itl = self._histogram(ITL_SECONDS, "Time between consecutive output tokens", TOKEN_BUCKETS)
        e2e = self._histogram(
            E2E_SECONDS, "Request arrival to the last token of a completed request", E2E_BUCKETS
        )
        return ttft, tpot, itl, e2e

    def _request_counts(self) -> tuple[Counter, Counter, Histogram, Histogram]:
        """Requests by outcome, arrivals, and the prompt and output lengths."""
        requests = Counter(
            REQUESTS_TOTAL,
            "Requests by final HTTP status and where the prompt ran",
            (*METRIC_LABELS, "status", PREFILL_ROUTE_LABEL),
            registry=self.registry,
        )
        arrivals = Counter(
            REQUEST_ARRIVALS_TOTAL, "Requests that reached the router", METRIC_LABELS, registry=self.registry
        )
        prompt_tokens = self._histogram(
            REQUEST_PROMPT_TOKENS, "Prompt length of admitted requests (tokens)", LENGTH_BUCKETS
        )
        output_tokens = self._histogram(
            REQUEST_OUTPUT_TOKENS, "Output length of completed requests (tokens)", LENGTH_BUCKETS
        )
        return requests, arrivals.labels(**self.labels), prompt_tokens, output_tokens

    def _load_gauges(
        self,
        queue_depth: Callable[[], float],
        routable_workers: Callable[[], dict[str, int]] | None,
        discovery_stale: Callable[[], float] | None,
    ) -> None:
        """Read when scraped: requests in the router, workers it can route to by pool, names served stale."""
        self._gauge(ROUTER_QUEUE_DEPTH, "Requests admitted by the router and not yet finished", queue_depth)
        if routable_workers is not None:
            self._by_role(
                ROUTER_ROUTABLE_WORKERS,
                "Workers the router can route to, by pool",
                lambda role: routable_workers().get(role, 0),
            )
        if discovery_stale is not None:
            self._gauge(
                ROUTER_DISCOVERY_STALE,
                "Worker names whose last lookup failed, served from their last good addresses",
                discovery_stale,
            )

    def _gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        """A gauge under this router's labels alone, read when scraped."""
        Gauge(name, doc, METRIC_LABELS, registry=self.registry).labels(**self.labels).set_function(read)

    def _connection_gauges(self, connections: Connections) -> None:
        """What a first request would otherwise wait for: the router's channels, the prefill workers' KV
        channels (pairing.py)."""
        self._by_role(
            ROUTER_CONNECTED_WORKERS,
            "Workers whose channel from the router is connected now (TCP and TLS done), by pool",
            lambda role: connections.connected_workers().get(role, 0),
        )
        self._gauge(
            ROUTER_KV_PAIRS_CONNECTED,
            "Prefill-decode worker pairs whose KV channel the prefill worker has connected",
            connections.kv_pairs_connected,
        )

    def _held_gauges(self, queue: WakeQueue) -> None:
        """Requests held for a pool with no worker, and the oldest hold's age, by pool (wake_queue.py)."""
        self._by_role(
            ROUTER_HELD_REQUESTS,
            "Requests held while a pool they need has no worker (scaled to zero, waking)",
            queue.held,
        )
        self._by_role(
            ROUTER_HELD_OLDEST_SECONDS,
            "How long the oldest request held for a pool has waited",
            queue.oldest_s,
        )

    def _by_role(self, name: str, doc: str, read: Callable[[str], float]) -> None:
        """A gauge with one series per worker role, each read when scraped."""
        gauge = Gauge(name, doc, (*METRIC_LABELS, "role"), registry=self.registry)
        for role in WORKER_ROLES:
            gauge.labels(**self.labels, role=role).set_function(partial(read, role))

    def _slo_series(self) -> Counter:
        """The SLO's targets and objective, and completed requests by whether they met each target."""
        labels = (*METRIC_LABELS, "slo")
        target = Gauge(SLO_TARGET_SECONDS, "The SLO's latency target", labels, registry=self.registry)
        objective = Gauge(
            SLO_OBJECTIVE_RATIO,
            "Fraction of requests that must meet the SLO's target",
            labels,
            registry=self.registry,
        )
        for name, seconds in ((SLO_TTFT, self.slo.ttft_s), (SLO_TPOT, self.slo.tpot_s)):
            target.labels(**self.labels, slo=name).set(seconds)
            objective.labels(**self.labels, slo=name).set(self.slo.objective)
        slo_requests = Counter(
            SLO_REQUESTS_TOTAL,
            "Completed requests judged against the SLO, by whether they met it",
            (*labels, "met"),
            registry=self.registry,
        )
        for name in (SLO_TTFT, SLO_TPOT):  # both outcomes exist from the start, so ratios are 0, not absent
            for met in ("true", "false"):
                slo_requests.labels(**self.labels, slo=name, met=met)
        return slo_requests

    def start_request(self, clock: Callable[[], float] = time.perf_counter) -> RequestClock:
        self.arrivals.inc()
        return RequestClock(self, clock)

    def count(self, status: str, prefill: str = PREFILL_ROUTE_NONE) -> None:
        self.requests.labels(**self.labels, status=status, prefill=prefill).inc()

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class VllmRequestMetrics:
    """vLLM's per-request series (TTFT, inter-token latency, end-to-end latency, prompt and generated tokens)
    labelled with the served model's name, fed by the same observations as tandem's."""

    def __init__(self, r: CollectorRegistry, model_name: str) -> None:
        label = (names.VLLM_MODEL_LABEL,)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, label, registry=r, buckets=buckets).labels(model_name)

        self.ttft = histogram(
            names.VLLM_TTFT_SECONDS, "Histogram of time to first token in seconds.", VLLM_TTFT_BUCKETS
        )
        self.itl = histogram(
            names.VLLM_ITL_SECONDS, "Histogram of inter-token latency in seconds.", VLLM_ITL_BUCKETS
        )
        self.e2e = histogram(
            names.VLLM_E2E_SECONDS, "Histogram of e2e request latency in seconds.", VLLM_E2E_BUCKETS
        )
        self.prompt_tokens = Counter(
            names.VLLM_PROMPT_TOKENS, "Number of prefill tokens processed.", label, registry=r
        ).labels(model_name)
        self.generation_tokens = Counter(
            names.VLLM_GENERATION_TOKENS, "Number of generation tokens processed.", label, registry=r
        ).labels(model_name)


class RequestClock:
    """Times one request from its arrival; observes TTFT and ITL as tokens come, the rest at the end."""

    def __init__(self, metrics: RouterMetrics, clock: Callable[[], float]) -> None:
        self.metrics, self.clock = metrics, clock
        self.arrival = clock()
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.tokens = 0
        self.prompt_tokens = 0
        self.status: str | None = None
        self.route_of: Callable[[], str] = lambda: ""  # where the prompt ran, once the backend routed it

    @property
    def route(self) -> str:
        return self.route_of() or PREFILL_ROUTE_NONE

    def on_prompt(self, num_tokens: int) -> None:
        """The request was tokenized and admitted: its prompt length."""
        self.metrics.prompt_tokens.observe(num_tokens)
        self.prompt_tokens = num_tokens

    def on_token(self) -> None:
        now, vllm = self.clock(), self.metrics.vllm
        if self.last_token is None:
            self.first_token = now
            self.metrics.ttft.labels(**self.metrics.labels, prefill=self.route).observe(now - self.arrival)
            vllm.ttft.observe(now - self.arrival)
            vllm.prompt_tokens.inc(self.prompt_tokens)  # vLLM counts a prompt once it is prefilled
        else:
            self.metrics.itl.observe(now - self.last_token)
            vllm.itl.observe(now - self.last_token)
        vllm.generation_tokens.inc()
        self.last_token = now
        self.tokens += 1

    def finish(self, status: str) -> None:
        """Record the outcome once; latency of the whole request only for completed ones."""
        if self.status is not None:
            return
        self.status = status
        self.metrics.count(status, self.route)
        if status != "200" or self.first_token is None or self.last_token is None:
            return
        e2e = self.clock() - self.arrival
        self.metrics.e2e.observe(e2e)
        self.metrics.vllm.e2e.observe(e2e)
        self.metrics.output_tokens.observe(self.tokens)
        tpot = mean_time_per_output_token(self.first_token, self.last_token, self.tokens)
        if tpot is not None:
            self.metrics.tpot.observe(tpot)
        for slo, met in slo_outcomes(self.metrics.slo, self.first_token - self.arrival, tpot).items():
            self.metrics.slo_requests.labels(**self.metrics.labels, slo=slo, met=str(met).lower()).inc()

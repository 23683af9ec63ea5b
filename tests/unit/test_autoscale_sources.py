"""The autoscaler's metric sources, without a cluster: the PromQL is the dashboard's, Prometheus' quantile
rule, and the direct scrape over real /metrics endpoints of the router's and workers' registries."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tandem import names
from tandem.operator.autoscale.core.source import MetricsUnavailable, Target
from tandem.operator.autoscale.core.types import Pool, Replicas
from tandem.operator.autoscale.sources import promql
from tandem.operator.autoscale.sources.prometheus import PrometheusSource, slice_rates
from tandem.operator.autoscale.sources.scrape import (
    ScrapeSource,
    Snapshot,
    Window,
    figures,
    histogram_quantile,
)
from tandem.worker.router.metrics import RouterMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "charts/tandem/dashboards/tandem.json"


def _dashboard_exprs() -> set[str]:
    dash = json.loads(DASHBOARD.read_text())
    panels = [q for p in dash["panels"] for q in (p.get("panels", []) if p.get("type") == "row" else [p])]
    return {t["expr"] for p in panels for t in p.get("targets", [])}


@pytest.mark.parametrize("pool", [Pool.prefill, Pool.decode])
def test_every_query_the_autoscaler_runs_is_charted_on_the_dashboard(pool):
    charted = _dashboard_exprs()
    queries = promql.pool_queries(
        pool, "$namespace", "$service", "$__rate_interval", 90, op="=~", pool_value="$pool"
    )
    missing = {name: q for name, q in queries.items() if q not in charted}
    assert not missing, missing
    assert promql.attainment("$namespace", "$service", "$__rate_interval", op="=~") in charted
    # the arrival slices are a range selector, which Grafana cannot chart: it charts the rate between scrapes
    samples = promql.arrival_samples("$namespace", "$service", "$__rate_interval", op="=~")
    assert f"sum by (namespace, service) (irate({samples}))" in charted


@pytest.mark.parametrize(
    "q, buckets, expected",
    [
        (0.5, [(1, 0), (2, 10), (math.inf, 10)], 1.5),  # halfway through the (1, 2] bucket
        (0.9, [(0.1, 5), (0.2, 10), (math.inf, 10)], 0.18),
        (0.5, [(0.1, 10), (math.inf, 10)], 0.05),  # first bucket: from zero
        (0.99, [(0.1, 5), (math.inf, 10)], 0.1),  # falls in +Inf: the highest finite bound
    ],
)
def test_histogram_quantile_follows_prometheus(q, buckets, expected):
    assert histogram_quantile(q, buckets) == pytest.approx(expected)


def test_histogram_quantile_of_nothing_is_nan():
    assert math.isnan(histogram_quantile(0.9, [(1, 0), (math.inf, 0)]))


def _serve(registry: CollectorRegistry) -> tuple[str, object]:
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    return f"http://127.0.0.1:{server.server_port}/metrics", server


def _requests(metrics: RouterMetrics, ttfts: list[float], tpot: float, tokens: int, prompt: int) -> None:
    """Completed requests with the given TTFTs, each `tokens` long at `tpot`, on a scripted clock."""
    for ttft in ttfts:
        now = [0.0]
        clock = metrics.start_request(lambda now=now: now[0])
        clock.on_prompt(prompt)
        for i in range(tokens):
            now[0] = ttft + i * tpot
            clock.on_token()
        clock.finish("200")


def test_direct_scrape_reads_the_window_from_real_endpoints():
    router = RouterMetrics("svc", lambda: 0)
    worker_registry = CollectorRegistry()
    labels = list(names.METRIC_LABELS)
    queued = Gauge(names.PREFILL_QUEUED_TOKENS, "q", labels, registry=worker_registry).labels(
        service="svc", pool="prefill"
    )
    used = Gauge(names.KV_BLOCKS_USED, "u", labels, registry=worker_registry).labels(
        service="svc", pool="prefill"
    )
    total = Gauge(names.KV_BLOCKS_TOTAL, "t", labels, registry=worker_registry).labels(
        service="svc", pool="prefill"
    )
    router_url, router_server = _serve(router.registry)
    worker_url, worker_server = _serve(worker_registry)
    try:
        _requests(router, [0.04] * 10, 0.01, 8, 100)  # before the window: must not count
        source = ScrapeSource(
            lambda: {"router": [router_url], "prefill": [worker_url, "http://127.0.0.1:1/metrics"]}
        )
        target = Target("ns", "svc", (Pool.prefill, Pool.decode), window_s=60, percentile=90)
        first = source.observe(target, {Pool.prefill: Replicas(2)}, now_s=100.0)
        assert first[Pool.prefill].arrival_rate_rps is None  # one scrape: no rate yet
        _requests(router, [0.15] * 9 + [0.4], 0.02, 11, 300)
        queued.set(700)
        used.set(30)
        total.set(120)
        obs = source.observe(target, {Pool.prefill: Replicas(2)}, now_s=110.0)
    finally:
        router_server.shutdown()  # type: ignore[attr-defined]
        worker_server.shutdown()  # type: ignore[attr-defined]
    prefill, decode = obs[Pool.prefill], obs[Pool.decode]
    assert prefill.arrival_rate_rps == pytest.approx(10 / 10.0)  # 10 requests in the 10 s between scrapes
    assert prefill.prompt_tokens_mean == pytest.approx(300)
    assert prefill.output_tokens_mean == pytest.approx(11)
    # p90 of nine 150 ms and one 400 ms TTFT, interpolated in the (0.1, 0.15] bucket: the rank 9 of 10
    assert prefill.ttft_ms == pytest.approx(150.0)
    assert decode.tpot_ms is not None and 15 < decode.tpot_ms <= 20  # 20 ms per token, in the (15, 20] bucket
    assert prefill.queued_prompt_tokens == 700 and prefill.kv_usage == pytest.approx(0.25)
    assert prefill.replicas == Replicas(2) and prefill.window_s == 60


def test_sources_that_cannot_be_read_say_so():
    target = Target("ns", "svc", (Pool.decode,))
    with pytest.raises(MetricsUnavailable):
        ScrapeSource(lambda: {"router": ["http://127.0.0.1:1/metrics"]}).observe(target, {}, 0.0)
    with pytest.raises(MetricsUnavailable):
        PrometheusSource("http://127.0.0.1:1", timeout_s=1).observe(target, {}, 0.0)


def test_the_direct_scrape_reads_a_bounded_number_of_bytes():
    """A pod serving an endless /metrics over a real socket: the read stops past the bound, the target is
    skipped."""
    import http.server
    import threading

    import httpx

    from tandem.operator.autoscale.sources.scrape import read_bounded

    sent = []

    class Endless(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(10_000):  # 640 MiB if nobody stopped reading
                    self.wfile.write(b"# " + b"x" * 65534 + b"\n")
                    sent.append(1)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with httpx.Client(timeout=5) as client:
            with pytest.raises(ValueError, match="larger than"):
                read_bounded(client, url, 1 << 20)
        assert len(sent) < 10_000
    finally:
        server.shutdown()


def test_the_window_cut_at_each_scrape_gives_the_arrival_slices():
    """A burst shorter than the window shows in the slices (the policy and the shape rule size for it), not in
    the window's mean rate."""
    router, series = Window(), (names.REQUEST_ARRIVALS_TOTAL, (("pool", "router"),))
    for at, total in ((0.0, 0.0), (15.0, 15.0), (30.0, 30.0), (45.0, 180.0)):
        router.add(Snapshot(at, {series: total}), window_s=60.0)
    assert router.slice_rates(names.REQUEST_ARRIVALS_TOTAL) == (1.0, 1.0, 10.0)
    out = figures(Pool.prefill, [router], [], 90)
    assert out["arrival_rate_rps"] == pytest.approx(4.0)
    assert out["arrival_rate_slices_rps"] == (1.0, 1.0, 10.0)
    one = Window()
    one.add(Snapshot(0.0, {series: 0.0}), 60.0)
    one.add(Snapshot(15.0, {series: 15.0}), 60.0)
    assert figures(Pool.prefill, [one], [], 90)["arrival_rate_slices_rps"] is None  # one slice is the mean
    # two routers share the traffic: their slices add up, as Prometheus' sum over the series does
    late = Window()
    for at, total in ((30.0, 0.0), (45.0, 30.0)):
        late.add(Snapshot(at, {series: total}), window_s=60.0)
    assert figures(Pool.prefill, [router, late], [], 90)["arrival_rate_slices_rps"] == (1.0, 1.0, 12.0)


def _counter(rate_at, until_s: float, every_s: float) -> list[tuple[float, float]]:
    """A counter sampled every `every_s` from 0 to `until_s`, growing at `rate_at(t)` per second."""
    out, total, t = [(0.0, 0.0)], 0.0, 0.0
    while t < until_s:
        total += rate_at(t) * every_s
        t += every_s
        out.append((t, total))
    return out


def test_prometheus_slices_cut_the_counters_samples_where_the_direct_scrape_cuts_its_window():
    """1 req/s with a 15 s burst at 10 req/s, scraped every 5 s: the slices of the loop's 15 s interval are
    the rates between the direct scrape's ticks, and a Prometheus rate() over the window would average the
    burst away."""
    samples = _counter(lambda t: 10.0 if 45 <= t < 60 else 1.0, 75, 5)
    assert slice_rates([samples], 15, 4) == pytest.approx((1.0, 1.0, 10.0, 1.0))
    router, series = Window(), (names.REQUEST_ARRIVALS_TOTAL, (("pool", "router"),))
    for at, total in samples:
        if at % 15 == 0:  # the direct scrape ticks every 15 s
            router.add(Snapshot(at, {series: total}), window_s=60.0)
    assert router.slice_rates(names.REQUEST_ARRIVALS_TOTAL) == pytest.approx(slice_rates([samples], 15, 4))
    # a scrape slower than the slices: the count is read between its samples, linear
    sparse = [(t, v) for t, v in samples if t % 15 == 0]
    assert slice_rates([sparse], 7.5, 8) == pytest.approx((1.0, 1.0, 1.0, 1.0, 10.0, 10.0, 1.0, 1.0))


def test_prometheus_slices_sum_routers_and_count_a_reset_from_zero():
    steady = [(float(t), 2.0 * t) for t in range(0, 31, 5)]  # 2 req/s throughout
    restarted = [
        (0.0, 500.0),
        (5.0, 505.0),
        (10.0, 3.0),
        (15.0, 8.0),
        (20.0, 13.0),
        (25.0, 18.0),
        (30.0, 23.0),
    ]
    late = [
        (20.0, 100.0),
        (25.0, 110.0),
        (30.0, 120.0),
    ]  # a router that came up mid-window: 2 req/s from 20 s
    # the reset between 5 s and 10 s counts the 3 the new process saw: 3/5 req/s in place of 1 req/s
    assert slice_rates([steady, restarted, late], 10, 3) == pytest.approx((2 + 0.8, 2 + 1.0, 2 + 1.0 + 2.0))


@pytest.mark.parametrize(
    "series",
    [
        [],  # a fresh Prometheus: no series yet
        [[]],
        [[(0.0, 4.0)]],  # one sample: no rate
        [[(0.0, 4.0), (12.0, 16.0)]],  # 12 s of samples: one 10 s slice, which is the mean
    ],
)
def test_prometheus_slices_need_two_slices_of_samples(series):
    assert slice_rates(series, 10, 6) is None


def _prometheus_answering(results: dict[str, dict]) -> PrometheusSource:
    """A PrometheusSource whose HTTP client gets Prometheus' JSON answer for each query it names (an empty
    vector for the rest): the parsing, below the edge tests/integration/test_prometheus_slices_live.py
    crosses with a real Prometheus."""

    def answer(request: httpx.Request) -> httpx.Response:
        data = results.get(request.url.params["query"], {"resultType": "vector", "result": []})
        return httpx.Response(200, json={"status": "success", "data": data})

    return PrometheusSource(
        "http://prometheus:9090", client=httpx.Client(transport=httpx.MockTransport(answer))
    )


def test_prometheus_source_parses_the_slices_and_leaves_them_out_without_samples():
    target = Target("ns", "svc", (Pool.prefill,), window_s=30, percentile=90, interval_s=10)
    samples = promql.arrival_samples("ns", "svc", "50s")  # three slices and two to find the first edge
    mean = promql.pool_queries(Pool.prefill, "ns", "svc", "30s", 90)["arrival_rate_rps"]
    matrix = {
        "metric": {"namespace": "ns", "service": "svc", "pool": "router"},
        "values": [[t, str(v)] for t, v in _counter(lambda t: 9.0 if t >= 30 else 1.0, 40, 5)],
    }
    answers = {
        samples: {"resultType": "matrix", "result": [matrix]},
        mean: {"resultType": "vector", "result": [{"metric": {}, "value": [40, "3.6667"]}]},
    }
    obs = _prometheus_answering(answers).observe(target, {}, 40.0)[Pool.prefill]
    assert obs.arrival_rate_slices_rps == pytest.approx((1.0, 1.0, 9.0))
    assert obs.arrival_rate_rps == pytest.approx(3.6667)
    fresh = _prometheus_answering(answers | {samples: {"resultType": "matrix", "result": []}})
    obs = fresh.observe(target, {}, 40.0)[Pool.prefill]
    assert obs.arrival_rate_slices_rps is None and obs.arrival_rate_rps == pytest.approx(3.6667)

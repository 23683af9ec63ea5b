"""The Prometheus source sizes for bursts as the direct scrape does: a real Prometheus and the direct scrape
read the same router's /metrics (the router's own metrics registry, served over HTTP) while its arrival
counter follows a calm rate with a burst shorter than the window; both give arrival slices whose burst rate
(what the policy sizes prefill for) is the burst's. The test waits on what it needs (Prometheus holding a
sample past the last tick), never on a sleep."""

from __future__ import annotations

import time

import pytest
from prometheus_client import start_http_server

from tandem.operator.autoscale.core.capacity import burst_rate
from tandem.operator.autoscale.core.source import Target
from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas
from tandem.operator.autoscale.sources.prometheus import PrometheusSource
from tandem.operator.autoscale.sources.scrape import ScrapeSource
from tandem.worker.router.metrics import RouterMetrics
from tests.prometheus import Target as Scraped

NAMESPACE, SERVICE = "team-b", "bursty"
INTERVAL_S, WINDOW_S = 2.0, 16.0  # the loop's interval (the slices' length) and window: 8 slices
CALM_RPS, BURST_RPS, BURST_FROM_S, BURST_TO_S = 1.0, 10.0, 6.0, 12.0  # three slices of burst
TICKS_S = 18.0  # the direct scrape ticks every interval until then, then once more beside Prometheus
# Prometheus scrapes every 1 s and reads the count between its samples, the direct scrape reads it at its
# ticks: the slices' edges differ by up to a second, so the burst rates agree within this share.
TOLERANCE = 0.15


def _arrivals_due(elapsed_s: float) -> int:
    """Requests that should have arrived `elapsed_s` into the traffic: calm, with the burst on top."""
    burst_s = min(max(elapsed_s - BURST_FROM_S, 0.0), BURST_TO_S - BURST_FROM_S)
    return int(CALM_RPS * elapsed_s + (BURST_RPS - CALM_RPS) * burst_s)


def test_prometheus_gives_the_direct_scrapes_arrival_slices_for_a_burst(prometheus):
    router = RouterMetrics(SERVICE, lambda: 0)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=router.registry)
    try:
        address = f"127.0.0.1:{server.server_port}"
        prom = prometheus([Scraped(address, {"namespace": NAMESPACE})], scrape_interval="1s")
        prom.wait_targets_up()
        target = Target(NAMESPACE, SERVICE, (Pool.prefill,), WINDOW_S, 90.0, INTERVAL_S)
        replicas = {Pool.prefill: Replicas(1)}
        source = PrometheusSource(prom.url)
        nobody = source.observe(
            Target(NAMESPACE, "nobody", (Pool.prefill,), WINDOW_S, 90.0, INTERVAL_S), {}, 0
        )
        scrape = ScrapeSource(lambda: {"router": [f"http://{address}/metrics"]})
        start = time.time()
        fed = 0

        def feed() -> float:
            """Move the counter to what the schedule says by now; the time it stood for."""
            nonlocal fed
            now = time.time()
            due = _arrivals_due(now - start)
            router.arrivals.inc(due - fed)
            fed = due
            return now

        tick = 0.0
        while tick <= TICKS_S:
            while time.time() < start + tick:
                feed()
                time.sleep(0.02)
            scrape.observe(target, replicas, feed())
            tick += INTERVAL_S
        last_tick = time.time()
        stamp = f'timestamp(tandem_request_arrivals_total{{namespace="{NAMESPACE}"}})'
        while not any(v > last_tick for _, v in source.query(stamp)):  # Prometheus has scraped past it
            feed()
            time.sleep(0.05)
        direct = scrape.observe(target, replicas, feed())[Pool.prefill]
        via_prom = source.observe(target, replicas, time.time())[Pool.prefill]
    finally:
        server.shutdown()

    def burst(obs: PoolObservation) -> float:
        assert obs.arrival_rate_slices_rps is not None
        slices = obs.arrival_rate_slices_rps
        return burst_rate(slices, target.percentile, obs.window_s / len(slices))

    # the schedule's own slices give the burst's rate less the share of their spread Poisson noise explains
    scheduled = [CALM_RPS] * 5 + [BURST_RPS] * 3
    expected = burst_rate(scheduled, target.percentile, INTERVAL_S)
    assert expected == pytest.approx(BURST_RPS, rel=0.1)

    slices = via_prom.arrival_rate_slices_rps
    assert slices is not None and len(slices) == WINDOW_S / INTERVAL_S, slices
    assert max(slices) == pytest.approx(BURST_RPS, rel=TOLERANCE), slices
    assert sum(s < 2 * CALM_RPS for s in slices) >= 3, slices  # the calm before and after the burst
    assert burst(via_prom) == pytest.approx(burst(direct), rel=TOLERANCE), (slices, direct)
    assert burst(direct) == pytest.approx(expected, rel=TOLERANCE), direct
    # the window's mean is well below the burst: without the slices the policy would size for the mean
    assert via_prom.arrival_rate_rps is not None and burst(via_prom) > 1.8 * via_prom.arrival_rate_rps
    # a service Prometheus holds no arrivals for: no slices and no rate, not an error
    assert nobody[Pool.prefill].arrival_rate_slices_rps is None
    assert nobody[Pool.prefill].arrival_rate_rps is None

"""Both metric sources read a live local stack under load: the Prometheus HTTP API (a real Prometheus
scraping the stack) and the direct scrape of the same /metrics endpoints agree on what they observe,
and a stopped Prometheus reads as MetricsUnavailable. The test waits on what it needs (requests served,
every target scraped after the load stopped), never on a sleep."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import httpx
import pytest

from tandem.operator.autoscale.core.source import MetricsUnavailable, Target
from tandem.operator.autoscale.core.types import Pool, Replicas
from tandem.operator.autoscale.sources.prometheus import PrometheusSource
from tandem.operator.autoscale.sources.scrape import ScrapeSource
from tandem.operator.local.scale import LocalPools
from tandem.spec import parse_object
from tests.integration.stacks import metrics_targets, running_stack, spec
from tests.prometheus import require, running_prometheus

pytestmark = pytest.mark.slow
NAMESPACE, SERVICE = "team-a", "src"
LOAD_REQUESTS = (
    24  # before the mid-load look, half as many after: enough that a series' first sample is a small part
)


def _load(url: str, stop: threading.Event, done: list[int]) -> None:
    body = {"model": "tiny", "max_tokens": 12, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as http:
        n = 0
        while not stop.is_set():
            n += 1
            with http.stream(
                "POST", f"{url}/v1/completions", json={**body, "prompt": "word " * (20 + n % 30)}
            ) as r:
                r.read()
            done.append(r.status_code)


def _until(what: str, check, timeout_s: float = 120.0) -> None:
    """Wait for an event; the timeout is for a hang, not for a slow host."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _scraped_after(prom, t: float) -> bool:
    """Prometheus scraped every target after the wall-clock time `t` (each target's `up` sample is newer)."""
    found = prom.query("min(timestamp(up))")
    return bool(found) and float(found[0]["value"][1]) > t


def test_prometheus_and_direct_scrape_observe_the_same_stack(tiny_model_dir, tmp_path: Path):
    require("prometheus")
    obj = spec(SERVICE, tiny_model_dir)
    with running_stack(obj, tmp_path / "stack") as (stack, url):
        pools = LocalPools(stack, parse_object(obj), Path.cwd(), tmp_path / "stack" / "workers.json")
        with running_prometheus(metrics_targets(stack, SERVICE, NAMESPACE), tmp_path / "prom") as prom:
            prom.wait_targets_up()
            target = Target(NAMESPACE, SERVICE, (Pool.prefill, Pool.decode), window_s=30, percentile=90)
            replicas = {Pool.prefill: Replicas(1), Pool.decode: Replicas(1)}
            scrape = ScrapeSource(pools.metrics_targets)
            scrape.observe(target, replicas, time.time())  # the window's start for the direct scrape
            start = time.time()
            stop = threading.Event()
            done: list[int] = []
            clients = [threading.Thread(target=_load, args=(url, stop, done), daemon=True) for _ in range(2)]
            for c in clients:
                c.start()
            _until("requests served under load", lambda: len(done) >= LOAD_REQUESTS)
            during = scrape.observe(
                Target(NAMESPACE, SERVICE, target.pools, window_s=30), replicas, time.time()
            )
            served = len(done)
            _until(
                "more requests served after the observation", lambda: len(done) >= served + LOAD_REQUESTS // 2
            )
            stop.set()
            for c in clients:
                c.join(timeout=60)
            stopped = time.time()
            _until("Prometheus scraping the last counts", lambda: _scraped_after(prom, stopped))
            now = time.time()
            direct = scrape.observe(
                Target(NAMESPACE, SERVICE, target.pools, window_s=now - start + 1), replicas, now
            )
            # both windows hold the whole load, however long a busy host made it
            whole = Target(
                NAMESPACE, SERVICE, target.pools, window_s=max(target.window_s, math.ceil(now - start) + 2)
            )
            via_prom = PrometheusSource(prom.url).observe(whole, replicas, now)
            attained = PrometheusSource(prom.url).attainment(target)
        with pytest.raises(MetricsUnavailable):  # Prometheus stopped
            PrometheusSource(prom.url, timeout_s=2).observe(target, replicas, time.time())
    for pool in target.pools:
        d, p = direct[pool], via_prom[pool]
        for field in ("prompt_tokens_mean", "output_tokens_mean"):
            assert getattr(d, field) == pytest.approx(getattr(p, field), rel=0.05), (pool, field)
        assert d.arrival_rate_rps and p.arrival_rate_rps  # both saw traffic (Prometheus extrapolates rates)
        assert d.output_tokens_mean == pytest.approx(12)
    # the same histogram buckets: the same percentile, whichever source interpolates
    assert direct[Pool.prefill].ttft_ms == pytest.approx(via_prom[Pool.prefill].ttft_ms, rel=0.1)
    assert direct[Pool.decode].tpot_ms == pytest.approx(via_prom[Pool.decode].tpot_ms, rel=0.1)
    # the gauges the policy's stalled-pool and batch rules read are exported by the workers themselves
    assert (
        during[Pool.prefill].queued_prompt_tokens is not None
        and during[Pool.prefill].queued_prompt_tokens >= 0
    )
    assert during[Pool.decode].running_sequences is not None and during[Pool.decode].running_sequences >= 0
    assert during[Pool.decode].kv_usage is not None and 0 <= during[Pool.decode].kv_usage <= 1
    for pool, field in ((Pool.prefill, "queued_prompt_tokens"), (Pool.decode, "running_sequences")):
        assert getattr(via_prom[pool], field) == getattr(direct[pool], field) == 0, (
            pool,
            field,
        )  # idle again
    assert set(attained) == {"ttft", "tpot"} and all(0 <= v <= 1 for v in attained.values())

"""Both metric sources read a live local stack under load: the Prometheus HTTP API (a real Prometheus
scraping the stack) and the direct scrape of the same /metrics endpoints agree on what they observe,
and a stopped Prometheus reads as MetricsUnavailable."""

from __future__ import annotations

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


def _load(url: str, stop: threading.Event) -> None:
    body = {"model": "tiny", "max_tokens": 12, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as http:
        n = 0
        while not stop.is_set():
            n += 1
            with http.stream("POST", f"{url}/v1/completions", json={**body, "prompt": "word " * (20 + n % 30)}) as r:
                r.read()


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
            clients = [threading.Thread(target=_load, args=(url, stop), daemon=True) for _ in range(2)]
            for c in clients:
                c.start()
            time.sleep(6)
            during = scrape.observe(Target(NAMESPACE, SERVICE, target.pools, window_s=30), replicas, time.time())
            time.sleep(2)
            stop.set()
            for c in clients:
                c.join(timeout=60)
            time.sleep(2.5)  # Prometheus scrapes the last counts (1 s interval)
            now = time.time()
            direct = scrape.observe(Target(NAMESPACE, SERVICE, target.pools, window_s=now - start + 1), replicas, now)
            via_prom = PrometheusSource(prom.url).observe(target, replicas, now)
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
    assert during[Pool.prefill].queued_prompt_tokens is not None and during[Pool.prefill].queued_prompt_tokens >= 0
    assert during[Pool.decode].running_sequences is not None and during[Pool.decode].running_sequences >= 0
    assert during[Pool.decode].kv_usage is not None and 0 <= during[Pool.decode].kv_usage <= 1
    for pool, field in ((Pool.prefill, "queued_prompt_tokens"), (Pool.decode, "running_sequences")):
        assert getattr(via_prom[pool], field) == getattr(direct[pool], field) == 0, (pool, field)  # idle again
    assert set(attained) == {"ttft", "tpot"} and all(0 <= v <= 1 for v in attained.values())


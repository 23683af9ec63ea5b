"""Waking a pool from zero and letting it rest there: the wake rule alone, inside the policy, and the held
requests as both metric sources read them from a real router registry."""

from dataclasses import replace

import pytest
from prometheus_client import start_http_server

from tandem.operator.autoscale.core.config import PoolLimits
from tandem.operator.autoscale.core.policy import PolicyState
from tandem.operator.autoscale.core.source import Target
from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas
from tandem.operator.autoscale.core.wake import WAKE_FROM_ZERO, wake_from_zero
from tandem.operator.autoscale.sources import promql
from tandem.operator.autoscale.sources.scrape import ScrapeSource
from tandem.worker.router.metrics import RouterMetrics
from tandem.worker.router.wake_queue import WakeQueue
from tests.unit.test_autoscale_policy import CONFIG, NOW, decode, once

ZERO_MIN = replace(CONFIG, limits={Pool.prefill: PoolLimits(0, 4), Pool.decode: PoolLimits(0, 4)})


def at_zero(held: float | None, starting: int = 0, **kw) -> PoolObservation:
    """A decode pool with no replica: no latency of its own, arrivals only at the router."""
    return decode(ready=0, starting=starting, tpot_ms=None, output_tokens_mean=None, held_requests=held, **kw)


@pytest.mark.parametrize(
    "obs,limits,desired",
    [
        (at_zero(3, held_oldest_s=4.2), PoolLimits(0, 4), 1),
        (at_zero(1), PoolLimits(2, 4), 2),  # the pool's minimum, if it has one
        (at_zero(0), PoolLimits(0, 4), None),  # nothing held: nothing to wake for
        (at_zero(None), PoolLimits(0, 4), None),  # the metric is missing (an older router)
        (at_zero(2, starting=1), PoolLimits(0, 4), None),  # the first replica is already on its way
        (decode(ready=1, held_requests=2), PoolLimits(0, 4), None),  # not at zero
    ],
)
def test_wake_rule(obs, limits, desired):
    d = wake_from_zero(obs, limits)
    assert (d.desired if d else None) == desired
    if d is not None:
        assert d.current == 0 and d.reason_code == WAKE_FROM_ZERO and "held" in d.reason


def test_the_policy_wakes_a_pool_at_zero_before_it_looks_for_latencies():
    d, state = once(at_zero(3, held_oldest_s=2.0), config=ZERO_MIN)
    assert (d.current, d.desired, d.reason_code) == (0, 1, WAKE_FROM_ZERO)
    assert d.reason == "decode 0->1: 3 requests held for 2 s by the router with no decode worker"
    # the next tick sees the replica starting and waits for it instead of asking again
    d2, _ = once(at_zero(3, starting=1), state, ZERO_MIN, NOW + 15)
    assert d2.desired == 1 and not d2.changes


def test_a_waking_pool_is_not_idle_while_requests_wait_for_it():
    """Arrivals stopped a window ago but the requests that came then still wait: the replica starting for
    them stays, however long the pool had been idle before."""
    quiet = decode(ready=0, arrival_rate_rps=0.0, tpot_ms=None, output_tokens_mean=None, held_requests=0.0)
    _, state = once(quiet, config=ZERO_MIN)
    later = NOW + 10 * ZERO_MIN.stabilization_s
    d, state = once(replace(quiet, at_s=later, held_requests=3.0), state, ZERO_MIN, later)
    assert (d.current, d.desired) == (0, 1)
    starting = replace(quiet, at_s=later + 1, held_requests=3.0, replicas=Replicas(0, 1))
    d, _ = once(starting, state, ZERO_MIN, later + 1)
    assert not d.changes, d.reason


def test_without_held_requests_a_pool_at_zero_holds_for_want_of_metrics():
    d, _ = once(at_zero(0), config=ZERO_MIN)
    assert not d.changes and d.reason_code == "MetricsUnavailable"


def test_an_idle_pool_with_min_zero_goes_to_zero_after_the_window_and_not_before():
    def idle(at_s: float) -> PoolObservation:
        return decode(ready=1, arrival_rate_rps=0.0, running_sequences=0.0, at_s=at_s)

    window = ZERO_MIN.stabilization_s
    d, state = once(idle(NOW), config=ZERO_MIN)
    assert not d.changes and d.reason_code == "Idle"
    d, state = once(idle(NOW + window - 1), state, ZERO_MIN, NOW + window - 1)
    assert not d.changes
    d, _ = once(idle(NOW + window), state, ZERO_MIN, NOW + window)
    assert (d.current, d.desired, d.reason_code) == (1, 0, "ScaleDownIdle")
    d, _ = once(idle(NOW + window), state, CONFIG, NOW + window)  # min 1: the last replica stays
    assert not d.changes


def test_the_prometheus_query_reads_the_routers_gauge_for_the_pool():
    q = promql.pool_queries(Pool.decode, "ns", "svc", "60s", 90)
    assert (
        q["held_requests"]
        == 'sum by (namespace, service) (tandem_router_held_requests{namespace="ns", service="svc", '
        'role="decode"})'
    )
    assert q["held_oldest_s"].startswith("max by (namespace, service) (tandem_router_held_oldest_seconds{")


@pytest.mark.asyncio
async def test_the_direct_scrape_reads_the_held_requests_of_each_pool():
    """A real router registry with a request held for decode, served over a real socket."""
    import asyncio

    queue = WakeQueue()
    metrics = RouterMetrics("svc", lambda: 0, wake_queue=queue)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    up = asyncio.Event()
    held = asyncio.ensure_future(queue.hold(["decode"], lambda role: up.is_set()))
    try:
        await asyncio.sleep(0.2)
        source = ScrapeSource(lambda: {"router": [url]})
        target = Target("ns", "svc", (Pool.prefill, Pool.decode))
        obs = await asyncio.to_thread(source.observe, target, {Pool.decode: Replicas(0)}, 100.0)
        assert obs[Pool.decode].held_requests == 1 and obs[Pool.prefill].held_requests == 0
        assert obs[Pool.decode].held_oldest_s is not None and obs[Pool.decode].held_oldest_s >= 0.1
        decisions, _ = once(obs[Pool.decode], PolicyState(), ZERO_MIN, 100.0)
        assert decisions.desired == 1
    finally:
        up.set()
        await held
        server.shutdown()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "patch,refused",
    [
        ({"decode": {"replicas": 0, "minReplicas": 0}}, True),
        ({"prefill": {"minReplicas": 0}}, True),
        ({"prefill": {"minReplicas": 0}, "autoscaling": {"enabled": True}}, False),
        ({"mode": "colocated", "decode": {"minReplicas": 0}}, True),  # colocated's one pool is spec.decode
    ],
)
def test_min_zero_needs_the_autoscaler_to_wake_the_pool(patch, refused):
    from pydantic import ValidationError

    from tandem.spec import MIN_ZERO_NEEDS_AUTOSCALING, InferenceServiceSpec

    body = {"model": {"source": {"path": "/m"}, "servedName": "m"}, **patch}
    if refused:
        with pytest.raises(ValidationError, match=MIN_ZERO_NEEDS_AUTOSCALING):
            InferenceServiceSpec.model_validate(body)
    else:
        InferenceServiceSpec.model_validate(body)


def test_the_example_starts_both_pools_at_zero_under_the_autoscaler():
    from pathlib import Path

    from tandem.spec import load_file

    svc = load_file(Path(__file__).resolve().parents[2] / "examples/tiny-from-zero.yaml")
    assert svc.spec.autoscaling.enabled
    assert [(p.replicas, p.min_replicas) for p in (svc.spec.prefill, svc.spec.decode)] == [(0, 0), (0, 0)]


@pytest.mark.parametrize(
    "patch,wakes",
    [
        ({"prefill": {"minReplicas": 0}, "autoscaling": {"enabled": True}}, {"prefill"}),
        (
            {"prefill": {"minReplicas": 0}, "decode": {"minReplicas": 0}, "autoscaling": {"enabled": True}},
            {"prefill", "decode"},
        ),
        (
            {"mode": "colocated", "decode": {"minReplicas": 0}, "autoscaling": {"enabled": True}},
            {"colocated"},
        ),
        ({"autoscaling": {"enabled": True}}, set()),
        ({}, set()),
    ],
)
def test_which_pools_rest_at_zero(patch, wakes):
    from tandem.operator.autoscale.core.wake import wakes_from_zero
    from tandem.spec import InferenceServiceSpec

    spec = InferenceServiceSpec.model_validate(
        {"model": {"source": {"path": "/m"}, "servedName": "m"}, **patch}
    )
    assert wakes_from_zero(spec) == wakes

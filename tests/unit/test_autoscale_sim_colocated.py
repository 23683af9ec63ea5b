"""Colocated workers in the simulator: a lone request takes the profile's times, prompts longer than the
chunk span
steps, every request is served, and under load the simulated TPOT is the shape rule's colocated model's (and
above the split's decode TPOT: prefill interference)."""

import random
import statistics

import pytest

from tandem.operator.autoscale.core.capacity import DecodeLoad, PrefillLoad, decode_tpot_ms
from tandem.operator.autoscale.core.colocated import colocated_step_ms, colocated_tpot_ms, colocated_ttft_ms
from tandem.operator.autoscale.core.config import PoolLimits
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.colocated import simulate_colocated
from tandem.operator.autoscale.sim.replay import Scenario, run
from tandem.operator.autoscale.sim.simulator import SimConfig
from tandem.slo import Slo
from tandem.trace import TraceRequest
from tests.unit.autoscale_fixtures import linear_profile

PROFILE = linear_profile()  # prefill 0.1 ms/token, chunk 512; decode step 10 ms + 0.5 ms per running sequence


def workers(n: int) -> SimConfig:
    return SimConfig(PROFILE, cold_start_s=0, initial={Pool.decode: n})


def poisson(rate: float, seconds: float, prompt: int, output: int, seed: int = 1) -> list[TraceRequest]:
    rng, t, out = random.Random(seed), 0.0, []
    while t < seconds:
        t += rng.expovariate(rate)
        out.append(TraceRequest(t, prompt, output))
    return out


def test_a_lone_request_takes_the_profiles_times():
    (r,) = simulate_colocated([TraceRequest(0.0, 2000, 11)], workers(1), lambda snap: {}).requests
    assert r.first_token_s * 1000 == pytest.approx(200.0)  # four chunks of at most 512 tokens, 0.1 ms each
    assert (r.finish_s - r.first_token_s) * 1000 == pytest.approx(10 * 10.5)  # ten steps at batch 1


def test_a_prompt_arriving_mid_generation_rides_the_next_steps():
    trace = [TraceRequest(0.0, 100, 50), TraceRequest(0.1, 1000, 2)]
    first, second = simulate_colocated(trace, workers(1), lambda snap: {}).requests
    assert first.finish_s is not None and second.finish_s is not None
    # the first generation's steps stretch by the second prompt's two chunks (512 + 488 tokens)
    assert (first.finish_s - first.first_token_s) * 1000 == pytest.approx(49 * 10.5 + 100.0, abs=1.0)
    assert second.first_token_s - second.arrival_s > 0.1


@pytest.mark.parametrize("rate,replicas", [(2.0, 1), (4.0, 1), (6.0, 2)])
def test_simulated_tpot_is_the_colocated_model(rate, replicas):
    trace = poisson(rate, 300, prompt=1000, output=100)
    result = simulate_colocated(trace, workers(replicas), lambda snap: {})
    assert all(r.finish_s is not None and not r.failed for r in result.requests)
    tpots = sorted((r.finish_s - r.first_token_s) / (r.output_len - 1) * 1000 for r in result.requests)
    tpot = statistics.mean(tpots)
    ttfts = sorted((r.first_token_s - r.arrival_s) * 1000 for r in result.requests)
    prefill, decode = PrefillLoad(rate, 1000, 1000), DecodeLoad(rate, 1000, 100)
    assert tpot == pytest.approx(colocated_step_ms(PROFILE, replicas, prefill, decode), rel=0.2)
    assert tpots[int(0.9 * len(tpots))] == pytest.approx(
        colocated_tpot_ms(PROFILE, replicas, prefill, decode, 90), rel=0.35
    )
    assert tpot > 1.2 * decode_tpot_ms(
        PROFILE, replicas, decode
    )  # the split's decode pool has no prefill in its steps
    assert ttfts[int(0.9 * len(ttfts))] == pytest.approx(
        colocated_ttft_ms(PROFILE, replicas, prefill, decode, 90), rel=0.35
    )


def test_static_colocated_policy_bills_only_its_workers():
    """`tandem simulate --policy static-colocated`: the colocated model's count for the peak minute, held
    fixed."""
    limits = {Pool.prefill: PoolLimits(1, 8), Pool.decode: PoolLimits(1, 8)}
    trace = poisson(4.0, 200, prompt=1000, output=50)
    result, summary = run("static-colocated", trace, Scenario(PROFILE, Slo(ttft_ms=500, tpot_ms=30), limits))
    n = result.timeline[0][2]
    assert n >= 1 and {(p, d) for _, p, d in result.timeline} == {(0, n)}
    assert summary["failed"] == 0 and summary["scaling_actions"] == 0
    assert result.gpu_seconds == pytest.approx(n * result.duration_s)

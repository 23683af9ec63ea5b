"""The capacity model against closed forms: Erlang C, M/M/1 waiting percentiles, Little's law for decode."""

import math

import numpy as np
import pytest

from tandem.operator.autoscale.core.capacity import (
    DecodeLoad,
    PrefillLoad,
    burst_rate,
    decode_max_batch,
    decode_need,
    decode_tpot_ms,
    erlang_c,
    prefill_need,
    prefill_ttft_ms,
)
from tandem.slo import Slo
from tests.unit.autoscale_fixtures import linear_profile

SLO = Slo(ttft_ms=500, tpot_ms=30, percentile=90)


@pytest.mark.parametrize(
    "servers,offered,expected",
    [
        (1, 0.5, 0.5),  # M/M/1: P(wait) = rho
        (2, 1.0, 1 / 3),  # textbook value
        (3, 0.0, 0.0),
        (2, 2.5, 1.0),  # overloaded
    ],
)
def test_erlang_c(servers, offered, expected):
    assert erlang_c(servers, offered) == pytest.approx(expected)


def test_prefill_ttft_is_the_mm1_wait_percentile_plus_service():
    p = linear_profile()  # 1000 tokens -> 100 ms
    load = PrefillLoad(rate_rps=5.0, prompt_tokens_mean=1000, prompt_tokens_p=1000)  # rho 0.5
    # M/M/1: P(W > t) = rho exp(-(mu - lambda) t) -> t90 = ln(0.5 / 0.1) / (10 - 5)
    expected = math.log(5) / 5 * 1000 + 100
    assert prefill_ttft_ms(p, 1, load, 90) == pytest.approx(expected)
    assert prefill_ttft_ms(p, 1, PrefillLoad(10.0, 1000, 1000), 90) == math.inf
    assert prefill_ttft_ms(p, 4, load, 90) == pytest.approx(100.0)  # hardly anyone waits


def test_prefix_hits_shrink_prefill_work():
    p = linear_profile()
    cold = PrefillLoad(rate_rps=8.0, prompt_tokens_mean=1000, prompt_tokens_p=1000)
    warm = PrefillLoad(rate_rps=8.0, prompt_tokens_mean=1000, prompt_tokens_p=1000, prefix_hit_rate=0.5)
    assert prefill_ttft_ms(p, 1, warm, 90) < prefill_ttft_ms(p, 1, cold, 90)


@pytest.mark.parametrize("rate", [1.0, 9.0, 30.0, 120.0])
def test_prefill_need_is_the_fewest_replicas_that_meet_the_target(rate):
    p = linear_profile()
    load = PrefillLoad(rate_rps=rate, prompt_tokens_mean=1000, prompt_tokens_p=2000)
    need = prefill_need(p, load, SLO, target_share=0.8)
    assert prefill_ttft_ms(p, need.replicas, load, 90) <= 400
    assert need.replicas == 1 or prefill_ttft_ms(p, need.replicas - 1, load, 90) > 400
    assert need.load_replicas == pytest.approx(rate * 0.1)  # never sized at 100% use
    assert need.replicas > need.load_replicas


def test_decode_max_batch_is_the_largest_meeting_tpot():
    p = linear_profile()  # step = 10 + 0.5 b ms
    assert decode_max_batch(p, 512, 24.0) == 28
    assert decode_max_batch(p, 512, 5.0) == 1  # even one sequence misses: the answer stays 1
    assert decode_max_batch(p, 512, 1000.0) == 64  # the engine's batch cap


def test_decode_tpot_solves_littles_law():
    p = linear_profile()
    load = DecodeLoad(rate_rps=10.0, prompt_tokens_mean=400, output_tokens_mean=100)
    tpot = decode_tpot_ms(p, 1, load)
    batch = (tpot - 10) / 0.5
    assert batch == pytest.approx(10.0 * 100 * tpot / 1000, rel=1e-4)  # running = rate x output x TPOT
    assert decode_tpot_ms(p, 2, load) < tpot
    assert decode_tpot_ms(p, 1, DecodeLoad(100.0, 400, 100)) == math.inf  # past the batch cap


def test_decode_need_meets_the_tpot_target_at_the_chosen_batch():
    p = linear_profile()
    load = DecodeLoad(rate_rps=40.0, prompt_tokens_mean=400, output_tokens_mean=200)
    need = decode_need(p, load, SLO, target_share=0.8)
    assert need.batch == 28  # 10 + 0.5 * 28 = 24 ms = 0.8 * 30
    assert need.load_replicas == pytest.approx(40 * 200 * 0.024 / 28)
    assert decode_tpot_ms(p, need.replicas, load) <= 24.0
    assert decode_tpot_ms(p, need.replicas - 1, load) > 24.0
    assert decode_need(p, DecodeLoad(0.0, 400, 200), SLO, 0.8).replicas == 0


@pytest.mark.parametrize(
    "slices,slice_s,expected",
    [
        ((5.0, 5.0, 5.0, 5.0), 15.0, 5.0),  # smooth: the mean
        ((0.0, 0.0, 0.0, 0.0, 0.0, 30.0), 10.0, 30.0),  # every request came in the burst
        ((1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 91.0), 10.0, 91.0),
        ((2.0, 2.0, 20.0, 2.0), 15.0, 20.0),  # one slice at 10x
        ((4.0, 4.0, 20.0, 20.0, 4.0, 4.0), 10.0, 20.0),  # two slices at 5x
        ((1.0, 1.0, 1.0, 3.0), 1.0, 1.5),  # counts 1, 1, 1, 3: within Poisson noise, so the mean
        ((1.0, 1.0, 1.0, 3.0), 100.0, 3.0),  # counts 100, 100, 100, 300: a burst
        ((7.0,), 15.0, 7.0),  # one slice is the mean
        ((0.0, 0.0), 15.0, 0.0),
        ((), 15.0, 0.0),
    ],
)
def test_burst_rate_is_the_rate_the_percentile_request_saw(slices, slice_s, expected):
    """A burst of many requests keeps (within 2%) its rate; a spread Poisson noise explains gives the mean."""
    assert burst_rate(slices, 90, slice_s) == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("rate", [1.0, 4.0, 16.0, 64.0])
def test_burst_rate_of_poisson_slices_is_about_the_mean(rate):
    """Four 15 s slices of Poisson arrivals, 50 seeds: the busiest slice sits about one Poisson standard
    deviation (sd = sqrt(mean / slice_s), in rps) above the mean, and the burst rate did before it discounted
    the noise; now it is the mean for at least half the seeds (counts no more spread than Poisson's) and
    never more than 3 sd above it."""
    slice_s, at_mean, busiest_above = 15.0, 0, []
    for seed in range(50):
        rates = [c / slice_s for c in np.random.default_rng(seed).poisson(rate * slice_s, 4)]
        mean = sum(rates) / len(rates)
        sd = math.sqrt(mean / slice_s)
        burst = burst_rate(rates, 90, slice_s)
        assert mean <= burst <= mean + 3 * sd, (rates, burst)
        at_mean += burst == pytest.approx(mean)
        busiest_above.append((max(rates) - mean) / sd)
    assert at_mean >= 25
    assert float(np.median(busiest_above)) > 0.8  # the noise the estimate takes out


def test_burst_rate_of_a_poisson_burst_is_the_bursts_rate():
    """Calm Poisson arrivals at 2 rps with one 15 s slice of them at 10x: the burst's rate within 10%."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        rates = [c / 15.0 for c in rng.poisson(2.0 * 15.0, 4)]
        rates[seed % 4] = rng.poisson(20.0 * 15.0) / 15.0
        assert burst_rate(rates, 90, 15.0) == pytest.approx(20.0, rel=0.1), rates


def test_burst_rate_needs_a_slice_length():
    with pytest.raises(ValueError, match="slice_s"):
        burst_rate((1.0, 2.0), 90, 0.0)

"""The capacity model against closed forms: Erlang C, M/M/1 waiting percentiles, Little's law for decode."""

import math

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
    "slices,expected",
    [
        ((5.0, 5.0, 5.0, 5.0), 5.0),  # smooth: the mean
        ((0.0, 0.0, 0.0, 0.0, 0.0, 30.0), 30.0),  # every request came in the burst
        ((1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 91.0), 91.0),
        ((0.0, 0.0), 0.0),
    ],
)
def test_burst_rate_is_the_rate_the_percentile_request_saw(slices, expected):
    assert burst_rate(slices, 90) == expected

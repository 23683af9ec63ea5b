"""The capacity model against closed forms: Erlang C, M/M/1 waiting percentiles, prompts batched into steps,
Little's law for decode."""

import math

import numpy as np
import pytest

from tandem.operator.autoscale.core.capacity import (
    PREFILL_MOST_USE,
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
from tandem.profile import shipped_profile
from tandem.slo import Slo
from tests.unit.autoscale_fixtures import linear_profile, one_prompt_per_step

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
    assert need.load_replicas == pytest.approx(rate * 0.1)  # never sized at 100% use
    assert need.load_replicas / need.replicas <= PREFILL_MOST_USE
    fewer = need.replicas - 1  # misses the target, or would run above the use the need plans for
    assert (
        fewer == 0
        or prefill_ttft_ms(p, fewer, load, 90) > 400
        or need.load_replicas / fewer > PREFILL_MOST_USE
    )


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


# A profile whose fixed cost dominates a short prompt's prefill (20 ms + 0.01 ms/token: 25 ms for 500
# tokens, 80% of it fixed), at NVIDIA's H200 chunk; and the H200 profile itself (about 18 of 36 ms fixed at
# 1000 tokens).
FIXED = linear_profile(prefill_ms_per_token=0.01, prefill_fixed_ms=20.0, chunk_tokens=8192)
H200 = shipped_profile("h200-llama-3.1-8b-fp8")


@pytest.mark.parametrize(
    "profile,replicas,rate,prompt,prompt_p",
    [
        (FIXED, 1, 1.0, 500, 1500),
        (FIXED, 4, 40.0, 500, 1500),
        (H200, 1, 2.0, 1155, 2734),
        (H200, 3, 20.0, 1155, 2734),
        (H200, 8, 80.0, 2048, 5186),
        (linear_profile(), 4, 5.0, 1000, 1000),
    ],
)
def test_at_low_load_a_prompt_is_served_alone_as_without_batching(profile, replicas, rate, prompt, prompt_p):
    """Where no prompt waits at the percentile, TTFT is one prompt's prefill alone: the batching model and
    the model of one prompt per step agree."""
    load = PrefillLoad(rate, prompt, prompt_p)
    alone = one_prompt_per_step(profile)
    assert erlang_c(replicas, rate * alone.prefill_ms(prompt) / 1000) <= 0.1  # nobody waits at p90
    assert prefill_ttft_ms(profile, replicas, load, 90) == pytest.approx(profile.prefill_ms(prompt_p))
    assert prefill_ttft_ms(profile, replicas, load, 90) == pytest.approx(
        prefill_ttft_ms(alone, replicas, load, 90)
    )


@pytest.mark.parametrize("replicas,rate", [(1, 2.0), (1, 5.0), (1, 8.0), (3, 20.0), (3, 27.0)])
def test_with_no_fixed_cost_batching_gains_nothing(replicas, rate):
    """0.1 ms per token and nothing fixed, at a chunk that batches 8 prompts: a full step serves prompts no
    faster than one at a time, so the model is the M/G/c queue of one prompt per step at every load."""
    batching = linear_profile(chunk_tokens=8192)
    load = PrefillLoad(rate, 1000, 2000)
    assert prefill_ttft_ms(batching, replicas, load, 90) == pytest.approx(
        prefill_ttft_ms(one_prompt_per_step(batching), replicas, load, 90)
    )


@pytest.mark.parametrize(
    "profile,rate,prompt,prompt_p,want",
    [
        # 200 req/s of 500 tokens: 5 replicas' worth one prompt at a time (25 ms each); full steps of 16
        # prompts (102 ms) serve 161 req/s a replica
        (FIXED, 200.0, 500, 1500, 2),
        (FIXED, 800.0, 500, 1500, 6),
        # conversation-like prompts on the H200 profile (38.9 ms alone; full steps of 7.1 prompts in 170 ms,
        # 41.8 req/s a replica): 2.7 and 15.6 replicas' worth one at a time
        (H200, 70.0, 1155, 2734, 2),
        (H200, 400.0, 1155, 2734, 11),  # 9.6 at full steps, at most 90% of it
    ],
)
def test_at_high_load_batching_needs_fewer_replicas(profile, rate, prompt, prompt_p, want):
    load = PrefillLoad(rate, prompt, prompt_p)
    need = prefill_need(profile, load, SLO, target_share=0.8)
    one_at_a_time = prefill_need(one_prompt_per_step(profile), load, SLO, target_share=0.8)
    assert need.replicas == want
    assert need.replicas < rate * profile.prefill_ms(prompt) / 1000 < one_at_a_time.replicas
    assert prefill_ttft_ms(profile, need.replicas, load, 90) <= 400
    fewer = need.replicas - 1  # misses the target, or would run above the use the need plans for
    assert prefill_ttft_ms(profile, fewer, load, 90) > 400 or need.load_replicas / fewer > PREFILL_MOST_USE


def test_past_full_steps_the_pool_cannot_keep_up():
    """Full steps of 16 prompts of 500 tokens take 101.9 ms: 161 req/s a replica is the most it serves."""
    most = 8192 / 500 / (FIXED.prefill_ms(8192) / 1000)
    assert prefill_ttft_ms(FIXED, 2, PrefillLoad(2 * most * 0.99, 500, 500), 90) < math.inf
    assert prefill_ttft_ms(FIXED, 2, PrefillLoad(2 * most * 1.01, 500, 500), 90) == math.inf

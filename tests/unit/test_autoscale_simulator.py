"""Simulator invariants: every request accounted for, static pools never move, attainment is joint,
an idle request's latency is the profile's, cold starts are billed, non-draining scale-down loses work."""

import pytest

from tandem.operator.autoscale.core.config import PoolLimits
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.replay import POLICIES, Scenario, run, summarise
from tandem.operator.autoscale.sim.simulator import Request, SimConfig, SimResult, scale_trace, simulate
from tandem.slo import Slo
from tandem.trace import TraceRequest
from tests.unit.autoscale_fixtures import linear_profile

PROFILE = linear_profile()  # prefill 0.1 ms/token; decode step 10 ms + 0.5 ms per running sequence
SLO = Slo(ttft_ms=500, tpot_ms=30, percentile=90)
LIMITS = {Pool.prefill: PoolLimits(1, 8), Pool.decode: PoolLimits(1, 8)}


def poisson_trace(rate: float, seconds: float, prompt=1000, output=50, seed=1):
    import random

    rng, t, out = random.Random(seed), 0.0, []
    while t < seconds:
        t += rng.expovariate(rate)
        out.append(TraceRequest(t, prompt, output))
    return out


def fixed(sizes):
    return lambda snap: dict(sizes)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_is_served_or_failed_once(policy):
    trace = poisson_trace(rate=15.0, seconds=300) + poisson_trace(rate=2.0, seconds=300, seed=2)
    trace = sorted(trace)
    result, summary = run(policy, trace, Scenario(PROFILE, SLO, LIMITS, cold_start_s=20))
    assert summary["requests"] == len(trace) == len(result.requests)
    for r in result.requests:
        assert r.failed or (r.finish_s is not None and r.first_token_s is not None)
        assert r.failed or r.arrival_s <= r.first_token_s <= r.finish_s
    if policy != "dynamo":  # the only policy that does not drain
        assert summary["failed"] == 0
    assert 0.0 <= summary["slo_attainment"] <= 1.0


@pytest.mark.parametrize("policy", ["static-peak", "static-mean"])
def test_static_policies_never_scale(policy):
    result, summary = run(policy, poisson_trace(rate=10.0, seconds=200), Scenario(PROFILE, SLO, LIMITS))
    assert summary["scaling_actions"] == 0
    assert len({(p, d) for _, p, d in result.timeline}) == 1
    p, d = result.timeline[0][1:]
    assert result.gpu_seconds == pytest.approx((p + d) * result.duration_s)


def test_a_lone_request_takes_the_profiles_times():
    trace = [TraceRequest(0.0, 2000, 11)]
    result = simulate(trace, SimConfig(PROFILE, cold_start_s=0), fixed({}))
    (r,) = result.requests
    assert (r.first_token_s - r.arrival_s) * 1000 == pytest.approx(200.0)  # 2000 tokens x 0.1 ms
    tpot_ms = (r.finish_s - r.first_token_s) / 10 * 1000
    assert tpot_ms == pytest.approx(10.5, rel=1e-3)  # one sequence: 10 + 0.5 ms per step


def test_queueing_on_one_prefill_replica():
    # three prompts arrive together: they are served one after another on the single replica
    trace = [TraceRequest(0.0, 1000, 2)] * 3
    result = simulate(trace, SimConfig(PROFILE, cold_start_s=0), fixed({}))
    ttfts = sorted((r.first_token_s - r.arrival_s) * 1000 for r in result.requests)
    assert ttfts == pytest.approx([100.0, 200.0, 300.0])


def test_attainment_is_joint():
    fast_ttft_slow_tpot = Request(0, 0.0, 10, 11, first_token_s=0.1, finish_s=0.1 + 10 * 0.040)
    both_ok = Request(1, 0.0, 10, 11, first_token_s=0.1, finish_s=0.1 + 10 * 0.020)
    slow_ttft = Request(2, 0.0, 10, 11, first_token_s=0.9, finish_s=0.9 + 10 * 0.020)
    one_token = Request(3, 0.0, 10, 1, first_token_s=0.2, finish_s=0.2)  # no TPOT: TTFT alone decides
    failed = Request(4, 0.0, 10, 11, failed=True)
    result = SimResult(
        [fast_ttft_slow_tpot, both_ok, slow_ttft, one_token, failed],
        3600.0,
        3600.0,
        [],
        [],
        {Pool.prefill: [], Pool.decode: []},
    )
    summary = summarise("x", result, SLO)
    assert summary["slo_attainment"] == pytest.approx(2 / 5)
    assert summary["goodput_per_gpu_hour"] == pytest.approx(2.0)


def test_cold_start_is_billed_and_capacity_arrives_late():
    calls = []

    def grow_once(snap):
        calls.append(snap.observations[Pool.prefill].replicas)
        return {Pool.prefill: 3} if len(calls) == 1 else {}

    trace = [TraceRequest(float(t), 100, 2) for t in range(0, 120, 1)]
    result = simulate(trace, SimConfig(PROFILE, interval_s=15, cold_start_s=40), grow_once)
    assert calls[1].starting == 2 and calls[1].ready == 1  # at 30 s, still starting
    assert any(c.ready == 3 for c in calls)  # after 15 + 40 s
    assert result.gpu_seconds > (1 + 1) * result.duration_s + 2 * (result.duration_s - 55)


def test_scale_down_without_drain_drops_in_flight_work():
    trace = [TraceRequest(0.0, 100, 2000) for _ in range(4)]  # long generations on two decode replicas

    def shrink(snap):
        return {Pool.decode: 1}

    for drain, lost in ((True, 0), (False, 1)):
        cfg = SimConfig(
            PROFILE, interval_s=5, cold_start_s=0, drain=drain, initial={Pool.prefill: 1, Pool.decode: 2}
        )
        result = simulate(trace, cfg, shrink)
        failed = sum(r.failed for r in result.requests)
        assert (failed > 0) == bool(lost)
        assert all(r.failed or r.finish_s is not None for r in result.requests)


def test_scale_trace_compresses_time_and_multiplies_requests():
    trace = [TraceRequest(float(t), 10, 10) for t in range(100)]
    assert [r.arrival_s for r in scale_trace(trace, time_scale=4)[:3]] == [0.0, 0.25, 0.5]
    assert len(scale_trace(trace, rate_scale=2.0)) == 200
    assert len(scale_trace(trace, rate_scale=0.5)) == 50
    assert len(scale_trace(trace, rate_scale=1.5)) == 150


def test_a_prefill_step_batches_queued_prompts_that_fit_the_chunk():
    from tandem.profile import DecodePoint, PrefillPoint, Profile

    # a step has a fixed cost, as on a GPU: 20 ms + 0.01 ms per token; chunk 2048 tokens
    profile = Profile(
        model="hand",
        device="none",
        dtype="fp8",
        prefill_chunk_tokens=2048,
        max_running_sequences=64,
        kv_capacity_tokens=1_000_000,
        cold_start_ms=0,
        prefill=[
            PrefillPoint(prompt_tokens=n, chunk_tokens=2048, ms=20 + 0.01 * n) for n in (100, 1000, 4000)
        ],
        decode=[DecodePoint(batch=b, context_tokens=c, step_ms=10.0) for b in (1, 8) for c in (256, 1024)],
    )
    # one long prompt occupies the replica; four of 500 tokens queue behind it, then one of 3000
    trace = (
        [TraceRequest(0.0, 4000, 2)]
        + [TraceRequest(0.001, 500, 2) for _ in range(4)]
        + [TraceRequest(0.002, 3000, 2)]
    )
    result = simulate(trace, SimConfig(profile, cold_start_s=0.0), fixed({Pool.prefill: 1, Pool.decode: 1}))
    first = [r.first_token_s for r in result.requests]
    long_done = (20 + 40) / 1000
    assert first[0] == pytest.approx(long_done)
    # the four short prompts share one step of 2000 tokens, not four steps of 25 ms each
    assert first[1:5] == [pytest.approx(long_done + (20 + 20) / 1000)] * 4
    assert first[5] == pytest.approx(long_done + 0.040 + 0.050)  # 3000 tokens do not fit the chunk: alone


# --- what the policy sees: the router's and workers' metrics, as Prometheus would have them ------


def recording(seen):
    def controller(snap):
        seen.append(snap)
        return {}

    return controller


def test_the_policy_reads_ttft_p90_as_histogram_quantile_over_the_routers_buckets():
    from tandem import names
    from tandem.operator.autoscale.sources.scrape import histogram_quantile

    # one replica, prompts back to back: TTFTs 110, 220, ..., 1100 ms, all within the first tick's window (a
    # late request keeps the run going past it)
    trace = [TraceRequest(0.0, 1100, 2)] * 10 + [TraceRequest(20.0, 100, 2)]
    seen = []
    simulate(
        trace, SimConfig(PROFILE, cold_start_s=0, interval_s=15, scrape_s=5, window_s=60), recording(seen)
    )
    ttfts = [0.11 * k for k in range(1, 11)]
    buckets = [(le, sum(t <= le for t in ttfts)) for le in names.TTFT_BUCKETS] + [(float("inf"), 10)]
    expected_ms = histogram_quantile(0.9, buckets) * 1000
    observed = seen[0].observations[Pool.prefill].ttft_ms
    assert observed == pytest.approx(expected_ms)
    assert observed == pytest.approx(
        1000.0
    )  # 0.75 s bucket holds 6, the 1 s bucket 9: rank 9 ends at its bound
    assert observed != pytest.approx(1001.0)  # the exact samples' p90, which no metric source has


def test_no_ttft_sample_while_nothing_completes_only_the_queued_tokens_show():
    trace = [
        TraceRequest(0.0, 400_000, 2),
        TraceRequest(70.0, 100, 2),
    ]  # 40 s of prefill (0.1 ms/token), then one more
    seen = []
    simulate(
        trace, SimConfig(PROFILE, cold_start_s=0, interval_s=15, scrape_s=5, window_s=60), recording(seen)
    )
    first = seen[0].observations[Pool.prefill]
    assert first.ttft_ms is None  # no request had its first token yet: an empty histogram's quantile
    assert first.queued_prompt_tokens == 400_000
    assert first.arrival_rate_rps == pytest.approx(1 / 15)  # one arrival over the 15 s the window has so far
    later = [s.observations[Pool.prefill] for s in seen if s.at_s >= 45]
    assert later and later[0].ttft_ms is not None  # the first token came at 40 s


def test_gauges_are_those_of_the_last_scrape_and_rates_span_the_window():
    trace = poisson_trace(rate=5.0, seconds=120, prompt=200, output=400)
    seen = []
    simulate(
        trace, SimConfig(PROFILE, cold_start_s=0, interval_s=15, scrape_s=60, window_s=60), recording(seen)
    )
    by_tick = {round(s.at_s): s.observations[Pool.decode] for s in seen}
    assert (
        by_tick[15].running_sequences == by_tick[30].running_sequences == by_tick[45].running_sequences == 0
    )
    assert by_tick[60].running_sequences > 0  # the scrape at 60 s saw the running batch
    arrived = sum(1 for r in trace if 60 < r.arrival_s <= 120)
    assert by_tick[120].arrival_rate_rps == pytest.approx(arrived / 60)

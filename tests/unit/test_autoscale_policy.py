"""The policy, one rule per table row: real capacity model, real forecaster, no mocks."""

import math
from dataclasses import replace

import pytest

from tandem.operator.autoscale.core.capacity import Slo
from tandem.operator.autoscale.core.config import PolicyConfig, PoolLimits, policy_config
from tandem.operator.autoscale.core.policy import PolicyState, PoolState, decide
from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas
from tandem.spec import InferenceServiceSpec
from tests.unit.autoscale_fixtures import linear_profile

PROFILE = linear_profile()  # prefill 0.1 ms/token; decode step 10 ms + 0.5 ms per sequence
CONFIG = PolicyConfig(
    slo=Slo(ttft_ms=500, tpot_ms=30, percentile=90),
    profile=PROFILE,
    limits={Pool.prefill: PoolLimits(1, 8), Pool.decode: PoolLimits(1, 8)},
    interval_s=15,
    stabilization_s=180,
    scale_down_cooldown_s=60,
    scale_up_cooldown_s=0,
    margin=0.8,
    stale_after_s=60,
    cold_start_s=30,
)
NOW = 1000.0


def prefill(ready=2, starting=0, draining=0, at_s=NOW, **kw):
    base = dict(arrival_rate_rps=10.0, prompt_tokens_mean=1000, prompt_tokens_p90=1000, ttft_ms=200.0)
    return PoolObservation(Pool.prefill, at_s, 60, Replicas(ready, starting, draining), **{**base, **kw})


def decode(ready=2, starting=0, draining=0, at_s=NOW, **kw):
    base = dict(arrival_rate_rps=10.0, prompt_tokens_mean=400, output_tokens_mean=100, tpot_ms=20.0)
    return PoolObservation(Pool.decode, at_s, 60, Replicas(ready, starting, draining), **{**base, **kw})


def once(obs, state=None, config=CONFIG, now=NOW):
    decisions, new_state = decide({obs.pool: obs}, state or PolicyState(), config, now)
    return decisions[obs.pool], new_state


@pytest.mark.parametrize(
    "obs,code,fragment",
    [
        (prefill(at_s=NOW - 120), "MetricsStale", "120 s old"),
        (prefill(arrival_rate_rps=None), "MetricsUnavailable", "arrival rate"),
        (prefill(arrival_rate_rps=math.nan), "MetricsUnavailable", "arrival rate"),
        (prefill(ttft_ms=math.nan), "MetricsUnavailable", "ttft_ms"),
        (decode(tpot_ms=None, output_tokens_mean=None), "MetricsUnavailable", "output_tokens_mean, tpot_ms"),
    ],
)
def test_missing_nan_or_stale_metrics_hold_and_say_why(obs, code, fragment):
    d, _ = once(obs)
    assert (d.desired, d.reason_code) == (obs.replicas.ready, code)
    assert fragment in d.reason


@pytest.mark.parametrize(
    "obs,expected_min,code",
    [
        # TTFT 900 ms > 500: ratio 1.8 on 2 replicas -> 4 (capped at doubling)
        (prefill(ttft_ms=900.0), 4, "SLOBreach"),
        # TPOT 45 > 30 at 2 replicas -> ceil(2 * 1.5) = 3
        (decode(tpot_ms=45.0), 3, "SLOBreach"),
        # latency fine, but 60 req/s x 1000 tokens needs >= 7 prefill replicas by the model
        (prefill(arrival_rate_rps=60.0, ttft_ms=300.0), 7, "Forecast"),
        # 200 req/s x 100 tokens at batch 28 of 24 ms steps: 200*100*0.024/28 = 17 -> capped at max 8
        (decode(arrival_rate_rps=200.0, tpot_ms=20.0), 8, "Forecast"),
    ],
)
def test_scale_up_at_once(obs, expected_min, code):
    d, state = once(obs)
    assert d.desired >= expected_min and d.desired <= 8
    assert d.reason_code == code
    assert d.reason.startswith(f"{obs.pool} 2->{d.desired}: ")
    assert state.pools[obs.pool].target == d.desired


def test_reason_names_the_slo_and_the_plan():
    d, _ = once(decode(tpot_ms=61.0, arrival_rate_rps=14.0))
    assert "TPOT p90 61 ms > 30 ms SLO" in d.reason
    assert "needs" in d.reason and "at batch 28" in d.reason


def test_growing_prefill_queue_adds_a_replica_before_ttft_breaches():
    first, state = once(prefill(queued_prompt_tokens=1000.0, at_s=NOW - 15), now=NOW - 15)
    assert not first.changes
    d, _ = once(prefill(queued_prompt_tokens=20_000.0), state)  # 20k tokens at 2 x 10k tok/s: 1 s > 500 ms
    assert (d.desired, d.reason_code) == (3, "QueueGrowing")


def test_no_new_decision_while_the_last_is_in_flight():
    d, state = once(decode(tpot_ms=45.0))
    assert d.desired == 3
    # one replica still starting: counted as capacity, and nothing new is decided
    d2, state = once(decode(ready=2, starting=1, tpot_ms=60.0, at_s=NOW + 15), state, now=NOW + 15)
    assert (d2.current, d2.desired, d2.reason_code) == (3, 3, "InFlight")
    # landed: the next breach may act again
    d3, _ = once(decode(ready=3, tpot_ms=60.0, at_s=NOW + 30), state, now=NOW + 30)
    assert d3.desired > 3


def test_in_flight_gives_up_after_the_timeout():
    _, state = once(decode(tpot_ms=45.0))
    later = NOW + CONFIG.in_flight_timeout_s + 1
    d, _ = once(decode(ready=2, tpot_ms=45.0, at_s=later), state, now=later)
    assert d.reason_code != "InFlight"


def _low_load_run(pool_obs, ticks, state=None, start=NOW):
    """Feed the same light observation every interval; return every decision."""
    out = []
    state = state or PolicyState()
    current = pool_obs.replicas.ready
    for i in range(ticks):
        t = start + i * CONFIG.interval_s
        obs = replace(pool_obs, at_s=t, replicas=Replicas(current))
        d, state = once(obs, state, now=t)
        out.append(d)
        current = d.desired
    return out


def test_scale_down_waits_for_the_window_then_steps_one_at_a_time():
    decisions = _low_load_run(decode(ready=5, arrival_rate_rps=2.0, tpot_ms=12.0), ticks=40)
    downs = [(i, d.current, d.desired) for i, d in enumerate(decisions) if d.changes]
    assert downs, "light load never scaled down"
    first_tick = downs[0][0]
    assert first_tick * CONFIG.interval_s >= CONFIG.stabilization_s
    assert all(cur - des == 1 for _, cur, des in downs)
    gaps = [b[0] - a[0] for a, b in zip(downs, downs[1:], strict=False)]
    assert all(g * CONFIG.interval_s >= CONFIG.scale_down_cooldown_s for g in gaps)
    assert decisions[-1].desired == 1


def test_no_scale_down_when_n_minus_1_would_miss_the_margin():
    # p90 prompts of 4500 tokens take 450 ms alone: any replica count runs at 90% of the 500 ms SLO
    light = prefill(ready=4, arrival_rate_rps=1.0, prompt_tokens_p90=4500, ttft_ms=300.0)
    decisions = _low_load_run(light, ticks=30)
    assert not any(d.changes for d in decisions)
    assert decisions[-1].reason_code == "NoMargin"
    assert "3 replicas would run at 90%" in decisions[-1].reason


def test_no_scale_down_while_latency_is_near_the_slo():
    decisions = _low_load_run(decode(ready=5, arrival_rate_rps=2.0, tpot_ms=27.0), ticks=30)
    assert not any(d.changes for d in decisions)


def test_a_breach_resets_the_stabilisation_window():
    light = decode(ready=4, arrival_rate_rps=2.0, tpot_ms=12.0)
    state = PolicyState()
    for i in range(10):
        _, state = once(replace(light, at_s=NOW + 15 * i), state, now=NOW + 15 * i)
    assert state.pools[Pool.decode].low_since_s == NOW
    hot = replace(light, at_s=NOW + 150, tpot_ms=40.0)  # a breach: up, and the window starts over
    _, state = once(hot, state, now=NOW + 150)
    assert state.pools[Pool.decode].low_since_s is None


def test_zero_traffic_goes_to_min_after_the_window():
    idle = prefill(ready=6, arrival_rate_rps=0.0, ttft_ms=None, prompt_tokens_mean=None)
    decisions = _low_load_run(idle, ticks=14)
    changed = [d for d in decisions if d.changes]
    assert len(changed) == 1 and changed[0].desired == 1 and changed[0].reason_code == "ScaleDownIdle"
    assert decisions[0].reason_code == "Idle"


def test_bounds_clamp():
    d, _ = once(prefill(ready=10))
    assert (d.desired, d.reason_code) == (8, "Bounds")
    limited = replace(CONFIG, limits={Pool.prefill: PoolLimits(3, 8), Pool.decode: PoolLimits(1, 8)})
    d, _ = once(prefill(ready=1), config=limited)
    assert d.desired == 3


def test_predictive_floor_rises_ahead_of_a_ramp():
    state = PolicyState()
    wants = []
    for i, rate in enumerate([10, 14, 18, 22, 26, 30]):
        t = NOW + 15 * i
        obs = prefill(ready=8, arrival_rate_rps=float(rate), ttft_ms=150.0, at_s=t)
        d, state = once(obs, state, now=t)
        wants.append(d.details["predicted_rate_rps"])
    assert wants[-1] > 30.0  # the floor is sized for the rate a cold start ahead, above today's


def test_gpu_budget_goes_to_the_pool_whose_slo_gains_most():
    budget = replace(CONFIG, gpu_budget=4)
    obs = {
        Pool.prefill: prefill(ready=1, arrival_rate_rps=15.0, ttft_ms=2000.0),  # 1 replica cannot keep up
        Pool.decode: decode(ready=1, arrival_rate_rps=5.0, tpot_ms=35.0),  # a little over, 1 replica gets by
    }
    unlimited, _ = decide(obs, PolicyState(), CONFIG, NOW)
    assert sum(d.desired for d in unlimited.values()) > 4
    decisions, _ = decide(obs, PolicyState(), budget, NOW)
    assert sum(d.desired for d in decisions.values()) == 4
    assert decisions[Pool.prefill].desired >= 2  # the saturated pool is served first
    assert decisions[Pool.prefill].desired > decisions[Pool.decode].desired
    assert any(d.reason_code == "GPUBudget" and "GPU budget 4" in d.reason for d in decisions.values())


def test_config_from_spec():
    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"source": {"path": "/m"}, "servedName": "m"},
            "prefill": {"minReplicas": 1, "maxReplicas": 6},
            "decode": {"replicas": 2, "minReplicas": 2, "maxReplicas": 9, "resources": {"gpus": 2}},
            "slo": {"ttftMs": 800, "tpotMs": 40, "percentile": 95},
            "autoscaling": {
                "enabled": True,
                "stabilizationSeconds": 240,
                "gpuBudget": 20,
                "sloMarginPercent": 75,
            },
        }
    )
    cfg = policy_config(spec, PROFILE)
    assert cfg.slo == Slo(800, 40, 95)
    assert cfg.limits[Pool.decode] == PoolLimits(2, 9, 2)
    assert (cfg.stabilization_s, cfg.gpu_budget, cfg.margin) == (240, 20, 0.75)
    assert cfg.horizon_s == PROFILE.cold_start_ms / 1000 + spec.autoscaling.interval_seconds


def test_state_is_plain_data_per_pool():
    _, state = once(decode())
    assert isinstance(state.pools[Pool.decode], PoolState)
    assert Pool.prefill not in state.pools


def test_bursts_inside_the_window_size_prefill_above_the_mean():
    smooth = prefill(ready=1, arrival_rate_rps=5.0, ttft_ms=200.0, arrival_rate_slices_rps=(5.0,) * 6)
    bursty = replace(smooth, arrival_rate_slices_rps=(0.0, 0.0, 0.0, 0.0, 0.0, 30.0))
    calm, _ = once(smooth)
    burst, _ = once(bursty)
    assert burst.desired > calm.desired
    assert "bursts of 29.9 req/s" in burst.reason  # 30 less the share of the spread Poisson noise explains


# --- rules a real cluster needs: stalls, drains, break-even, big pools, confirmed forecasts ---------------


def test_a_stalled_prefill_pool_is_a_breach_not_missing_data():
    # no prompt finished in the window (no TTFT sample) while 30k prompt tokens wait: 1.5 s of backlog
    d, _ = once(prefill(ttft_ms=None, queued_prompt_tokens=30_000.0))
    assert d.desired > 2 and d.reason_code in ("SLOBreach", "Stalled"), d.reason
    assert "none finished" in d.reason


def test_a_stalled_decode_pool_is_a_breach_not_missing_data():
    d, _ = once(decode(tpot_ms=None, running_sequences=40.0))
    assert d.desired > 2, d.reason
    assert "no token came" in d.reason


def test_no_sample_and_no_work_waiting_still_holds_as_missing():
    d, _ = once(prefill(ttft_ms=None, queued_prompt_tokens=0.0))
    assert (d.desired, d.reason_code) == (2, "MetricsUnavailable")


def test_a_draining_replica_never_blocks_a_scale_up():
    _, state = once(decode(ready=3, tpot_ms=10.0, arrival_rate_rps=1.0))
    state = PolicyState({Pool.decode: replace(state.pools[Pool.decode], target=2, target_since_s=NOW)})
    # 2 ready and 1 still draining its sequences, and the SLO breaks: the breach acts at once
    d, _ = once(decode(ready=2, draining=1, tpot_ms=60.0, at_s=NOW + 15), state, now=NOW + 15)
    assert d.desired > 2 and d.reason_code == "SLOBreach", d.reason


def test_a_draining_replica_holds_the_next_step_down():
    state = PolicyState({Pool.decode: PoolState(target=4, target_since_s=NOW, low_since_s=NOW - 600)})
    d, _ = once(
        decode(ready=4, draining=1, arrival_rate_rps=0.5, tpot_ms=11.0, at_s=NOW + 15), state, now=NOW + 15
    )
    assert (d.desired, d.reason_code) == (4, "InFlight")


def test_capacity_on_its_way_holds_unless_the_need_outgrows_it():
    _, state = once(prefill(ttft_ms=900.0))  # 2 -> 4
    assert state.pools[Pool.prefill].target == 4
    held, _ = once(prefill(ready=2, starting=2, ttft_ms=900.0, at_s=NOW + 15), state, now=NOW + 15)
    assert (held.desired, held.reason_code) == (4, "InFlight")
    # a surge the coming replicas cannot serve: 60 req/s x 1000 tokens needs >= 7 by the model
    surge, _ = once(
        prefill(ready=2, starting=2, arrival_rate_rps=60.0, ttft_ms=900.0, at_s=NOW + 15), state, now=NOW + 15
    )
    assert surge.desired >= 7


def test_break_even_keeps_a_replica_whose_quiet_spell_ends_within_a_cold_start():
    light = decode(ready=4, arrival_rate_rps=2.0, tpot_ms=12.0)
    # past quiet spells lasted 190-205 s; after the 180 s window, one is due back within the 30 s cold start
    state = PolicyState({Pool.decode: PoolState(quiet_spells_s=(190.0, 200.0, 205.0))})
    decisions = _low_load_run(light, ticks=14, state=state)
    assert not any(d.changes for d in decisions)
    assert decisions[-1].reason_code == "BreakEven", decisions[-1].reason
    # spells that long but this one outlasts them all: it is not one of them, the pool steps down
    longer = _low_load_run(light, ticks=20, state=state)
    assert any(d.changes for d in longer)


def test_a_large_pool_steps_down_by_a_share_of_itself():
    cfg = replace(CONFIG, limits={Pool.decode: PoolLimits(1, 64)})
    decisions = []
    state, current = PolicyState(), 32
    for i in range(13):
        t = NOW + i * CONFIG.interval_s
        d, state = once(decode(ready=current, arrival_rate_rps=2.0, tpot_ms=12.0, at_s=t), state, cfg, now=t)
        decisions.append(d)
        current = d.desired
    first = next(d for d in decisions if d.changes)
    assert (first.current, first.desired) == (32, 24)


def test_a_forecast_alone_goes_up_only_once_confirmed():
    cfg = replace(CONFIG, up_confirm_s=15)
    first, state = once(prefill(arrival_rate_rps=60.0, ttft_ms=300.0), config=cfg)
    assert (first.desired, first.reason_code) == (2, "Confirming")
    second, _ = once(prefill(arrival_rate_rps=60.0, ttft_ms=300.0, at_s=NOW + 15), state, cfg, now=NOW + 15)
    assert second.desired >= 7 and second.reason_code == "Forecast"
    # a breach does not wait
    breach, _ = once(prefill(ttft_ms=900.0), config=cfg)
    assert breach.desired == 4


def test_a_step_down_is_not_remembered_as_a_quiet_spell():
    light = decode(ready=3, arrival_rate_rps=2.0, tpot_ms=12.0)
    decisions, state, current = [], PolicyState(), 3
    for i in range(24):
        t = NOW + i * CONFIG.interval_s
        d, state = once(replace(light, at_s=t, replicas=Replicas(current)), state, now=t)
        decisions.append(d)
        current = d.desired
    assert [d.desired for d in decisions if d.changes] == [2, 1]  # down to the minimum, then steady there
    assert state.pools[Pool.decode].quiet_spells_s == ()  # the need never came back

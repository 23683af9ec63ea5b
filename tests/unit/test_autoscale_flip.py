"""Role flips as a scaling action: when they are lent, how many, what they cost, and when they come back."""

from dataclasses import replace

from tandem.operator.autoscale.core.config import PoolLimits, policy_config
from tandem.operator.autoscale.core.flip import FlipState, Loan, decide_with_flips, lend, with_loan
from tandem.operator.autoscale.core.policy import decide
from tandem.operator.autoscale.core.types import Pool
from tandem.spec import InferenceServiceSpec
from tests.unit.test_autoscale_policy import CONFIG, NOW, decode, prefill

FLIPS = replace(CONFIG, flip_enabled=True, flip_s=2.0)  # cold start 30 s


def prefill_breach(**kw):
    """1 prefill replica, TTFT 900 ms against 500, 10k prompt tokens queued: a breach that wants 1->2."""
    return prefill(ready=1, ttft_ms=900.0, queued_prompt_tokens=10_000, **kw)


def quiet_decode(ready=3, **kw):
    """Decode at 10 req/s x 100 tokens: about 0.9 replicas of load at the target batch, TPOT 20 ms of 30."""
    return decode(ready=ready, running_sequences=20, **kw)


def run(pre, dec, state=None, config=FLIPS, now=NOW):
    return decide_with_flips({Pool.prefill: pre, Pool.decode: dec}, state or FlipState(), config, now)


def test_a_breach_borrows_a_warm_worker_and_still_adds_pods_in_the_background():
    decisions, flips, state = run(prefill_breach(), quiet_decode())
    assert decisions[Pool.prefill].reason_code == "SLOBreach"
    assert (decisions[Pool.prefill].current, decisions[Pool.prefill].desired) == (
        1,
        2,
    )  # the new pod still starts
    assert len(flips) == 1
    flip = flips[0]
    assert (flip.source, flip.target, flip.count, flip.reason_code) == (
        Pool.decode,
        Pool.prefill,
        1,
        "FlippedToPrefill",
    )
    assert flip.reason.startswith(
        "FlippedToPrefill: TTFT p90 900 ms > 500 ms SLO; decode has 2.1 replicas of slack"
    )
    assert flip.cost_s == 4.0  # drain: 100 tokens at 20 ms; flip: 2 s
    assert state.loan == Loan(Pool.decode, Pool.prefill, 1, NOW)


def test_flips_off_means_no_flip_and_the_same_decisions_as_decide():
    decisions, flips, state = run(prefill_breach(), quiet_decode(), config=CONFIG)
    plain, _ = decide(
        {Pool.prefill: prefill_breach(), Pool.decode: quiet_decode()}, FlipState().policy, CONFIG, NOW
    )
    assert flips == () and state.loan is None
    assert decisions == plain


def test_the_lender_keeps_its_last_worker_and_min_replicas_counts_pods_not_roles():
    _, flips, _ = run(prefill_breach(), quiet_decode(ready=1))
    assert flips == ()
    # minReplicas 3 bounds decode's pods; a lent pod is still one of them, so a spare above the need can go
    floor_three = replace(FLIPS, limits={**FLIPS.limits, Pool.decode: PoolLimits(3, 8)})
    decisions, flips, state = run(prefill_breach(), quiet_decode(ready=3), config=floor_three)
    assert [f.count for f in flips] == [1]
    # the next tick the lender, one worker below its minimum by role, is not scaled back up to it
    dec = replace(quiet_decode(ready=2), at_s=NOW + 15)
    pre = prefill_breach(starting=1, at_s=NOW + 15)
    decisions, _, _ = run(pre, dec, state, config=floor_three, now=NOW + 15)
    assert decisions[Pool.decode].reason_code != "Bounds" and not decisions[Pool.decode].changes


def test_a_lender_whose_slack_would_not_survive_the_loss_lends_nothing():
    # 20 req/s of 100 tokens on 2 replicas: one replica alone would run a batch past the TPOT margin.
    busy = decode(ready=2, arrival_rate_rps=20.0, running_sequences=30, tpot_ms=15.0)
    _, flips, _ = run(prefill_breach(), busy)
    assert flips == ()


def test_a_lender_above_its_own_margin_lends_nothing():
    _, flips, _ = run(prefill_breach(), quiet_decode(tpot_ms=26.0))  # 26 ms > 80% of 30
    assert flips == ()


def test_a_flip_no_faster_than_a_cold_start_is_not_taken():
    slow = replace(FLIPS, flip_s=28.0)  # drain 2 s + flip 28 s = the 30 s cold start
    _, flips, _ = run(prefill_breach(), quiet_decode(), config=slow)
    assert flips == ()
    _, flips, _ = run(prefill_breach(), quiet_decode(), config=replace(FLIPS, flip_s=27.0))
    assert len(flips) == 1


def test_a_breach_the_forecast_outgrows_still_borrows():
    # TPOT 45 ms of 30 at 30 req/s: the forecast asks for more than the breach's one step, so the decision's
    # code is Forecast, but decode breaches now
    hot = decode(ready=1, arrival_rate_rps=30.0, tpot_ms=45.0, running_sequences=30)
    idle_prefill = prefill(ready=3, arrival_rate_rps=2.0, ttft_ms=120.0, queued_prompt_tokens=0)
    decisions, flips, _ = run(idle_prefill, hot)
    assert decisions[Pool.decode].reason_code == "Forecast"
    assert flips[0].reason.startswith("FlippedToDecode: TPOT p90 45 ms > 30 ms SLO; prefill has ")


def test_a_forecast_alone_borrows_nothing():
    # no breach: TTFT within the SLO, no queue; only the rate says more is coming
    growing = prefill(ready=1, arrival_rate_rps=9.0, ttft_ms=300.0)
    decisions, flips, _ = run(growing, quiet_decode())
    assert decisions[Pool.prefill].reason_code not in ("SLOBreach", "Stalled", "QueueGrowing")
    assert flips == ()


def test_the_lent_count_is_the_smaller_of_the_shortfall_and_the_slack():
    deep = prefill(ready=2, ttft_ms=2000.0, queued_prompt_tokens=60_000, arrival_rate_rps=20.0)
    decisions, flips, _ = run(deep, quiet_decode(ready=3))
    shortfall = decisions[Pool.prefill].desired - decisions[Pool.prefill].current
    assert shortfall >= 2
    assert flips[0].count == 2  # decode can lose 2 of 3 and still keep TPOT within the margin


def test_a_decode_breach_borrows_from_prefill():
    slow = decode(ready=1, tpot_ms=45.0, running_sequences=60)
    idle_prefill = prefill(ready=3, arrival_rate_rps=2.0, ttft_ms=120.0, queued_prompt_tokens=0)
    decisions, flips, _ = run(idle_prefill, slow)
    assert decisions[Pool.decode].reason_code in ("SLOBreach", "RunningBatch")
    assert flips[0].reason.startswith("FlippedToDecode: ")
    assert "prefill has 2.8 replicas of slack" in flips[0].reason


def test_while_the_new_pods_start_the_loan_stays_and_the_lender_holds_its_scale_down():
    loan = Loan(Pool.decode, Pool.prefill, 1, NOW)
    # prefill: its own pod still starting; decode: 2 left and little load, which alone would step down
    pre = prefill(ready=2, starting=1, ttft_ms=300.0)
    dec = decode(ready=2, arrival_rate_rps=1.0, running_sequences=2, tpot_ms=11.0)
    policy = FlipState().policy
    for t in range(0, 400, 15):  # long enough for the stabilisation window
        decisions, flips, state = run(pre, replace(dec, at_s=NOW + t), FlipState(policy, loan), now=NOW + t)
        policy = state.policy
        assert flips == ()
        assert state.loan == loan
        assert decisions[Pool.decode].desired >= decisions[Pool.decode].current
    assert decisions[Pool.decode].reason_code == "Lent"


def test_once_the_new_pods_are_ready_the_lent_workers_flip_back():
    loan = Loan(Pool.decode, Pool.prefill, 1, NOW)
    pre = prefill(ready=3, starting=0, ttft_ms=150.0, queued_prompt_tokens=0)  # 2 of its own + the lent one
    decisions, flips, state = run(pre, quiet_decode(ready=2), FlipState(loan=loan))
    assert [(f.source, f.target, f.count, f.reason_code) for f in flips] == [
        (Pool.prefill, Pool.decode, 1, "FlippedBack")
    ]
    assert state.loan is None
    assert not decisions[Pool.prefill].changes  # the flip back is prefill's only step down this tick
    # still starting: nothing comes back yet
    _, flips, state = run(
        replace(pre, replicas=replace(pre.replicas, starting=1)), quiet_decode(ready=2), FlipState(loan=loan)
    )
    assert flips == () and state.loan == loan


def test_a_lender_that_breaches_gets_its_workers_back_before_adding_pods():
    loan = Loan(Pool.decode, Pool.prefill, 1, NOW)
    pre = prefill(ready=2, starting=1, ttft_ms=300.0)
    hot = decode(
        ready=1, tpot_ms=45.0, running_sequences=30
    )  # a batch of 30 runs 25 ms steps: past the margin
    decisions, flips, state = run(pre, hot, FlipState(loan=loan))
    assert flips[0].reason_code == "FlippedBack" and flips[0].target == Pool.decode
    assert flips[0].reason.startswith(
        "FlippedBack: decode needs its workers back: TPOT p90 45 ms > 30 ms SLO"
    )
    d = decisions[Pool.decode]
    assert (d.desired, d.current, d.reason_code) == (
        1,
        1,
        "FlippedBack",
    )  # decode wanted 1 more: the returned worker is it
    assert flips[0].cost_s == 2.1  # prefill's step in progress (1000 tokens, 100 ms) + the 2 s flip
    assert state.loan is None


def test_the_loan_stretches_the_bounds_so_a_borrower_at_its_max_is_not_cut():
    at_max = replace(FLIPS, limits={Pool.prefill: PoolLimits(1, 2), Pool.decode: PoolLimits(2, 8)})
    loan = Loan(Pool.decode, Pool.prefill, 1, NOW)
    stretched = with_loan(at_max, loan)
    assert stretched.limits_for(Pool.prefill).max_replicas == 3
    assert stretched.limits_for(Pool.decode).min_replicas == 1
    pre = prefill(ready=3, ttft_ms=450.0, queued_prompt_tokens=3000)  # 2 of its own + 1 lent, still busy
    decisions, _, _ = run(pre, quiet_decode(ready=1), FlipState(loan=loan), config=at_max)
    assert decisions[Pool.prefill].reason_code != "Bounds"
    assert decisions[Pool.decode].reason_code != "Bounds"


def test_lend_ignores_a_pool_that_is_not_scaling_up():
    decisions, _ = decide(
        {Pool.prefill: prefill(), Pool.decode: quiet_decode()}, FlipState().policy, FLIPS, NOW
    )
    assert lend({Pool.prefill: prefill(), Pool.decode: quiet_decode()}, decisions, FLIPS, NOW) == (None, None)


def test_the_spec_switches_flips_on_with_its_flip_time():
    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"source": {"path": "/m"}, "servedName": "m"},
            "autoscaling": {"enabled": True, "flip": {"enabled": True, "flipSeconds": 5}},
            "roleFlip": True,
        }
    )
    config = policy_config(spec, CONFIG.profile)
    assert (config.flip_enabled, config.flip_s) == (True, 5)
    off = policy_config(
        InferenceServiceSpec.model_validate({"model": {"source": {"path": "/m"}, "servedName": "m"}}),
        CONFIG.profile,
    )
    assert off.flip_enabled is False


def test_flips_without_workers_that_can_flip_are_refused_with_the_reason():
    import pytest
    from pydantic import ValidationError

    doc = {"model": {"source": {"path": "/m"}, "servedName": "m"}, "autoscaling": {"flip": {"enabled": True}}}
    with pytest.raises(ValidationError, match="autoscaling.flip.enabled needs roleFlip: true"):
        InferenceServiceSpec.model_validate(doc)
    with pytest.raises(ValidationError, match="mode disaggregated"):
        InferenceServiceSpec.model_validate({**doc, "roleFlip": True, "mode": "colocated"})

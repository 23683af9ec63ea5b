"""The baselines do what their sources say: Dynamo's planner formulas and load steps, HPA's ratio rule."""

import math

import pytest

from tandem.operator.autoscale.core.config import PoolLimits
from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas
from tandem.operator.autoscale.sim.baselines import DynamoPlanner, Hpa, static_sizes
from tandem.operator.autoscale.sim.simulator import Snapshot
from tandem.slo import Slo
from tandem.trace import TraceRequest
from tests.unit.autoscale_fixtures import linear_profile

PROFILE = linear_profile()  # prefill 0.1 ms/token; decode step 10 ms + 0.5 ms per sequence
SLO = Slo(ttft_ms=500, tpot_ms=30, percentile=90)
LIMITS = {Pool.prefill: PoolLimits(1, 50), Pool.decode: PoolLimits(1, 50)}


def snap(
    at_s,
    rate=10.0,
    prompt=1000.0,
    output=100.0,
    p=(1, 0, 0),
    d=(1, 0, 0),
    queued=(0,),
    running=(0,),
    busy=0.5,
):
    def obs(pool, r):
        return PoolObservation(
            pool,
            at_s,
            60,
            Replicas(*r),
            arrival_rate_rps=rate,
            prompt_tokens_mean=prompt,
            output_tokens_mean=output,
        )

    return Snapshot(
        at_s,
        {Pool.prefill: obs(Pool.prefill, p), Pool.decode: obs(Pool.decode, d)},
        list(queued),
        list(running),
        busy,
        prompt + output / 2,
    )


def test_dynamo_throughput_mode_sizes_at_the_engines_full_rate():
    planner = DynamoPlanner(PROFILE, SLO, LIMITS)
    planner(snap(0.0))
    out = planner(snap(180.0, rate=40.0))  # mean demand over the interval: (10 + 40) / 2 = 25 req/s
    # prefill: 1000 tokens take 100 ms -> 10 req/s per engine -> ceil(25 / 10) = 3, no queueing allowance
    assert planner._bound[Pool.prefill] == 3
    # decode: largest batch with step <= 30 ms is 40; ITL 30 ms; engine rps = 40 / (100 x 0.03) = 13.3
    assert planner._bound[Pool.decode] == math.ceil(25 / (40 / (100 * 0.030)))
    assert out[Pool.prefill] >= 3


@pytest.mark.parametrize(
    "queued,current,expected",
    [
        ((6000,), 3, 4),  # one engine's estimated TTFT (6000 + 1000 tokens -> 700 ms) > 500: +1
        ((500, 0, 0), 4, 3),  # every engine below 80% of the SLO (at most 150 ms): -1, not below the bound 3
        ((500, 0, 0), 3, 3),  # the same at the throughput bound: stays
        ((3000, 0, 0), 3, 3),  # 400 ms on one engine: between 80% and 100%: hold
    ],
)
def test_dynamo_load_mode_steps_one_replica(queued, current, expected):
    planner = DynamoPlanner(PROFILE, SLO, LIMITS)
    planner._bound = {Pool.prefill: 3, Pool.decode: 1}
    planner._last_throughput_s = 0.0
    out = planner(snap(5.0, p=(current, 0, 0), queued=queued))
    assert out[Pool.prefill] == expected


def test_dynamo_observes_only_while_scaling_and_keeps_its_bound_without_traffic():
    planner = DynamoPlanner(PROFILE, SLO, LIMITS)
    assert planner(snap(5.0, p=(2, 1, 0), queued=(99999, 99999)))[Pool.prefill] == 3  # 2 ready + 1 starting
    quiet = DynamoPlanner(PROFILE, SLO, LIMITS)
    quiet._bound = {Pool.prefill: 4, Pool.decode: 2}
    idle = quiet(snap(400.0, rate=0.0, p=(4, 0, 0), queued=(0, 0, 0, 0)))
    assert idle[Pool.prefill] == 4  # no traffic data: the old bound holds (the zero-traffic stall)


def test_hpa_ratio_tolerance_and_stabilisation():
    hpa = Hpa(PROFILE, SLO, LIMITS)
    assert hpa(snap(0.0, p=(4, 0, 0), queued=(1, 1, 1, 1), busy=0.74))[Pool.prefill] == 4  # within 10%
    assert hpa(snap(15.0, p=(4, 0, 0), queued=(1, 1, 1, 1), busy=1.4))[Pool.prefill] == 8  # ceil(4 x 2)
    # load falls: the recommendation (2) waits for the 300 s window's largest recommendation to age out
    assert hpa(snap(30.0, p=(8, 0, 0), queued=(1,) * 8, busy=0.175))[Pool.prefill] == 8
    assert hpa(snap(330.0, p=(8, 0, 0), queued=(1,) * 8, busy=0.175))[Pool.prefill] == 2


def test_static_peak_is_at_least_static_mean():
    trace = [TraceRequest(float(i) / 2, 1000, 50) for i in range(600)] + [
        TraceRequest(300 + i / 20, 1000, 50) for i in range(600)
    ]
    trace.sort()
    peak = static_sizes(trace, PROFILE, SLO, LIMITS, 0.8, peak=True)
    mean = static_sizes(trace, PROFILE, SLO, LIMITS, 0.8, peak=False)
    assert peak[Pool.prefill] > mean[Pool.prefill] and peak[Pool.decode] >= mean[Pool.decode]


def test_hpa_does_not_multiply_over_pods_that_are_not_ready():
    from tandem.operator.autoscale.sim.baselines import hpa_recommendation

    # 4 ready pods at 140% of the target: 8; two more still starting change nothing (not 6 x 2 = 12)
    assert hpa_recommendation(4, 0, 0.98, 0.7, 0.1) == 6
    assert hpa_recommendation(4, 2, 0.98, 0.7, 0.1) == 6
    # the missing pods at 0% bring the ratio within the tolerance: no change
    assert hpa_recommendation(4, 4, 1.4 * 0.7 * 1.05, 0.7, 0.1) == 8
    # going down, missing pods count at 100%: 4 ready at 50% and 2 starting use 2 + 2 pods' worth -> 4, not 3
    assert hpa_recommendation(4, 2, 0.35, 0.7, 0.1) == 4
    assert hpa_recommendation(4, 0, 0.35, 0.7, 0.1) == 2

"""The batching prefill model against tandem's simulator, the referee: TTFT p90 of fixed prefill pools under
Poisson arrivals of the Azure traces' prompt lengths on NVIDIA's H200 profile.

Tolerance: the model's p90 within 0.8x-1.3x of the simulator's up to 75% of the pool's full-step rate. The
model is a closed form (the M/G/c waiting tail, a shared queue for a router that picks the replica with the
fewest tokens, steps at their mean batch), the simulator runs discrete steps of varying size; nearer the edge
the model leans high, which sizes a pool safe (at 98% it says 2x). Here it is 0.87x-1.19x; at the same loads
the model of one prompt per step is off by up to 3.6x or calls the pool overloaded.
"""

import random
import statistics

import pytest

from bench._traces import CODE, CONV
from tandem.operator.autoscale.core.capacity import PrefillLoad, prefill_full_step, prefill_ttft_ms
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.baselines import static_controller
from tandem.operator.autoscale.sim.simulator import SimConfig, Simulation
from tandem.profile import shipped_profile
from tandem.trace import TraceRequest, load_trace
from tests.unit.autoscale_fixtures import one_prompt_per_step

H200 = shipped_profile("h200-llama-3.1-8b-fp8")
REQUESTS = 6000


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def simulated_ttft_p90_ms(lengths: list[int], rate: float, replicas: int) -> float:
    """Prompts only (one output token), so TTFT is the prefill pool's alone; the first tenth warms it."""
    rng = random.Random(7)
    at, trace = 0.0, []
    for _ in range(REQUESTS):
        at += rng.expovariate(rate)
        trace.append(TraceRequest(at, rng.choice(lengths), 1))
    pools = {Pool.prefill: replicas, Pool.decode: 1}
    config = SimConfig(H200, interval_s=1e9, initial=pools)
    result = Simulation(trace, config, static_controller(pools)).run()
    kept = result.requests[REQUESTS // 10 :]
    return p90([(r.first_token_s - r.arrival_s) * 1000 for r in kept])  # type: ignore[operator]


@pytest.mark.parametrize("trace", [CONV, CODE], ids=["conversation", "code"])
@pytest.mark.parametrize("replicas", [1, 3])
@pytest.mark.parametrize("share", [0.25, 0.5, 0.75])
def test_the_batching_model_predicts_the_simulators_ttft(trace, replicas, share):
    lengths = [r.input_len for r in load_trace(trace)]
    mean, at_p = statistics.mean(lengths), p90([float(n) for n in lengths])
    most, full_ms = prefill_full_step(H200, mean)
    rate = share * replicas * most / (full_ms / 1000)  # a share of the pool's full-step rate
    load = PrefillLoad(rate, mean, at_p)
    simulated = simulated_ttft_p90_ms(lengths, rate, replicas)
    predicted = prefill_ttft_ms(H200, replicas, load, 90)
    one_at_a_time = prefill_ttft_ms(one_prompt_per_step(H200), replicas, load, 90)
    assert 0.8 * simulated <= predicted <= 1.3 * simulated, (simulated, predicted, one_at_a_time)
    if share >= 0.5:  # where prompts batch, closer than the model of one prompt per step
        assert abs(predicted / simulated - 1) < abs(one_at_a_time / simulated - 1)

"""The colocated capacity model against the simulator's colocated workers: on small bursty traces shaped like
the
Azure conversation and code traces, the fewest workers the model says meet TTFT and TPOT p90 within the SLO is
the simulator's fewest, within one worker."""

import math
import random
from collections import Counter

import pytest

from tandem.operator.autoscale.core.capacity import DecodeLoad, PrefillLoad, burst_rate
from tandem.operator.autoscale.core.colocated import colocated_need
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.colocated import simulate_colocated
from tandem.operator.autoscale.sim.simulator import SimConfig
from tandem.profile import shipped_profile
from tandem.slo import Slo
from tandem.trace import TraceRequest

H200 = shipped_profile("h200-llama-3.1-8b-fp8")
SLO = Slo(ttft_ms=2000, tpot_ms=50, percentile=90)
SECONDS = 240.0
SLICE_S = 10.0


def bursty(
    rate: float, prompt: tuple[float, float], output: tuple[float, float], seed: int
) -> list[TraceRequest]:
    """Arrivals at `rate` on average, a third of them in 10 s bursts at 4x the quiet rate; lengths lognormal
    (median, sigma), so outputs are not the geometric lengths the model assumes."""
    rng, out = random.Random(seed), []
    for start in range(0, int(SECONDS), int(SLICE_S)):
        here = rate * (2.0 if rng.random() < 1 / 6 else 0.8)
        t = float(start)
        while True:
            t += rng.expovariate(here)
            if t >= start + SLICE_S:
                break
            p = max(16, int(rng.lognormvariate(math.log(prompt[0]), prompt[1])))
            o = max(2, int(rng.lognormvariate(math.log(output[0]), output[1])))
            out.append(TraceRequest(t, min(p, 8000), min(o, 2000)))
    return out


def fewest_simulated(trace: list[TraceRequest]) -> int:
    for n in range(1, 40):
        result = simulate_colocated(
            trace, SimConfig(H200, cold_start_s=0, initial={Pool.decode: n}), lambda snap: {}
        )
        ttfts = sorted((r.first_token_s - r.arrival_s) * 1000 for r in result.requests)
        tpots = sorted((r.finish_s - r.first_token_s) / (r.output_len - 1) * 1000 for r in result.requests)
        if ttfts[int(0.9 * len(ttfts))] <= SLO.ttft_ms and tpots[int(0.9 * len(tpots))] <= SLO.tpot_ms:
            return n
    raise AssertionError("no count met the SLO")


def modelled(trace: list[TraceRequest]) -> int:
    """The model's count for the load the policy would observe: mean lengths, the prompt p90, the burst's
    rate."""
    prompts = sorted(r.input_len for r in trace)
    prompt_mean = sum(prompts) / len(prompts)
    output_mean = sum(r.output_len for r in trace) / len(trace)
    slices = Counter(int(r.arrival_s // SLICE_S) for r in trace)
    rates = [slices.get(i, 0) / SLICE_S for i in range(int(SECONDS / SLICE_S))]
    burst = burst_rate(rates, SLO.percentile, SLICE_S)
    prefill = PrefillLoad(burst, prompt_mean, prompts[int(0.9 * len(prompts))])
    decode = DecodeLoad(len(trace) / SECONDS, prompt_mean, output_mean)
    return colocated_need(H200, prefill, decode, SLO, 1.0).replicas


CONVERSATION = ((900.0, 0.7), (130.0, 0.9))  # prompt and output (median, sigma): long generations
CODE = ((1500.0, 1.0), (14.0, 1.0))  # long prompts, outputs of a few tokens


@pytest.mark.parametrize(
    "shape,rate",
    [
        (CONVERSATION, 5.0),
        (CONVERSATION, 20.0),
        (CONVERSATION, 40.0),
        (CODE, 3.0),
        (CODE, 10.0),
        (CODE, 20.0),
    ],
    ids=["conv-5", "conv-20", "conv-40", "code-3", "code-10", "code-20"],
)
def test_the_model_counts_the_simulators_colocated_workers_within_one(shape, rate):
    trace = bursty(rate, *shape, seed=int(rate))
    simulated, model = fewest_simulated(trace), modelled(trace)
    assert abs(model - simulated) <= 1, f"model {model}, simulator {simulated}"

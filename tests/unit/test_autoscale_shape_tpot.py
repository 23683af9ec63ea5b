"""The shape rule on the Azure traces' loads at a tight and a loose TPOT (1.5x and 8x the idle step, TTFT 5x
idle), as bench.goodput_dynamo sweeps them on NVIDIA's H200 profile: at the tight one the capacity model
serves each load on fewer GPUs split, and the rule splits; at the loose one colocated workers need no more,
and the rule keeps them. The colocated TPOT the rule sizes is checked against the simulator's percentile."""

from dataclasses import dataclass

import pytest

from tandem.operator.autoscale.core.capacity import DecodeLoad, PrefillLoad, decode_need, prefill_need
from tandem.operator.autoscale.core.colocated import (
    colocated_need,
    colocated_step_ms,
    colocated_tpot_ms,
)
from tandem.operator.autoscale.core.shape import Shape, ShapeAction, ShapeConfig, ShapeLoad, decide_shape
from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.colocated import simulate_colocated
from tandem.operator.autoscale.sim.simulator import SimConfig
from tandem.profile import shipped_profile
from tandem.slo import Slo
from tests.unit.autoscale_fixtures import linear_profile
from tests.unit.test_autoscale_sim_colocated import poisson

H200 = shipped_profile("h200-llama-3.1-8b-fp8")


@dataclass(frozen=True)
class Trace:
    """A trace's lengths (the first 6000 rows) and the total rates of the sweep's goodput region on 4 GPUs."""

    prompt_mean: float
    prompt_p90: float
    output_mean: float
    median_prompt: int
    median_output: int
    rates: tuple[float, ...]

    def slo(self, tpot_x_idle: float) -> Slo:
        """TTFT 5x and TPOT `tpot_x_idle` times the median request's idle latencies on the profile."""
        ttft = H200.prefill_ms(self.median_prompt) + H200.decode_step_ms(1, self.median_prompt)
        tpot = H200.decode_step_ms(1, self.median_prompt + self.median_output / 2)
        return Slo(5 * ttft, tpot_x_idle * tpot, 90)


TRACES = {
    "conversation": Trace(1151, 2382, 253, 1042, 202, rates=(16.0, 32.0, 64.0)),
    "code": Trace(2027, 5025, 27, 1453, 13, rates=(2.0, 4.0, 8.0)),
}
CASES = [(name, rate) for name, t in TRACES.items() for rate in t.rates]


def needs(load: ShapeLoad, cfg: ShapeConfig) -> tuple[int, Shape]:
    """The capacity model's own answer: colocated workers, and the split, each at the policy's margin."""
    prefill = PrefillLoad(load.rate_rps, load.prompt_tokens_mean, load.prompt_tokens_p90 or 0.0)
    decode = DecodeLoad(load.rate_rps, load.prompt_tokens_mean, load.output_tokens_mean)
    colocated = colocated_need(cfg.profile, prefill, decode, cfg.slo, cfg.margin)
    p = prefill_need(cfg.profile, prefill, cfg.slo, cfg.margin).replicas
    d = decode_need(cfg.profile, decode, cfg.slo, cfg.margin).replicas
    return colocated.replicas, Shape(prefill=p, decode=d)


@pytest.mark.parametrize(("trace", "rate"), CASES)
def test_tight_tpot_splits_where_the_split_needs_fewer_gpus(trace: str, rate: float):
    t = TRACES[trace]
    load = ShapeLoad(rate, t.prompt_mean, t.output_mean, t.prompt_p90)
    cfg = ShapeConfig(slo=t.slo(1.5), profile=H200)
    colocated, split = needs(load, cfg)
    assert split.workers <= min((1 - cfg.band) * colocated, colocated - 1), (colocated, split)
    d = decide_shape(load, Shape(colocated=colocated), 3600, cfg)
    assert (d.action, d.target) == (ShapeAction.split, split), d.reason
    assert decide_shape(load, split, 3600, cfg).action == ShapeAction.keep


@pytest.mark.parametrize(("trace", "rate"), CASES)
def test_loose_tpot_keeps_colocated_workers_that_need_no_more_gpus(trace: str, rate: float):
    t = TRACES[trace]
    load = ShapeLoad(rate, t.prompt_mean, t.output_mean, t.prompt_p90)
    cfg = ShapeConfig(slo=t.slo(8), profile=H200)
    colocated, split = needs(load, cfg)
    assert colocated <= split.workers, (colocated, split)
    d = decide_shape(load, Shape(colocated=colocated), 3600, cfg)
    assert (d.action, d.target) == (ShapeAction.keep, Shape(colocated=colocated)), d.reason
    if colocated <= min((1 - cfg.band) * split.workers, split.workers - 1):
        assert decide_shape(load, split, 3600, cfg).target == Shape(colocated=colocated)


def test_short_generations_under_long_prompts_take_the_tail_not_the_mean():
    """Ten-token answers beside 2000-token prompts on one colocated worker: a prompt landing in a generation
    adds its 200 ms of prefill to ten steps, so the simulated p90 TPOT is far above the mean stretch, and
    the percentile model follows it."""
    profile = linear_profile()  # prefill 0.1 ms/token, chunk 512; decode step 10 ms + 0.5 ms per sequence
    trace = poisson(1.5, 600, prompt=2000, output=11)
    result = simulate_colocated(
        trace, SimConfig(profile, cold_start_s=0, initial={Pool.decode: 1}), lambda s: {}
    )
    tpots = sorted((r.finish_s - r.first_token_s) / (r.output_len - 1) * 1000 for r in result.requests)
    p90 = tpots[int(0.9 * len(tpots))]
    prefill, decode = PrefillLoad(1.5, 2000, 2000), DecodeLoad(1.5, 2000, 11)
    mean = colocated_step_ms(profile, 1, prefill, decode)
    assert p90 > 1.5 * mean
    assert colocated_tpot_ms(profile, 1, prefill, decode, 90) == pytest.approx(p90, rel=0.3)

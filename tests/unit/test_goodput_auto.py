"""`auto` in the goodput sweep: the rule's shape on a GPU budget, walked up the rates from a split, and its
goodput read off the replayed pools' curves."""

from dataclasses import replace

import pytest

from bench._goodput_auto import (
    AGGREGATED,
    AutoStep,
    at_budget,
    auto_goodput,
    auto_walk,
    grown_split,
    step_at,
    trace_load,
)
from tandem.operator.autoscale.core.shape import Shape, ShapeConfig, sized
from tandem.profile import shipped_profile
from tandem.slo import Slo
from tandem.trace import TraceRequest

H200 = shipped_profile("h200-llama-3.1-8b-fp8")
CODE_LIKE = [TraceRequest(i * 0.5, 1500 + 700 * (i % 5), 13 + 5 * (i % 3)) for i in range(100)]


def test_trace_load_reads_the_lengths_as_a_window_does():
    trace = [TraceRequest(0, n, 10) for n in range(1, 11)]
    load = trace_load(trace, 3.0)
    assert (load.rate_rps, load.prompt_tokens_mean, load.output_tokens_mean) == (3.0, 5.5, 10)
    assert load.prompt_tokens_p90 == 9.0


@pytest.mark.parametrize(
    ("shape", "pool"),
    [
        (Shape(colocated=7), AGGREGATED),
        (Shape(prefill=1, decode=1), "2P+2D"),
        (Shape(prefill=2, decode=1), "3P+1D"),
        (Shape(prefill=1, decode=9), "1P+3D"),  # at least one of each
        (Shape(prefill=4096, decode=1), "3P+1D"),  # no count of prefill meets it: the most there can be
    ],
)
def test_a_shape_on_four_gpus(shape: Shape, pool: str):
    assert at_budget(shape, 4) == pool


def test_a_split_on_the_budget_is_the_one_sized_for_the_heaviest_load_that_fits():
    cfg = ShapeConfig(slo=Slo(200, 9.3, 90), profile=H200)
    load = trace_load(CODE_LIKE, 1.0)
    grown = grown_split(load, 4, cfg)
    assert grown.split and grown.workers <= 4
    heavier = sized(replace(load, rate_rps=load.rate_rps * 100), cfg)[1]
    assert heavier.workers > 4  # the search stopped at the budget, not at its end


def test_the_walk_starts_split_and_every_step_is_on_the_budget():
    cfg = ShapeConfig(slo=Slo(200, 50, 90), profile=H200)
    steps = auto_walk(CODE_LIKE, [0.5, 1, 2], 4, cfg)
    assert [s.rate for s in steps] == [0.5, 1, 2]
    assert all(s.pool == AGGREGATED or s.pool.endswith("D") for s in steps)
    assert steps[0].reason.startswith(("Collapsed", "Kept 1P+1D", "Kept 2P+1D"))


def test_auto_reads_each_rate_off_the_pool_it_chose_there():
    curves = {
        AGGREGATED: [(1.0, 0.99), (2.0, 0.95), (4.0, 0.5)],
        "2P+2D": [(1.0, 0.99), (2.0, 0.97), (4.0, 0.93), (8.0, 0.5)],
        "3P+1D": [(1.0, 0.99), (2.0, 0.8)],  # its sweep stopped at 2: 4 and 8 count as misses
    }
    steps = [
        AutoStep(1.0, Shape(colocated=1), AGGREGATED, ""),
        AutoStep(2.0, Shape(colocated=2), AGGREGATED, ""),
        AutoStep(4.0, Shape(prefill=3, decode=1), "3P+1D", ""),
        AutoStep(8.0, Shape(prefill=3, decode=1), "3P+1D", ""),
    ]
    # 3P+1D at 4 is a miss: interpolated from aggregated at 2
    assert auto_goodput(steps, curves, 0.9).rate == pytest.approx(2 + 2 * (0.95 - 0.9) / 0.95)
    kind = auto_goodput(steps, curves, 0.9, split_as="2P+2D")  # the choice of kind alone
    assert kind.rate == pytest.approx(4 + 4 * (0.93 - 0.9) / (0.93 - 0.5))
    assert step_at(steps, kind.rate).rate == 4.0
    assert step_at(steps, 0.0) is steps[0]

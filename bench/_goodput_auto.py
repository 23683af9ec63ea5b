"""`spec.mode: auto` in the goodput sweep (pure): the shape the rule (autoscale/core/shape.py) chooses at each
load point of a fixed GPU budget, and the goodput of the pools it chose.

The load at a point is the trace's own lengths (mean prompt and output, prompt at p90) at the point's total
rate. Walking up the rate grid from a split (an `auto` service starts split), the rule keeps or changes the
shape as it would under a slowly rising load (no dwell: each point is a steady load). On the budget's GPUs the
chosen shape is `gpus` colocated workers, or a split: the one the rule sizes for the heaviest load of the same
lengths that fits the budget (the counts the per-pool policy grows to), the rest of the GPUs shared in its
proportion. `auto`'s goodput is then read off the replays of those pools: at each rate, the attainment of
the pool chosen there. Read with the best split of the budget in place of the rule's, it measures the choice
of shape alone (the per-pool policy, not the shape rule, sets a split's counts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bench._goodput_sweep import Goodput, goodput
from tandem.operator.autoscale.core.shape import Shape, ShapeConfig, ShapeLoad, decide_shape, sized
from tandem.trace import TraceRequest

AGGREGATED = "aggregated"


@dataclass(frozen=True)
class AutoStep:
    rate: float  # req/s per GPU
    shape: Shape  # what the rule sized for the load (its own GPU count)
    pool: str  # that shape on the budget's GPUs: "aggregated" or "PP+DD"
    reason: str


def trace_load(trace: Sequence[TraceRequest], rate_rps: float) -> ShapeLoad:
    """The trace's lengths at `rate_rps` as the rule reads a window: mean prompt and output, prompt p90."""
    prompts = sorted(r.input_len for r in trace)
    p90 = prompts[min(len(prompts) - 1, math.ceil(0.9 * len(prompts)) - 1)]
    mean_out = sum(r.output_len for r in trace) / len(trace)
    return ShapeLoad(rate_rps, sum(prompts) / len(prompts), mean_out, float(p90))


def at_budget(shape: Shape, gpus: int) -> str:
    """The pool of `gpus` GPUs in `shape`'s kind: all colocated, or its prefill share of them (1..gpus-1)."""
    if not shape.split:
        return AGGREGATED
    prefill = min(gpus - 1, max(1, round(gpus * shape.prefill / shape.workers)))
    return f"{prefill}P+{gpus - prefill}D"


def grown_split(load: ShapeLoad, gpus: int, cfg: ShapeConfig, steps: int = 200) -> Shape:
    """The split the rule sizes for the heaviest load of `load`'s lengths that fits `gpus` GPUs (the rate
    grown by 5% a step); the load's own split when even that does not fit."""
    fitting = sized(load, cfg)[1]
    for k in range(1, steps):
        split = sized(replace(load, rate_rps=load.rate_rps * 1.05**k), cfg)[1]
        if split.workers > gpus:
            break
        fitting = split
    return fitting


def auto_walk(
    trace: Sequence[TraceRequest], grid: Sequence[float], gpus: int, cfg: ShapeConfig
) -> list[AutoStep]:
    """The rule's shape at each rate of the grid (req/s per GPU), walking up from a split."""
    steps, split = [], True
    for rate in grid:
        load = trace_load(trace, rate * gpus)
        colocated, pools = sized(load, cfg)
        decision = decide_shape(load, pools if split else colocated, math.inf, cfg)
        split = decision.target.split
        budget = grown_split(load, gpus, cfg) if split else decision.target
        steps.append(AutoStep(rate, decision.target, at_budget(budget, gpus), decision.reason))
    return steps


def auto_goodput(
    steps: Sequence[AutoStep],
    curves: dict[str, list[tuple[float, float]]],
    target: float,
    split_as: str | None = None,
) -> Goodput:
    """Goodput of the pools the rule chose, from each pool's (rate, attainment) curve at one SLO, each read
    at its own rate (a rate a pool's sweep did not reach, having missed even the loosest SLO below it,
    counts as a miss); with `split_as`, every split chosen reads that pool's curve instead."""

    def pool(step: AutoStep) -> str:
        return split_as if split_as and step.pool != AGGREGATED else step.pool

    return goodput([(s.rate, dict(curves.get(pool(s), [])).get(s.rate, 0.0)) for s in steps], target)


def step_at(steps: Sequence[AutoStep], rate: float) -> AutoStep:
    """The step the goodput falls in: the last grid rate at or below `rate` (the first if below the grid)."""
    below = [s for s in steps if s.rate <= rate + 1e-9]
    return below[-1] if below else steps[0]

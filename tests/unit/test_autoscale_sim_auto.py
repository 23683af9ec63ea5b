"""`auto` in the simulator: the controller as a table (the shape rule over tandem's policy, what it answers
per tick), and a small trace on which the simulated service collapses to one colocated worker at the trough
and splits at the burst, serving every request."""

import random
from dataclasses import dataclass, field

import pytest

from tandem.operator.autoscale.core.config import PolicyConfig, PoolLimits
from tandem.operator.autoscale.core.shape import Shape, ShapeConfig
from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas
from tandem.operator.autoscale.sim.auto import ShapeChange, auto_controller
from tandem.operator.autoscale.sim.replay import Scenario, run
from tandem.operator.autoscale.sim.simulator import Snapshot
from tandem.slo import Slo
from tandem.trace import TraceRequest
from tests.unit.autoscale_fixtures import linear_profile

PROFILE = linear_profile()  # prefill 0.1 ms/token, chunk 512; decode step 10 ms + 0.5 ms per running sequence
SLO = Slo(
    ttft_ms=2000, tpot_ms=15
)  # tight TPOT: 1.5x the idle step, so prefill interference costs colocated GPUs
LIMITS = {pool: PoolLimits(1, 32) for pool in Pool}
TROUGH = {"rate": 0.5, "prompt": 200, "output": 20}  # fits one colocated worker: 1 GPU against the split's 2
BURST = {"rate": 20.0, "prompt": 2000, "output": 20}  # colocated steps would carry 4 s of prefill a second


def observations(
    pools: dict[Pool, int], at_s: float, rate: float, prompt: int, output: int, tpot_ms: float = 11.0
):
    return {
        pool: PoolObservation(
            pool,
            at_s,
            60.0,
            Replicas(ready=n),
            arrival_rate_rps=rate,
            prompt_tokens_mean=prompt,
            prompt_tokens_p90=prompt,
            output_tokens_mean=output,
            prefix_hit_rate=0.0,
            ttft_ms=100.0,
            tpot_ms=tpot_ms,
            queued_prompt_tokens=0.0,
            running_sequences=1.0,
            kv_usage=0.1,
        )
        for pool, n in pools.items()
    }


def snapshot(pools: dict[Pool, int], at_s: float, load: dict[str, float]) -> Snapshot:
    return Snapshot(at_s, observations(pools, at_s, **load), [], [], 0.0, 1.0)  # type: ignore[arg-type]


def controller(dwell_s: float = 600.0):
    cfg = PolicyConfig(slo=SLO, profile=PROFILE, limits=LIMITS, stale_after_s=1e9)
    return auto_controller(cfg, ShapeConfig.from_policy(cfg, dwell_s=dwell_s))


SPLIT_1_1 = {Pool.prefill: 1, Pool.decode: 1}


@dataclass(frozen=True)
class Case:
    name: str
    ticks: list[
        tuple[dict[Pool, int], float, dict[str, float]]
    ]  # (pools, at_s, load) per tick; the last is judged
    want_target: Shape | None  # None: no shape change, replicas per pool
    want_reason: str = ""
    dwell_s: float = field(default=600.0)


CASES = [
    Case(
        "a quiet split collapses to one colocated worker",
        [(SPLIT_1_1, 75.0, TROUGH)],
        Shape(colocated=1),
        "Collapsed: 0.5 req/s fits 1",
    ),
    Case("not before a whole window was seen", [(SPLIT_1_1, 45.0, TROUGH)], None),
    Case(
        "colocated workers split at a burst of long prompts",
        [({Pool.colocated: 1}, 900.0, BURST)],
        Shape(prefill=5, decode=2),
        "Split: 20 req/s; 5P+2D serves it at 7 GPUs",
    ),
    Case("a split serving the burst stays split", [({Pool.prefill: 5, Pool.decode: 2}, 900.0, BURST)], None),
    Case(
        "a burst within the dwell after a collapse keeps the colocated workers",
        [(SPLIT_1_1, 75.0, TROUGH), ({Pool.colocated: 1}, 300.0, BURST)],
        None,
    ),
    Case(
        "the same burst after the dwell splits",
        [(SPLIT_1_1, 75.0, TROUGH), ({Pool.colocated: 1}, 700.0, BURST)],
        Shape(prefill=5, decode=2),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_auto_controller(case: Case) -> None:
    control = controller(case.dwell_s)
    answers = [control(snapshot(pools, at_s, load)) for pools, at_s, load in case.ticks]
    answer = answers[-1]
    if case.want_target is None:
        assert not isinstance(answer, ShapeChange), answer
        assert isinstance(answer, dict) and set(answer) == set(
            case.ticks[-1][0]
        )  # the current shape's pools, sized
    else:
        assert isinstance(answer, ShapeChange)
        assert answer.target == case.want_target
        assert case.want_reason in answer.reason


def phase(
    start_s: float, seconds: float, rate: float, prompt: int, output: int, rng: random.Random
) -> list[TraceRequest]:
    t, out = start_s, []
    while True:
        t += rng.expovariate(rate)
        if t >= start_s + seconds:
            return out
        out.append(TraceRequest(t, prompt, output))


def test_the_simulated_service_collapses_at_the_trough_and_splits_at_the_burst() -> None:
    rng = random.Random(7)
    trace = phase(0.0, 600.0, **TROUGH, rng=rng) + phase(600.0, 240.0, **BURST, rng=rng)
    sc = Scenario(
        PROFILE,
        SLO,
        {Pool.prefill: LIMITS[Pool.prefill], Pool.decode: LIMITS[Pool.decode]},
        cold_start_s=10.0,
        shape_dwell_s=120.0,
    )
    result, summary = run("auto", trace, sc)
    (t_collapse, before, after, why), (t_split, _, split, why_split) = result.shape_changes[:2]
    assert (before, after) == ("1P+1D", "1 colocated") and why.startswith("Collapsed") and t_collapse < 600.0
    assert 600.0 < t_split < 840.0 and why_split.startswith("Split") and split.endswith("D")
    trough = [c for t, c in result.colocated_timeline if t_collapse + 30 < t < 600.0]
    assert trough and set(trough) == {1}  # the trough costs one GPU
    assert summary["shape_changes"] == len(result.shape_changes) and summary["failed"] == 0
    assert all(r.finish_s is not None for r in result.requests)  # nothing lost across the changes

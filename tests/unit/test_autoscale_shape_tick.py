"""The shape rule in the live loop, the pure parts: which shape the pools have, the load it serves, when the
rule speaks, and the order of the moves that take a service from one shape to the other."""

from __future__ import annotations

import pytest

from tandem.operator.autoscale.core.config import PoolLimits
from tandem.operator.autoscale.core.shape import Shape, ShapeAction, ShapeConfig
from tandem.operator.autoscale.core.shape_tick import ShapeState, current_shape, load_of, reshape, shape_tick
from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas
from tandem.profile import shipped_profile
from tandem.slo import Slo
from tests.unit.test_autoscale_shape import H200, LONG, tpot_x_idle

CFG = ShapeConfig(slo=Slo(ttft_ms=2000, tpot_ms=50), profile=shipped_profile(), dwell_s=60)


def obs(pool: Pool, rate: float, **kw) -> PoolObservation:
    return PoolObservation(pool, 100.0, 60.0, Replicas(1), arrival_rate_rps=rate, **kw)


SPLIT = {Pool.prefill: Replicas(1), Pool.decode: Replicas(1), Pool.colocated: Replicas(0)}
ONE = {Pool.prefill: Replicas(0), Pool.decode: Replicas(0), Pool.colocated: Replicas(1)}
IDLE = {Pool.prefill: obs(Pool.prefill, 0.0), Pool.decode: obs(Pool.decode, 0.0, running_sequences=0)}


@pytest.mark.parametrize(
    "replicas,want",
    [
        (SPLIT, Shape(prefill=1, decode=1)),
        (ONE, Shape(colocated=1)),
        (
            {Pool.prefill: Replicas(1, starting=1), Pool.decode: Replicas(2, draining=1)},
            Shape(prefill=2, decode=2),
        ),
        (
            {Pool.prefill: Replicas(0), Pool.decode: Replicas(1), Pool.colocated: Replicas(0, starting=1)},
            None,
        ),
    ],
    ids=["split", "colocated", "starting-counts-draining-not", "in-flight"],
)
def test_the_shape_the_pools_have(replicas, want):
    assert current_shape(replicas) == want


def test_an_idle_shape_is_a_load_of_zero_and_a_missing_metric_none():
    assert load_of(IDLE, Shape(prefill=1, decode=1)).rate_rps == 0.0  # type: ignore[union-attr]
    busy = {Pool.prefill: obs(Pool.prefill, 2.0), Pool.decode: obs(Pool.decode, 2.0)}  # no lengths yet
    assert load_of(busy, Shape(prefill=1, decode=1)) is None
    assert load_of(IDLE, Shape(colocated=1)) is None  # the colocated pool's window is not observed


def test_an_idle_split_collapses_to_one_colocated_worker_then_keeps_it():
    decision, state = shape_tick(IDLE, SPLIT, ShapeState(), CFG, now_s=1000.0)
    assert decision is not None and decision.action is ShapeAction.collapse
    assert decision.target == Shape(colocated=1) and decision.reason.startswith(
        "Collapsed: 0 req/s fits 1 colocated"
    )
    assert state.last_change_s == 1000.0
    idle_one = {Pool.colocated: obs(Pool.colocated, 0.0)}
    kept, same = shape_tick(idle_one, ONE, state, CFG, now_s=1010.0)
    assert kept is not None and kept.action is ShapeAction.keep and same.last_change_s == state.last_change_s


def test_no_decision_while_a_change_is_in_flight_or_a_metric_is_missing():
    moving = {Pool.prefill: Replicas(0), Pool.decode: Replicas(1), Pool.colocated: Replicas(1)}
    assert shape_tick(IDLE, moving, ShapeState(), CFG, 1000.0) == (None, ShapeState())
    busy = {Pool.prefill: obs(Pool.prefill, 2.0), Pool.decode: obs(Pool.decode, 2.0)}
    assert shape_tick(busy, SPLIT, ShapeState(), CFG, 1000.0) == (None, ShapeState())


def test_colocated_workers_that_miss_a_tight_tpot_split_after_the_dwell():
    cfg = ShapeConfig(slo=tpot_x_idle(1.5), profile=H200, dwell_s=60)
    six = {Pool.colocated: Replicas(6)}
    heavy = {
        Pool.colocated: obs(
            Pool.colocated,
            LONG.rate_rps,
            prompt_tokens_mean=LONG.prompt_tokens_mean,
            output_tokens_mean=LONG.output_tokens_mean,
            prompt_tokens_p90=LONG.prompt_tokens_p90,
            tpot_ms=LONG.tpot_ms,
        )
    }
    early, _ = shape_tick(heavy, six, ShapeState(last_change_s=990.0), cfg, now_s=1000.0)
    assert early is not None and early.action is ShapeAction.keep and "dwell" in early.reason
    decision, state = shape_tick(heavy, six, ShapeState(last_change_s=0.0), cfg, now_s=1000.0)
    assert decision is not None and decision.action is ShapeAction.split
    assert decision.target == Shape(prefill=1, decode=2) and state.last_change_s == 1000.0
    assert decision.reason.startswith("Split: TPOT p90 9 ms > 7 ms under prefill interference")
    capped, _ = shape_tick(
        heavy, six, ShapeState(), cfg, 1000.0, {Pool.decode: PoolLimits(1, 1), Pool.prefill: PoolLimits(1, 4)}
    )
    assert capped is not None and capped.target == Shape(prefill=1, decode=1)  # decode's maxReplicas
    assert capped.reason.endswith("; 1P+1D within the pools' bounds")


def test_a_collapse_flips_a_prefill_worker_and_drains_the_rest():
    roles = {"p0": "prefill", "p1": "prefill", "d0": "decode", "d1": "decode", "d2": "decode"}
    moves = reshape(roles, Shape(colocated=1), order=["d1", "p1", "p0"])
    assert moves.waves == [{"p1": "colocated"}] and moves.start == {}
    assert sorted(moves.drain) == ["d0", "d1", "d2", "p0"]
    one_each = reshape({"p0": "prefill", "d0": "decode"}, Shape(colocated=1))
    assert (one_each.waves, one_each.drain) == (
        [{"p0": "colocated"}],
        ["d0"],
    )  # decode serves while p0 drains


def test_a_split_starts_decode_workers_first_and_flips_to_decode_before_leaving_the_decode_side():
    one = reshape({"c0": "colocated"}, Shape(prefill=1, decode=2))
    assert one.start == {"decode": 2} and one.waves == [{"c0": "prefill"}] and one.drain == []
    three = reshape({"c0": "colocated", "c1": "colocated", "c2": "colocated"}, Shape(prefill=1, decode=1))
    assert (
        three.waves == [{"c1": "decode"}, {"c0": "prefill"}] and three.drain == ["c2"] and three.start == {}
    )
    same = reshape({"p0": "prefill", "d0": "decode"}, Shape(prefill=1, decode=1))
    assert same.waves == [] and same.drain == [] and same.start == {}

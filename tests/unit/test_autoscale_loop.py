"""The autoscaler in the loop, without a cluster: one tick with the real policy over an in-memory source
and actuator, the status it reports (SLOMet, observed vs target, last decision), and the Kubernetes
actuator's pure parts (replicas from pods, deletion costs, cold start)."""

from __future__ import annotations

import pytest

from tandem.operator.autoscale.backends.kube.actuator import cold_start_seconds, deletion_costs, pool_replicas
from tandem.operator.autoscale.core.config import policy_config
from tandem.operator.autoscale.core.loop import Autoscaler, Tick
from tandem.operator.autoscale.core.report import slo_met, slo_status
from tandem.operator.autoscale.core.source import MetricsUnavailable, Target
from tandem.operator.autoscale.core.types import Decision, Pool, PoolObservation, Replicas
from tandem.profile import shipped_profile
from tandem.spec import InferenceServiceSpec
from tandem.spec_autoscaling import SloSpec

SLO = SloSpec(ttft_ms=500, tpot_ms=50, percentile=90)


def _spec(**autoscaling) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {
            "model": {"source": {"path": "m"}, "servedName": "m"},
            "prefill": {"replicas": 1, "minReplicas": 1, "maxReplicas": 4},
            "decode": {"replicas": 1, "minReplicas": 1, "maxReplicas": 4},
            "autoscaling": {"enabled": True, **autoscaling},
            "roleFlip": "flip" in autoscaling,
        }
    )


class Pools:
    """An actuator over plain counts: resizes at once (every replica ready)."""

    def __init__(self, counts: dict[Pool, int]):
        self.counts, self.applied = dict(counts), []

    def replicas(self) -> dict[Pool, Replicas]:
        return {p: Replicas(n) for p, n in self.counts.items()}

    def apply(self, d: Decision) -> None:
        self.applied.append(d)
        self.counts[d.pool] = d.desired


class Fixed:
    """A source answering the same load every tick, or failing."""

    def __init__(self, fields: dict[Pool, dict] | None):
        self.fields = fields

    def observe(self, target, replicas, now_s):
        if self.fields is None:
            raise MetricsUnavailable("Prometheus at http://prom:9090: connection refused")
        return {p: PoolObservation(p, now_s, 60, replicas[p], **f) for p, f in self.fields.items()}


LOAD = {
    "arrival_rate_rps": 0.5,
    "prompt_tokens_mean": 200,
    "prompt_tokens_p90": 400,
    "output_tokens_mean": 16,
}


def _autoscaler(source, counts) -> tuple[Autoscaler, Pools]:
    pools = Pools(counts)
    spec = _spec()
    target = Target("ns", "svc", tuple(counts), 60, 90)
    return Autoscaler(target, source, pools, policy_config(spec, shipped_profile())), pools


def test_a_ttft_breach_adds_prefill_and_the_status_says_why():
    source = Fixed(
        {
            Pool.prefill: {**LOAD, "ttft_ms": 5000, "queued_prompt_tokens": 20000},
            Pool.decode: {**LOAD, "tpot_ms": 20, "running_sequences": 1, "kv_usage": 0.1},
        }
    )
    autoscaler, pools = _autoscaler(source, {Pool.prefill: 1, Pool.decode: 1})
    tick = autoscaler.tick(1000.0)
    assert tick.unavailable is None
    assert pools.counts[Pool.prefill] > 1 and [d.pool for d in tick.applied] == [Pool.prefill]
    status = slo_status(
        tick,
        SLO,
        60,
        {"ttft": 0.4, "tpot": 1.0},
        {"conditions": [{"type": "Ready", "status": "True"}]},
        "2026-01-01T00:00:00Z",
    )
    (cond,) = [c for c in status["conditions"] if c["type"] == "SLOMet"]
    assert (cond["status"], cond["reason"]) == ("False", "TTFTAboveTarget")
    assert [c["type"] for c in status["conditions"]] == ["Ready", "SLOMet"]  # the reconciler's kept
    assert status["slo"]["ttft"] == "5000/500ms" and status["slo"]["tpot"] == "20/50ms"
    last = status["autoscaling"]["lastDecision"]
    assert (
        last["pool"] == "prefill"
        and last["fromReplicas"] == 1
        and last["toReplicas"] == pools.counts[Pool.prefill]
    )
    assert last["reason"] == tick.applied[0].reason and last["reasonCode"]
    assert status["autoscaling"]["pools"]["decode"] == {
        "desiredReplicas": 1,
        "readyReplicas": 1,
        "startingReplicas": 0,
        "drainingReplicas": 0,
    }


def test_unavailable_metrics_hold_the_pools_and_turn_slo_met_unknown():
    autoscaler, pools = _autoscaler(Fixed(None), {Pool.prefill: 2, Pool.decode: 3})
    tick = autoscaler.tick(1000.0)
    assert tick.unavailable and not tick.applied and pools.counts == {Pool.prefill: 2, Pool.decode: 3}
    previous = {
        "autoscaling": {"lastDecision": {"pool": "decode", "toReplicas": 3}},
        "conditions": [{"type": "SLOMet", "status": "True", "lastTransitionTime": "2025-01-01T00:00:00Z"}],
    }
    status = slo_status(tick, SLO, 60, {}, previous, "2026-01-01T00:00:00Z")
    (cond,) = status["conditions"]
    assert (cond["status"], cond["reason"]) == ("Unknown", "MetricsUnavailable")
    assert cond["lastTransitionTime"] == "2026-01-01T00:00:00Z" and "connection refused" in cond["message"]
    assert status["autoscaling"]["lastDecision"] == previous["autoscaling"]["lastDecision"]  # kept
    assert status["slo"]["ttft"] == "-/500ms"


@pytest.mark.parametrize(
    "ttft, tpot, expected",
    [
        (100, 20, ("True", "WithinTarget")),
        (900, 20, ("False", "TTFTAboveTarget")),
        (100, 80, ("False", "TPOTAboveTarget")),
        (900, 80, ("False", "TTFTAndTPOTAboveTarget")),
        (None, None, ("Unknown", "NoTraffic")),
    ],
)
def test_slo_met_reasons(ttft, tpot, expected):
    obs = {
        Pool.prefill: PoolObservation(Pool.prefill, 0, 60, Replicas(1), ttft_ms=ttft),
        Pool.decode: PoolObservation(Pool.decode, 0, 60, Replicas(1), tpot_ms=tpot),
    }
    assert slo_met(Tick(0, {}, obs), SLO)[:2] == expected


def _pod(
    name,
    ready=True,
    deleting=False,
    created="2026-01-01T00:00:00Z",
    ready_at="2026-01-01T00:00:40Z",
    phase="Running",
):
    meta = {"name": name, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    conditions = [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": ready_at}]
    return {"metadata": meta, "status": {"phase": phase, "conditions": conditions}}


def test_pool_replicas_from_pods():
    pods = [
        _pod("a"),
        _pod("b"),
        _pod("c", ready=False),
        _pod("d", deleting=True),
        _pod("e", phase="Failed", ready=False),
    ]
    assert pool_replicas(pods) == Replicas(ready=2, starting=1, draining=1)


def test_cold_start_is_the_median_created_to_ready():
    pods = [
        _pod("a", ready_at="2026-01-01T00:00:30Z"),
        _pod("b", ready_at="2026-01-01T00:01:00Z"),
        _pod("c", ready_at="2026-01-01T00:02:00Z"),
        _pod("d", ready=False),
    ]
    assert cold_start_seconds(pods) == 60.0
    assert cold_start_seconds([_pod("x", ready=False)]) is None


def test_deletion_costs_put_the_emptiest_pod_first_and_unknown_last():
    costs = deletion_costs({"a": 5, "b": 0, "c": 2, "d": None})
    assert costs == {"a": 5, "b": 0, "c": 2, "d": 6}
    assert min(costs, key=costs.__getitem__) == "b"


class FlippingPools(Pools):
    """Plain counts that can also change a worker's role at once."""

    def __init__(self, counts: dict[Pool, int]):
        super().__init__(counts)
        self.flips: list = []

    def flip(self, flip) -> None:
        self.flips.append(flip)
        self.counts[flip.source] -= flip.count
        self.counts[flip.target] += flip.count


def test_flips_reach_an_actuator_that_can_flip_and_no_other():
    breach = Fixed(
        {
            Pool.prefill: {**LOAD, "ttft_ms": 5000, "queued_prompt_tokens": 20000},
            Pool.decode: {**LOAD, "tpot_ms": 8, "running_sequences": 1, "kv_usage": 0.1},
        }
    )
    spec = _spec(flip={"enabled": True})
    target = Target("ns", "svc", (Pool.prefill, Pool.decode), 60, 90)
    counts = {Pool.prefill: 1, Pool.decode: 3}
    flipping = FlippingPools(counts)
    tick = Autoscaler(target, breach, flipping, policy_config(spec, shipped_profile())).tick(1000.0)
    assert [f.reason_code for f in tick.flips] == ["FlippedToPrefill"]
    assert flipping.flips == list(tick.flips)
    assert flipping.counts[Pool.decode] < 3  # a decode worker serves prefill now
    assert [d.pool for d in tick.applied] == [Pool.prefill]  # and prefill's own pod starts too
    plain = Pools(counts)
    tick = Autoscaler(target, breach, plain, policy_config(spec, shipped_profile())).tick(1000.0)
    assert tick.flips == () and plain.counts[Pool.decode] == 3


class Shapes(Pools):
    """Pools that can change shape: a reshape sets the target's counts at once."""

    def __init__(self, counts: dict[Pool, int]):
        super().__init__(counts)
        self.reshaped: list = []

    def reshape(self, decision) -> None:
        self.reshaped.append(decision)
        t = decision.target
        self.counts = {Pool.colocated: t.colocated, Pool.prefill: t.prefill, Pool.decode: t.decode}


def test_mode_auto_collapses_an_idle_split_then_sizes_only_the_colocated_pool():
    from tandem.operator.autoscale.core.shape import Shape, ShapeAction
    from tandem.operator.autoscale.core.shape_tick import shape_config

    spec = InferenceServiceSpec.model_validate(
        {**_spec().model_dump(by_alias=True), "mode": "auto", "roleFlip": True}
    )
    config = policy_config(spec, shipped_profile())
    idle = {"arrival_rate_rps": 0.0, "running_sequences": 0.0, "queued_prompt_tokens": 0.0}
    pools = Shapes({Pool.prefill: 1, Pool.decode: 1, Pool.colocated: 0})
    target = Target("ns", "svc", (Pool.prefill, Pool.decode, Pool.colocated), 60, 90)
    autoscaler = Autoscaler(
        target, Fixed({p: idle for p in target.pools}), pools, config, shape_config(spec, config)
    )
    tick = autoscaler.tick(1000.0)
    assert tick.shape is not None and tick.shape.action is ShapeAction.collapse and not tick.decisions
    assert pools.counts == {Pool.colocated: 1, Pool.prefill: 0, Pool.decode: 0}
    assert tick.shape.reason.startswith("Collapsed: 0 req/s fits 1 colocated worker")
    after = autoscaler.tick(1015.0)
    assert (
        after.shape is not None
        and after.shape.action is ShapeAction.keep
        and set(after.decisions) == {Pool.colocated}
    )
    assert after.shape.current == Shape(colocated=1) and len(pools.reshaped) == 1


def test_a_backend_that_cannot_change_the_shape_keeps_the_one_it_has():
    from tandem.operator.autoscale.core.shape_tick import shape_config

    spec = InferenceServiceSpec.model_validate(
        {**_spec().model_dump(by_alias=True), "mode": "auto", "roleFlip": True}
    )
    config = policy_config(spec, shipped_profile())
    pools = Pools({Pool.prefill: 1, Pool.decode: 1})
    target = Target("ns", "svc", (Pool.prefill, Pool.decode), 60, 90)
    idle = {"arrival_rate_rps": 0.0, "running_sequences": 0.0, "queued_prompt_tokens": 0.0}
    tick = Autoscaler(
        target, Fixed({p: idle for p in target.pools}), pools, config, shape_config(spec, config)
    ).tick(1000.0)
    assert tick.shape is None and set(tick.decisions) == {Pool.prefill, Pool.decode}

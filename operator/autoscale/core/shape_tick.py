"""The shape rule in the live loop (pure): the shape the pools have now, the load it serves, when the rule
speaks (mode auto), and the moves that take a running service from one shape to the other.

A change in flight (colocated workers beside prefill or decode ones) is not a shape: the rule waits for it
to settle. An idle window (no arrivals, nothing running or queued) is a load of zero, which one colocated
worker serves. A reshape flips warm workers where it can (drain, switch, weights kept), starts the workers
the target has beyond them, and drains the rest; its order never leaves a request without a worker: new
workers start first, flips to decode go before flips away from the decode side, drains go last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from tandem.operator.autoscale.core.config import PolicyConfig, PoolLimits
from tandem.operator.autoscale.core.shape import (
    Learned,
    Shape,
    ShapeConfig,
    ShapeDecision,
    ShapeLoad,
    decide_shape,
    learn_colocated,
    peak_load,
)
from tandem.operator.autoscale.core.sizing import missing
from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas
from tandem.spec import InferenceServiceSpec, Mode

SPLIT_POOLS = (Pool.prefill, Pool.decode)
SHAPE_POOLS = (Pool.colocated, Pool.prefill, Pool.decode)


def shape_config(spec: InferenceServiceSpec, config: PolicyConfig) -> ShapeConfig | None:
    """mode auto: the shape rule's settings (the policy's SLO, profile, margin and flip time, the spec's
    dwell, band and horizon); None for a fixed shape."""
    if spec.mode != Mode.auto:
        return None
    s = spec.autoscaling.shape
    return ShapeConfig.from_policy(
        config,
        dwell_s=s.dwell_seconds,
        band=s.band_percent / 100,
        horizon_s=s.horizon_seconds,
        gpus_per_replica=max(spec.decode.resources.gpus, 1),
    )


@dataclass(frozen=True)
class ShapeState:
    last_change_s: float = float("-inf")  # never changed: the first change waits no dwell
    recent: tuple[tuple[float, ShapeLoad], ...] = ()  # the windows of the last dwell (shape.peak_load)
    learned: Learned = (
        Learned()
    )  # the colocated model's error on this service's traffic (shape.learn_colocated)


def current_shape(replicas: Mapping[Pool, Replicas]) -> Shape | None:
    """The shape the pools have (ready and starting workers); None while a change is in flight."""
    counts = {pool: (replicas.get(pool) or Replicas(0)) for pool in SHAPE_POOLS}
    n = {pool: r.ready + r.starting for pool, r in counts.items()}
    if n[Pool.colocated] and (n[Pool.prefill] or n[Pool.decode]):
        return None
    return Shape(colocated=n[Pool.colocated], prefill=n[Pool.prefill], decode=n[Pool.decode])


def shape_pools(shape: Shape) -> tuple[Pool, ...]:
    """The pools the per-pool policy sizes in this shape."""
    return SPLIT_POOLS if shape.split else (Pool.colocated,)


def _idle(observations: Mapping[Pool, PoolObservation]) -> bool:
    return all(
        o.arrival_rate_rps is not None
        and not missing(o.arrival_rate_rps)
        and o.arrival_rate_rps <= 0
        and not (o.running_sequences or 0) > 0
        and not (o.queued_prompt_tokens or 0) > 0
        and not (o.held_requests or 0) > 0
        for o in observations.values()
    )


def load_of(observations: Mapping[Pool, PoolObservation], shape: Shape) -> ShapeLoad | None:
    """The load the current shape's pools observed; zero when they are idle; None while a metric is
    missing."""
    mine = {pool: o for pool, o in observations.items() if pool in shape_pools(shape)}
    if not mine:
        return None
    if _idle(mine):
        return ShapeLoad(rate_rps=0.0, prompt_tokens_mean=0.0, output_tokens_mean=0.0)
    return ShapeLoad.observed(mine)


def within(shape: Shape, limits: Mapping[Pool, PoolLimits]) -> Shape:
    """`shape` with each pool's count inside its bounds (pure); at least one worker of each kind it has."""

    def bound(pool: Pool, n: int) -> int:
        lim = limits.get(pool)
        return n if lim is None or not n else min(max(n, lim.min_replicas, 1), max(lim.max_replicas, 1))

    return Shape(
        bound(Pool.colocated, shape.colocated),
        bound(Pool.prefill, shape.prefill),
        bound(Pool.decode, shape.decode),
    )


def shape_tick(
    observations: Mapping[Pool, PoolObservation],
    replicas: Mapping[Pool, Replicas],
    state: ShapeState,
    cfg: ShapeConfig,
    now_s: float,
    limits: Mapping[Pool, PoolLimits] | None = None,
) -> tuple[ShapeDecision | None, ShapeState]:
    """The shape rule for one tick of a mode auto service: None while a change is in flight or a metric the
    rule needs is missing; otherwise its decision, its target within the pools' bounds, and the state for
    the next tick (a change restarts the dwell)."""
    shape = current_shape(replicas)
    if shape is None or shape.workers == 0:  # settling, or at zero (waking is the per-pool policy's)
        return None, state
    load = load_of(observations, shape)
    if load is None:
        return None, state
    peak, recent = peak_load(state.recent, load, now_s, cfg.dwell_s)
    learned = learn_colocated(state.learned, load, shape, cfg, now_s)
    state = replace(state, recent=recent, learned=learned)
    decision = decide_shape(peak, shape, now_s - state.last_change_s, cfg, learned.factor)
    bounded = within(decision.target, limits) if limits is not None else decision.target
    if bounded != decision.target:
        decision = replace(
            decision, target=bounded, reason=f"{decision.reason}; {bounded} within the pools' bounds"
        )
    if decision.target == decision.current:
        return decision, state
    return decision, replace(state, last_change_s=now_s)


@dataclass(frozen=True)
class Reshape:
    """How to move named workers (in their roles now) to a target shape: start `start` new workers by role,
    then run the flip `waves` one after another (worker -> new role), then drain `drain`."""

    start: dict[str, int] = field(default_factory=dict)
    waves: list[dict[str, str]] = field(default_factory=list)
    drain: list[str] = field(default_factory=list)


def reshape(roles: Mapping[str, str], target: Shape, order: Sequence[str] = ()) -> Reshape:
    """The moves from the workers `roles` names (name -> prefill | decode | colocated) to `target` (pure).
    `order` ranks the workers cheapest to move first (fewest running); others follow by name."""
    rank = {name: i for i, name in enumerate(order)}
    names = sorted(roles, key=lambda n: (rank.get(n, len(rank)), n))
    want = {"colocated": target.colocated, "prefill": target.prefill, "decode": target.decode}
    keep = {role: [n for n in names if roles[n] == role][: want[role]] for role in want}
    kept = {n for ns in keep.values() for n in ns}
    free = [n for n in names if n not in kept]
    # roles still short of workers, filled from the free ones: a prefill worker to colocated before a decode
    # one (the decode side keeps serving while it drains); in a split, flips fill prefill first and new
    # workers decode, which start (and serve) before any worker leaves the decode side
    short = [r for r in ("prefill", "decode", "colocated") for _ in range(want[r] - len(keep[r]))]
    free.sort(key=lambda n: (roles[n] != "prefill", rank.get(n, len(rank)), n))
    flips = dict(zip(free, short, strict=False))
    start: dict[str, int] = {}
    for r in short[len(flips) :]:
        start[r] = start.get(r, 0) + 1
    to_decode = {n: r for n, r in flips.items() if r == "decode"}
    waves = [w for w in (to_decode, {n: r for n, r in flips.items() if r != "decode"}) if w]
    return Reshape(start, waves, [n for n in free if n not in flips])

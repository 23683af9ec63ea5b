"""What the simulator replays and what a policy sees: requests, replicas, the run's configuration, the
snapshot a policy reads at each tick, its answer (replicas, or a Control with role flips) and the run's
result."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tandem.operator.autoscale.core.types import Pool, PoolObservation
from tandem.profile import Profile


@dataclass
class Request:
    id: int
    arrival_s: float
    input_len: int
    output_len: int
    first_token_s: float | None = None
    decode_start_s: float | None = None
    finish_s: float | None = None
    failed: bool = False
    remaining: int = 0  # decode tokens still to generate


@dataclass
class Replica:
    id: int
    pool: Pool
    ready_at_s: float
    started_s: float
    draining: bool = False
    gone_s: float | None = None
    # prefill
    queue: deque[Request] = field(default_factory=deque)
    serving: list[Request] = field(default_factory=list)  # the prompts of the prefill step in progress
    busy_until_s: float = 0.0
    busy_s: float = 0.0  # time spent serving, for utilisation metrics
    queued_tokens: int = 0
    # decode
    running: list[Request] = field(default_factory=list)
    waiting: deque[Request] = field(default_factory=deque)
    segment_start_s: float = 0.0
    step_s: float = 0.0
    version: int = 0
    # role flips (sim/flipping.py): the role it drains toward, and whether it ever served a role not its own
    flip_to: Pool | None = None
    flipped: bool = False

    def ready(self, now_s: float) -> bool:
        return self.gone_s is None and not self.draining and self.ready_at_s <= now_s

    def idle(self) -> bool:
        return not self.serving and not self.queue and not self.running and not self.waiting


@dataclass(frozen=True)
class SimConfig:
    profile: Profile
    interval_s: float = 15.0
    window_s: float = 60.0
    scrape_s: float = (
        15.0  # Prometheus' scrape interval: gauges and counters move the policy's view this often
    )
    cold_start_s: float | None = None  # None: the profile's
    percentile: float = 90.0
    drain: bool = True  # False: scale-down drops in-flight requests (a policy that does not drain)
    gpus_per_replica: int = 1
    flip_s: float = 2.0  # a drained worker serves its new role this long after it was asked to flip
    initial: dict[Pool, int] = field(default_factory=lambda: {Pool.prefill: 1, Pool.decode: 1})

    @property
    def cold_start(self) -> float:
        return self.profile.cold_start_ms / 1000 if self.cold_start_s is None else self.cold_start_s


@dataclass(frozen=True)
class Snapshot:
    """What a policy sees at a tick: per-pool observations plus the raw replicas (for load-based
    baselines)."""

    at_s: float
    observations: dict[Pool, PoolObservation]
    prefill_queued_tokens: list[int]  # per ready prefill replica
    decode_running: list[int]  # per ready decode replica
    prefill_busy_share: float  # mean over ready prefill replicas, over the window
    decode_context_mean: float


@dataclass(frozen=True)
class Control:
    """A policy's answer with role flips: desired replicas per pool (by role), then (source, target,
    workers)."""

    replicas: dict[Pool, int]
    flips: tuple[tuple[Pool, Pool, int], ...] = ()


# A policy: snapshot -> desired replicas per pool (pools it leaves out keep their count), or a Control.
Controller = Callable[[Snapshot], "dict[Pool, int] | Control"]


@dataclass
class SimResult:
    requests: list[Request]
    duration_s: float
    gpu_seconds: float
    timeline: list[tuple[float, int, int]]  # (t, prefill replicas billed, decode replicas billed)
    latency_timeline: list[tuple[float, float | None, float | None]]  # (t, ttft at p, tpot at p) per tick
    actions: dict[Pool, list[tuple[float, int, int]]]  # (t, from, to) per applied change
    flips: list[tuple[float, Pool, Pool, int]] = field(default_factory=list)  # (t, source, target, workers)
    colocated_timeline: list[tuple[float, int]] = field(
        default_factory=list
    )  # (t, colocated workers billed), `auto`
    shape_changes: list[tuple[float, str, str, str]] = field(
        default_factory=list
    )  # (t, from, to, reason), `auto`

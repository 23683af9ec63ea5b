"""When drafts keep being rejected, stop proposing for a while: speculation must never cost much over plain
decode.

Pure: a policy and an immutable per-sequence state, changed by each verify. A trusted sequence proposes
every step while its smoothed acceptance stays at or above `min_acceptance`. An untrusted one (new, or
whose acceptance fell) only probes, on steps that are multiples of its pause on the engine's step clock;
a probe that fails doubles the pause, one that succeeds restores trust. Probes of different sequences so
fall on the same steps: a step that verifies anything costs more than a plain one (a longer pass, another
attention path), and bunching the probes keeps most steps plain.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackoffPolicy:
    min_acceptance: float = 0.3  # accepted / proposed (smoothed while trusted) below which trust is lost
    smoothing: float = 0.5  # weight of the newest verify in the smoothed rate
    first_pause_steps: int = 8
    max_pause_steps: int = 128

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_acceptance <= 1.0 or not 0.0 < self.smoothing <= 1.0:
            raise ValueError("back-off needs min_acceptance in [0, 1] and smoothing in (0, 1]")
        if not 1 <= self.first_pause_steps <= self.max_pause_steps:
            raise ValueError("back-off needs 1 <= first_pause_steps <= max_pause_steps")


@dataclass(frozen=True)
class AcceptanceState:
    trusted: bool = False
    rate: float = 0.0  # smoothed acceptance while trusted
    pause: int = 0  # untrusted: probe only on steps that are multiples of this (0: the policy's first)


def may_propose(policy: BackoffPolicy, state: AcceptanceState, step: int) -> bool:
    return state.trusted or step % (state.pause or policy.first_pause_steps) == 0


def after_verify(
    policy: BackoffPolicy, state: AcceptanceState, proposed: int, accepted: int
) -> AcceptanceState:
    """The state once `accepted` of `proposed` drafts were verified."""
    if proposed <= 0:
        return state
    seen = accepted / proposed
    rate = (1 - policy.smoothing) * state.rate + policy.smoothing * seen if state.trusted else seen
    if rate >= policy.min_acceptance:
        return AcceptanceState(True, rate, 0)
    if state.trusted:
        return AcceptanceState(False, 0.0, policy.first_pause_steps)
    pause = min(2 * (state.pause or policy.first_pause_steps), policy.max_pause_steps)
    return AcceptanceState(False, 0.0, pause)

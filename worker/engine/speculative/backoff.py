"""When drafts keep being rejected, stop proposing for a while: speculation must never cost much over plain decode.

Pure: a policy and an immutable per-sequence state, with the two transitions the engine applies (a verify
happened; a step went by while paused). The acceptance rate is smoothed over recent verifies; below
`min_acceptance` the sequence pauses, for twice as long each time a probe after a pause fails again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class BackoffPolicy:
    min_acceptance: float = 0.3  # smoothed accepted / proposed below which proposing pauses
    smoothing: float = 0.5  # weight of the newest verify in the smoothed rate
    first_pause_steps: int = 4
    max_pause_steps: int = 128

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_acceptance <= 1.0 or not 0.0 < self.smoothing <= 1.0:
            raise ValueError("back-off needs min_acceptance in [0, 1] and smoothing in (0, 1]")
        if not 1 <= self.first_pause_steps <= self.max_pause_steps:
            raise ValueError("back-off needs 1 <= first_pause_steps <= max_pause_steps")


@dataclass(frozen=True)
class AcceptanceState:
    rate: float = 1.0  # smoothed acceptance; a new sequence starts out trusted
    pause_left: int = 0  # steps still to go without proposing
    next_pause: int = 0  # length of the next pause (0: the policy's first)

    @property
    def paused(self) -> bool:
        return self.pause_left > 0


def after_verify(policy: BackoffPolicy, state: AcceptanceState, proposed: int, accepted: int) -> AcceptanceState:
    """The state once `accepted` of `proposed` drafts were verified."""
    if proposed <= 0:
        return state
    rate = (1 - policy.smoothing) * state.rate + policy.smoothing * (accepted / proposed)
    if rate >= policy.min_acceptance:
        return AcceptanceState(rate, 0, 0)
    pause = state.next_pause or policy.first_pause_steps
    # after the pause the rate restarts at the threshold, so the probe that follows decides on its own
    return AcceptanceState(policy.min_acceptance, pause, min(2 * pause, policy.max_pause_steps))


def after_paused_step(state: AcceptanceState) -> AcceptanceState:
    return replace(state, pause_left=max(0, state.pause_left - 1))

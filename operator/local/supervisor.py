"""`tandem up` as a supervisor: when to restart a crashed child, and children that die with their parent.

A child that exits is started again after an exponential backoff (as a Deployment's pod would be), its
crash count forgotten once it has stayed up a while. Each child asks for PR_SET_PDEATHSIG on Linux as it
starts (`tandem.lifecycle`), so that even a `kill -9` of the supervisor takes every child with it.
"""

from __future__ import annotations

from dataclasses import dataclass

RESTART_BASE_S = 0.5
RESTART_CAP_S = 30.0
STABLE_AFTER_S = 60.0  # a child that ran this long before it crashed starts its backoff afresh
PR_SET_PDEATHSIG = 1


def restart_delay(crashes: int, base_s: float = RESTART_BASE_S, cap_s: float = RESTART_CAP_S) -> float:
    """Seconds before restart number `crashes` (1 for the first crash): doubling from `base_s` to `cap_s`."""
    return min(cap_s, base_s * 2 ** max(0, crashes - 1))


@dataclass
class ChildState:
    """One supervised child: when it last started, how often it crashed in a row, when it restarts."""

    started_at: float
    crashes: int = 0
    restart_at: float | None = None
    restarts: int = 0

    def exited(self, now: float, stable_after_s: float = STABLE_AFTER_S) -> float:
        """Record an exit at `now`; returns the delay before the restart (also kept in `restart_at`)."""
        self.crashes = 1 if now - self.started_at >= stable_after_s else self.crashes + 1
        delay = restart_delay(self.crashes)
        self.restart_at = now + delay
        return delay

    def restarted(self, now: float) -> None:
        self.started_at, self.restart_at = now, None
        self.restarts += 1

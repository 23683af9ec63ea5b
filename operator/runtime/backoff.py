"""How long a failed reconcile waits before its retry: exponential per object, capped, and no hot loop on
answers that only a spec edit (or an administrator) can change."""

from __future__ import annotations

BASE_SECONDS = 1.0
CAP_SECONDS = 300.0
# Bad request, forbidden (RBAC, quota), invalid: the same request gets the same answer until a change.
PERMANENT_STATUSES = frozenset({400, 403, 422})


# Server-side apply answers 500 when a manifest does not fit the object's schema (a pass-through field such as
# affinity with a typo): the same manifest always fails the same way.
SCHEMA_MISMATCH = "failed to create typed patch object"


def is_permanent(error: BaseException) -> bool:
    """True for an API answer that retrying the same request cannot change."""
    status = getattr(error, "status", None)
    return status in PERMANENT_STATUSES or (
        status == 500 and SCHEMA_MISMATCH in str(getattr(error, "message", ""))
    )


def retry_delay(
    error: BaseException, failures: int, base: float = BASE_SECONDS, cap: float = CAP_SECONDS
) -> float:
    """Seconds before retry number `failures` (1 for the first failure).

    Transient errors double from `base` up to `cap`; permanent ones wait `cap` at once (a new generation
    of the object retries immediately, see ReconcileQueue.trigger).
    """
    if is_permanent(error):
        return cap
    return min(cap, base * 2 ** max(0, failures - 1))

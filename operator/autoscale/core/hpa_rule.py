"""The HorizontalPodAutoscaler's replica rule, pure: shared by the simulator's HPA baseline and the HPA run
inside Dynamo's replay (which must import nothing beyond the policy's own modules)."""

from __future__ import annotations

import math


def hpa_recommendation(ready: int, missing: int, metric: float, target: float, tolerance: float) -> int:
    """The HPA's replica count from the mean metric of its ready pods, with its missing-pods rule: pods not
    ready yet count as using 0% of the target on the way up and 100% on the way down, and a change that
    they reverse or bring within the tolerance does not happen."""
    current = ready + missing
    ratio = metric / target
    if abs(ratio - 1) <= tolerance:
        return current
    if not missing:
        return math.ceil(ready * ratio)
    assumed = 0.0 if ratio > 1 else target
    ratio_all = (metric * ready + assumed * missing) / (target * current)
    if abs(ratio_all - 1) <= tolerance or (ratio_all > 1) != (ratio > 1):
        return current
    return math.ceil(current * ratio_all)

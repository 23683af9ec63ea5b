"""Learned cold starts: a new pod is Ready sooner when its node already has the model (a cache hit) than
when it must download it (a miss). The policy sizes for capacity one cold start ahead and reads one figure,
`PolicyConfig.cold_start_s`; this module learns the hit's and the miss's figures apart from the starts the
operator observed (status.coldStart, operator/status/cold_start.py) and gives the expected one."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tandem.operator.status.cold_start import pod_cold_start

Body = dict[str, Any]
HIT_KINDS = ("hit", "none")  # "none": nothing to download (model in the image or on a volume)


@dataclass(frozen=True)
class ColdStartFigures:
    """Median created -> Ready seconds of the starts seen, per kind, with how many of each."""

    hit_s: float | None
    miss_s: float | None
    hits: int
    misses: int

    def expected_s(self) -> float | None:
        """The cold start a new pod is expected to take: the hit's and the miss's figures weighted by how
        often each was seen (a node that has the model is as likely as it was); the one known figure alone;
        None with nothing seen (the profile's figure stands)."""
        if self.hit_s is None or self.miss_s is None:
            return self.hit_s if self.miss_s is None else self.miss_s
        share = self.hits / (self.hits + self.misses)
        return share * self.hit_s + (1 - share) * self.miss_s


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def learn(samples: Iterable[Body]) -> ColdStartFigures:
    """Figures from observed starts (cold_start.pod_cold_start's shape), one per pod; a start whose fetch
    reported nothing counts as a miss (the costlier guess)."""
    seen: dict[str, Body] = {}
    for s in samples:
        if "totalSeconds" in s:
            seen.setdefault(str(s.get("pod")), s)
    hits = [float(s["totalSeconds"]) for s in seen.values() if s.get("cache") in HIT_KINDS]
    misses = [float(s["totalSeconds"]) for s in seen.values() if s.get("cache") not in HIT_KINDS]
    return ColdStartFigures(_median(hits), _median(misses), len(hits), len(misses))


def observed(status: Body, pools: Iterable[str], pods: Iterable[Body]) -> list[Body]:
    """The starts of `pools` kept in an InferenceService's status, then those of its pods now Ready."""
    kept = [s for p in pools for s in ((status.get("coldStart") or {}).get(p) or {}).get("samples") or []]
    return kept + [s for pod in pods if (s := pod_cold_start(pod)) is not None]

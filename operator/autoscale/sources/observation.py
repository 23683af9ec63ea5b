"""Turn a source's values (one per PoolObservation field) into a PoolObservation: units, NaN, replicas."""

from __future__ import annotations

import math
from collections.abc import Mapping

from tandem.operator.autoscale.core.types import Pool, PoolObservation, Replicas
from tandem.operator.autoscale.sources.promql import SECONDS_FIELDS


def clean(value: float | None) -> float | None:
    """None for missing, NaN and infinite values (an empty histogram's quantile is NaN)."""
    if value is None or math.isnan(value) or math.isinf(value):
        return None
    return value


Figure = float | tuple[float, ...] | None  # one PoolObservation field as a source read it (slices: a tuple)


def observation(
    pool: Pool, values: Mapping[str, Figure], replicas: Replicas, at_s: float, window_s: float
) -> PoolObservation:
    fields: dict[str, Figure] = {}
    for name, value in values.items():
        if isinstance(value, tuple):
            fields[name] = value
            continue
        v = clean(value)
        fields[name] = v * 1000 if v is not None and name in SECONDS_FIELDS else v
    return PoolObservation(pool=pool, at_s=at_s, window_s=window_s, replicas=replicas, **fields)

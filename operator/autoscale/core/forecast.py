"""Arrival-rate forecasts: Holt's linear trend beside "last value", each scored on its one-step error.

The policy sizes a floor for the rate expected one cold start plus one interval ahead. Holt follows a
ramp; "last value" wins on flat or jumpy traffic. Both run on every observation, and the forecast comes
from whichever has the smaller recent absolute error, so a trend model never does worse for long than
doing nothing clever. Plain frozen data: the operator keeps one per pool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class RateForecaster:
    level: float
    trend: float  # per second
    last_value: float
    last_at_s: float
    error_holt: float = 0.0  # exponentially weighted mean absolute one-step error
    error_last: float = 0.0
    observations: int = 1
    alpha: float = 0.5  # level smoothing
    beta: float = 0.2  # trend smoothing
    error_decay: float = 0.3  # weight of the newest error


@dataclass(frozen=True)
class Forecast:
    rate_rps: float
    model: str  # "holt" or "last"


def start(value: float, at_s: float) -> RateForecaster:
    return RateForecaster(level=value, trend=0.0, last_value=value, last_at_s=at_s)


def observe(f: RateForecaster, value: float, at_s: float) -> RateForecaster:
    """Fold in one observation; a repeat or out-of-order timestamp changes nothing."""
    dt = at_s - f.last_at_s
    if dt <= 0:
        return f
    if f.observations == 1:  # the second point fixes the first trend (Holt's usual start)
        return replace(
            f, level=value, trend=(value - f.level) / dt, last_value=value, last_at_s=at_s, observations=2
        )
    predicted = f.level + f.trend * dt
    w = f.error_decay
    error_holt = (1 - w) * f.error_holt + w * abs(value - max(predicted, 0.0))
    error_last = (1 - w) * f.error_last + w * abs(value - f.last_value)
    level = f.alpha * value + (1 - f.alpha) * predicted
    trend = f.beta * (level - f.level) / dt + (1 - f.beta) * f.trend
    return replace(
        f,
        level=level,
        trend=trend,
        last_value=value,
        last_at_s=at_s,
        error_holt=error_holt,
        error_last=error_last,
        observations=f.observations + 1,
    )


def forecast(f: RateForecaster, horizon_s: float) -> Forecast:
    """The rate `horizon_s` after the last observation, from the better-scoring model (never below 0)."""
    if f.observations >= 3 and f.error_holt < f.error_last:
        return Forecast(max(f.level + f.trend * horizon_s, 0.0), "holt")
    return Forecast(f.last_value, "last")

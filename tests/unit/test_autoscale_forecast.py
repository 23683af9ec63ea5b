"""Rate forecasts: Holt follows a ramp, "last value" wins on a jumpy signal, and the better one is used."""

import pytest

from tandem.operator.autoscale.core import forecast as fc


def _run(values, step_s=15.0):
    f = fc.start(values[0], 0.0)
    for i, v in enumerate(values[1:], start=1):
        f = fc.observe(f, v, i * step_s)
    return f


def test_holt_extrapolates_a_ramp():
    f = _run([float(v) for v in range(0, 40, 2)])  # +2 req/s every 15 s
    out = fc.forecast(f, 45.0)
    assert out.model == "holt"
    assert out.rate_rps == pytest.approx(38 + 6, rel=0.1)  # three more steps of the ramp


def test_last_value_wins_after_a_step():
    f = _run([10.0] * 10 + [30.0] * 4)  # Holt overshoots the jump and keeps a trend for a while
    out = fc.forecast(f, 45.0)
    assert out.model == "last"
    assert out.rate_rps == 30.0


def test_flat_traffic_forecasts_itself():
    assert fc.forecast(_run([7.0] * 10), 60.0).rate_rps == pytest.approx(7.0)


def test_never_below_zero_and_repeats_are_ignored():
    f = _run([40.0, 30.0, 20.0, 10.0, 0.0, 0.0])
    assert fc.forecast(f, 600.0).rate_rps >= 0.0
    assert fc.observe(f, 99.0, f.last_at_s) is f

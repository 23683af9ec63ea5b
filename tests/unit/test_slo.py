"""One SLO type: the spec's defaults are its defaults, and its unit conversions agree both ways."""

import pytest

from tandem.slo import Slo
from tandem.spec_autoscaling import SloSpec


def test_the_spec_defaults_to_the_one_slo():
    assert SloSpec().to_slo() == Slo()
    assert SloSpec(ttft_ms=2000, tpot_ms=20, percentile=99).to_slo() == Slo(2000, 20, 99)


def test_seconds_and_fractions_round_trip():
    slo = Slo.from_seconds(0.25, 0.04, 0.95)
    assert (slo.ttft_ms, slo.tpot_ms, slo.percentile) == (
        pytest.approx(250),
        pytest.approx(40),
        pytest.approx(95),
    )
    assert (slo.ttft_s, slo.tpot_s, slo.objective) == (
        pytest.approx(0.25),
        pytest.approx(0.04),
        pytest.approx(0.95),
    )
    assert Slo.from_seconds(1, 1).percentile == Slo().percentile


def test_scaled_keeps_the_percentile():
    assert Slo(100, 10, 99).scaled(3, 0.5) == Slo(300, 5, 99)

"""The goodput sweep's arithmetic: attainment at a scaled SLO, goodput interpolated over rates, spreads."""

import pytest

from bench._goodput_sweep import (
    Goodput,
    Latency,
    Probe,
    attainment,
    goodput,
    goodput_per_repeat,
    ratios,
    short_prompt_ttft_p90,
    spread,
)
from tandem.slo import Slo


def test_attainment_counts_failures_as_misses_and_follows_the_scaled_slo():
    reqs = [
        Latency(True, 0.1, 0.01, 10),
        Latency(True, 0.3, 0.01, 10),
        Latency(False, None, None, 10),
        Latency(True, 0.1, 0.05, 10),
    ]
    idle = Slo(ttft_ms=100, tpot_ms=10)
    assert attainment(reqs, idle.scaled(1, 1)) == 0.25
    assert attainment(reqs, idle.scaled(3, 1)) == 0.5
    assert attainment(reqs, idle.scaled(3, 5)) == 0.75
    assert attainment([], idle) == 0.0


def test_goodput_interpolates_the_first_crossing_and_marks_the_grid_edges():
    assert goodput([(2.0, 0.5), (1.0, 1.0)], 0.9) == Goodput(pytest.approx(1.2))
    # a later rate that meets the target again (noise) does not lift goodput past the first crossing
    assert goodput([(1.0, 1.0), (2.0, 0.8), (3.0, 0.95)], 0.9).rate == pytest.approx(1.5)
    assert goodput([(1.0, 0.8), (2.0, 0.7)], 0.9) == Goodput(0.0, "<")
    assert goodput([(1.0, 1.0), (2.0, 0.9)], 0.9) == Goodput(2.0, ">=")
    assert str(Goodput(2.0, ">=")) == ">=2.00"


def test_goodput_per_repeat_and_side_by_side_ratios():
    ok, slow = Latency(True, 0.1, 0.01, 5), Latency(True, 9.0, 0.01, 500)
    probes = [
        Probe("a", 0, 1.0, (ok, ok)),
        Probe("a", 0, 2.0, (ok, slow)),
        Probe("a", 1, 1.0, (ok, ok)),
        Probe("a", 1, 2.0, (ok, ok)),
        Probe("b", 0, 1.0, (ok, slow)),
        Probe("b", 0, 2.0, (slow, slow)),
        Probe("b", 1, 1.0, (ok, ok)),
        Probe("b", 1, 2.0, (slow, slow)),
    ]
    slo = Slo(ttft_ms=1000, tpot_ms=1000)
    a, b = goodput_per_repeat(probes, "a", slo, 0.9), goodput_per_repeat(probes, "b", slo, 0.9)
    assert [g.rate for g in a] == [pytest.approx(1.2), 2.0] and a[1].bound == ">="
    assert b[0] == Goodput(0.0, "<") and b[1].rate == pytest.approx(1.1)
    assert ratios(a, b) == [pytest.approx(2.0 / 1.1)]  # repeat 0's zero denominator is skipped
    s = spread([1.0, 3.0, 2.0])
    assert (s.median, s.low, s.high) == (2.0, 1.0, 3.0) and str(s) == "2.00 [1.00-3.00]"
    assert short_prompt_ttft_p90(probes, "b", 2.0, 100) is None  # only long prompts there
    assert short_prompt_ttft_p90(probes, "a", 2.0, 100) == pytest.approx(0.1)

"""Workload building for `tandem bench`: Poisson schedule statistics, length ranges, shaping."""

from __future__ import annotations

import random
import statistics

import pytest

from tandem.loadgen.workload import (
    LengthRange,
    RequestSpec,
    parse_length,
    poisson_arrivals,
    poisson_workload,
    shape_workload,
)


def test_poisson_gaps_have_the_requested_rate_and_are_exponential() -> None:
    rate, n = 8.0, 20_000
    times = poisson_arrivals(rate, n, random.Random(1))
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert times[0] == 0.0 and len(times) == n
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.03)
    # exponential gaps: std == mean (coefficient of variation 1), median == ln 2 / rate
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)
    assert statistics.median(gaps) == pytest.approx(0.6931 / rate, rel=0.05)


def test_poisson_counts_per_second_have_variance_equal_to_mean() -> None:
    rate = 5.0
    times = poisson_arrivals(rate, 10_000, random.Random(7))
    counts = [0] * int(times[-1])
    for t in times:
        if int(t) < len(counts):
            counts[int(t)] += 1
    assert statistics.fmean(counts) == pytest.approx(rate, rel=0.05)
    assert statistics.pvariance(counts) == pytest.approx(rate, rel=0.15)


def test_poisson_is_reproducible_by_seed_and_infinite_rate_is_a_burst() -> None:
    assert poisson_arrivals(3, 50, random.Random(42)) == poisson_arrivals(3, 50, random.Random(42))
    assert poisson_arrivals(3, 50, random.Random(42)) != poisson_arrivals(3, 50, random.Random(43))
    assert poisson_arrivals(float("inf"), 4, random.Random(0)) == [0.0] * 4
    with pytest.raises(ValueError):
        poisson_arrivals(0, 4, random.Random(0))


def test_parse_length_fixed_and_ranges() -> None:
    assert parse_length("128") == LengthRange(128, 128)
    assert parse_length("64:256") == LengthRange(64, 256)
    assert parse_length("64-256") == LengthRange(64, 256)
    for bad in ("0", "9:3", "x"):
        with pytest.raises(ValueError):
            parse_length(bad)


def test_poisson_workload_draws_lengths_within_range() -> None:
    specs = poisson_workload(10, 500, LengthRange(5, 9), LengthRange(3, 3), random.Random(0))
    assert {s.output_len for s in specs} == {3}
    assert {s.input_len for s in specs} == set(range(5, 10))


def test_shape_workload_scales_clamps_and_caps() -> None:
    specs = [RequestSpec(10.0, 5000, 10), RequestSpec(12.0, 50, 900), RequestSpec(30.0, 7, 0)]
    shaped = shape_workload(specs, time_scale=2.0, max_input_len=512, max_output_len=64)
    assert [s.arrival_s for s in shaped] == [0.0, 1.0, 10.0]
    assert [(s.input_len, s.output_len) for s in shaped] == [(512, 10), (50, 64), (7, 1)]
    assert len(shape_workload(specs, max_requests=2)) == 2
    assert [s.arrival_s for s in shape_workload(specs, duration_s=5.0)] == [0.0, 2.0]
    assert shape_workload([]) == []

"""SLO search for the goodput benchmark: the highest rate whose attainment stays >= the target."""

from __future__ import annotations

import pytest

from tandem.loadgen.search import search_max_rate


def cliff(capacity: float):
    """Attainment 1.0 up to `capacity` req/s, falling linearly to 0 at twice that."""
    return lambda rate: 1.0 if rate <= capacity else max(0.0, 1.0 - (rate - capacity) / capacity)


@pytest.mark.parametrize("capacity", [0.3, 3.7, 12.0, 100.0])
def test_finds_the_rate_where_attainment_crosses_the_target(capacity: float) -> None:
    result = search_max_rate(cliff(capacity), start=2.0, rel_tol=0.02)
    limit = capacity * 1.1  # attainment is 0.9 exactly at 1.1 x capacity
    assert limit * 0.98 <= result.rate <= limit
    assert all(att >= 0.9 for rate, att in result.probes if rate <= result.rate)
    assert (result.rate, cliff(capacity)(result.rate)) in result.probes


def test_counts_probes_and_respects_the_budget() -> None:
    calls: list[float] = []

    def attainment(rate: float) -> float:
        calls.append(rate)
        return cliff(5.0)(rate)

    result = search_max_rate(attainment, start=1.0, max_probes=5)
    assert len(calls) == len(result.probes) == 5
    assert result.rate >= 4.0  # doubled 1, 2, 4 (pass), 8 (fail), then one bisection step at 6 (fail)


def test_nothing_passes_returns_zero() -> None:
    result = search_max_rate(lambda rate: 0.5, start=1.0, max_probes=30)
    assert result.rate == 0.0
    assert result.probes[-1][0] < 1.0 / 2**7


def test_max_rate_caps_the_search() -> None:
    result = search_max_rate(lambda rate: 1.0, start=1.0, max_rate=10.0)
    assert result.rate == 10.0
    assert [r for r, _ in result.probes] == [1.0, 2.0, 4.0, 8.0, 10.0]


def test_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        search_max_rate(lambda rate: 1.0, start=0.0)
    with pytest.raises(ValueError):
        search_max_rate(lambda rate: 1.0, start=1.0, growth=1.0)

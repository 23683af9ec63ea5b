"""Benchmark arithmetic for `tandem bench`: percentiles, TPOT/ITL, joint SLO attainment, goodput."""

from __future__ import annotations

import pytest

from tandem.loadgen.report import (
    format_table,
    latency_stats_ms,
    meets_slo,
    percentile,
    slo_attainment,
    summarize,
    throughput_timeseries,
    timeseries_bin_s,
)
from tandem.loadgen.result import RequestResult


def done(start: float, ttft: float, gaps: list[float], usage_tokens: int | None = None) -> RequestResult:
    """A successful request that started at `start` with its first token after `ttft` and then `gaps`."""
    times = [start + ttft]
    for gap in gaps:
        times.append(times[-1] + gap)
    e2e = times[-1] - start
    return RequestResult(
        input_len=10,
        output_len=len(times),
        start_s=start,
        end_s=start + e2e,
        ok=True,
        status="200",
        ttft_s=ttft,
        e2e_s=e2e,
        output_tokens=usage_tokens if usage_tokens is not None else len(times),
        usage_reported=usage_tokens is not None,
        token_times_s=times,
    )


def failed(status: str) -> RequestResult:
    return RequestResult(input_len=10, output_len=5, status=status, end_s=0.5)


def test_percentile_matches_linear_interpolation() -> None:
    values = [4.0, 1.0, 3.0, 2.0, 5.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 5.0
    assert percentile(values, 90) == pytest.approx(4.6)
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_latency_stats_are_in_ms() -> None:
    stats = latency_stats_ms([0.1, 0.2, 0.3])
    assert stats["count"] == 3
    assert stats["mean"] == pytest.approx(200.0)
    assert stats["p50"] == pytest.approx(200.0)
    assert stats["p90"] == pytest.approx(280.0)
    assert latency_stats_ms([])["p99"] is None


def test_tpot_and_itl_from_token_times() -> None:
    r = done(0.0, 0.5, [0.1, 0.2, 0.3])  # 4 tokens, e2e 1.1
    assert r.e2e_s == pytest.approx(1.1)
    assert r.itls_s == pytest.approx([0.1, 0.2, 0.3])
    assert r.tpot_s == pytest.approx(0.2)  # (1.1 - 0.5) / 3
    # usage says 7 tokens in 4 chunks: TPOT uses the token count, ITL the chunk gaps
    assert done(0.0, 0.5, [0.1, 0.2, 0.3], usage_tokens=7).tpot_s == pytest.approx(0.1)
    assert done(0.0, 0.5, []).tpot_s is None
    assert failed("500").tpot_s is None


def test_meets_slo_needs_both() -> None:
    assert meets_slo(True, 0.1, 0.02, 0.2, 0.05)
    assert not meets_slo(True, 0.3, 0.02, 0.2, 0.05)  # TTFT miss
    assert not meets_slo(True, 0.1, 0.06, 0.2, 0.05)  # TPOT miss
    assert not meets_slo(False, 0.1, 0.02, 0.2, 0.05)  # failed
    assert meets_slo(True, 0.1, None, 0.2, 0.05)  # single token: no TPOT
    assert meets_slo(True, 9.0, 9.0, None, None)  # no SLOs


def test_attainment_and_goodput_on_known_requests() -> None:
    results = [
        done(0.0, 0.1, [0.01, 0.01]),  # meets both
        done(0.5, 0.1, [0.01, 0.01]),  # meets both
        done(1.0, 0.4, [0.01, 0.01]),  # TTFT miss
        done(1.5, 0.1, [0.09, 0.09]),  # TPOT miss
        failed("429"),
    ]
    assert slo_attainment(results, 0.2, 0.05) == pytest.approx(2 / 5)
    assert slo_attainment(results, None, 0.05) == pytest.approx(3 / 5)
    assert slo_attainment(results, 0.2, None) == pytest.approx(3 / 5)
    assert slo_attainment([], 0.2, 0.05) is None

    summary = summarize(results, duration_s=4.0, slo_ttft_s=0.2, slo_tpot_s=0.05)
    assert summary["requests"] == 5 and summary["completed"] == 4 and summary["failed"] == 1
    assert summary["errors"] == {"429": 1}
    assert summary["request_throughput"] == pytest.approx(1.0)
    assert summary["output_token_throughput"] == pytest.approx(12 / 4)
    assert summary["goodput"] == pytest.approx(2 / 4)
    assert summary["slo_attainment"] == pytest.approx(0.4)
    assert summary["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert summary["tpot_ms"]["count"] == 4
    assert summary["itl_ms"]["count"] == 8
    assert summary["slo"] == {"ttft_ms": 200.0, "tpot_ms": 50.0}
    table = format_table(summary)
    assert "goodput" in table and "40.0%" in table and "429: 1" in table


def test_throughput_timeseries_bins_tokens_and_completions() -> None:
    results = [done(0.0, 0.2, [0.5, 0.5]), done(1.0, 0.1, [0.2], usage_tokens=4), failed("500")]
    series = throughput_timeseries(results, bin_s=1.0)
    # request 1 tokens at 0.2, 0.7, 1.2; request 2 chunks at 1.1, 1.3 carrying 2 tokens each
    assert series == [(0.0, 2.0, 0.0), (1.0, 5.0, 2.0)]
    assert throughput_timeseries([], 1.0) == []


def test_timeseries_bins_shrink_for_short_runs() -> None:
    assert timeseries_bin_s(600.0) == 1.0
    assert timeseries_bin_s(2.0) == pytest.approx(0.1)
    assert timeseries_bin_s(0.0) == 0.05

"""Benchmark arithmetic: percentiles, throughput, joint TTFT+TPOT SLO attainment and goodput (pure)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from tandem.loadgen.result import RequestResult

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's
    default); None for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be in [0, 100]")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def latency_stats_ms(values_s: Sequence[float]) -> dict[str, float | int | None]:
    """count, mean and p50/p90/p99 in milliseconds of latencies given in seconds."""
    stats: dict[str, float | int | None] = {"count": len(values_s)}
    stats["mean"] = 1000 * sum(values_s) / len(values_s) if values_s else None
    for q in PERCENTILES:
        p = percentile(values_s, q)
        stats[f"p{q}"] = None if p is None else 1000 * p
    return stats


def meets_slo(
    ok: bool, ttft_s: float | None, tpot_s: float | None, slo_ttft_s: float | None, slo_tpot_s: float | None
) -> bool:
    """Did one request meet both SLOs? A failed request never does; an SLO that is None always holds;
    a request with one output token has no TPOT and so meets any TPOT SLO."""
    if not ok or ttft_s is None:
        return False
    if slo_ttft_s is not None and ttft_s > slo_ttft_s:
        return False
    return not (slo_tpot_s is not None and tpot_s is not None and tpot_s > slo_tpot_s)


def count_good(results: Sequence[RequestResult], slo_ttft_s: float | None, slo_tpot_s: float | None) -> int:
    """How many requests met both SLOs."""
    return sum(meets_slo(r.ok, r.ttft_s, r.tpot_s, slo_ttft_s, slo_tpot_s) for r in results)


def slo_attainment(
    results: Sequence[RequestResult], slo_ttft_s: float | None, slo_tpot_s: float | None
) -> float | None:
    """Fraction of ALL requests sent (failures count as misses) meeting both SLOs; None if none sent."""
    if not results:
        return None
    return count_good(results, slo_ttft_s, slo_tpot_s) / len(results)


def summarize(
    results: Sequence[RequestResult],
    duration_s: float,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> dict[str, Any]:
    """The benchmark's headline numbers over a run that took `duration_s` of wall time."""
    ok = [r for r in results if r.ok]
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    output_tokens = sum(r.output_tokens for r in ok)
    good = count_good(results, slo_ttft_s, slo_tpot_s)
    return {
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": dict(Counter(r.status for r in results if not r.ok)),
        "duration_s": duration_s,
        "request_throughput": per_s(len(ok)),
        "output_token_throughput": per_s(output_tokens),
        "input_tokens": sum(r.input_len for r in ok),
        "output_tokens": output_tokens,
        "ttft_ms": latency_stats_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": latency_stats_ms([t for r in ok if (t := r.tpot_s) is not None]),
        "itl_ms": latency_stats_ms([gap for r in ok for gap in r.itls_s]),
        "e2e_ms": latency_stats_ms([r.e2e_s for r in ok if r.e2e_s is not None]),
        "slo": {
            "ttft_ms": None if slo_ttft_s is None else 1000 * slo_ttft_s,
            "tpot_ms": None if slo_tpot_s is None else 1000 * slo_tpot_s,
        },
        "slo_attainment": slo_attainment(results, slo_ttft_s, slo_tpot_s),
        "goodput": per_s(good),
    }


def throughput_timeseries(
    results: Sequence[RequestResult], bin_s: float = 1.0
) -> list[tuple[float, float, float]]:
    """(bin start, output tokens/s, completed requests/s) per time bin. When usage reports more tokens
    than there were chunks, each chunk carries an equal share of the request's tokens."""
    if bin_s <= 0:
        raise ValueError("bin_s must be > 0")
    tokens: defaultdict[int, float] = defaultdict(float)
    done: Counter[int] = Counter()
    for r in results:
        if not r.ok or not r.token_times_s:
            continue
        share = r.output_tokens / len(r.token_times_s)
        for t in r.token_times_s:
            tokens[int(t // bin_s)] += share
        done[int(r.end_s // bin_s)] += 1
    if not tokens and not done:
        return []
    last = max([*tokens, *done])
    return [(i * bin_s, tokens[i] / bin_s, done[i] / bin_s) for i in range(last + 1)]


def timeseries_bin_s(duration_s: float) -> float:
    """A bin width giving about 20 bins for short runs and 1 s bins for runs of 20 s or more."""
    return 1.0 if duration_s >= 20 else max(duration_s / 20, 0.05)


def _fmt(value: float | int | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary as (label, value) rows for a table."""
    rows = [
        ("requests (ok / failed)", f"{summary['completed']} / {summary['failed']}"),
        ("duration (s)", _fmt(summary["duration_s"], 2)),
        ("request throughput (req/s)", _fmt(summary["request_throughput"], 2)),
        ("output throughput (tok/s)", _fmt(summary["output_token_throughput"], 1)),
    ]
    if summary["errors"]:
        rows.append(("errors", ", ".join(f"{k}: {v}" for k, v in sorted(summary["errors"].items()))))
    for name in ("ttft", "tpot", "itl", "e2e"):
        stats = summary[f"{name}_ms"]
        rows.append(
            (
                f"{name.upper()} ms (p50 / p90 / p99)",
                " / ".join(_fmt(stats[f"p{q}"]) for q in PERCENTILES),
            )
        )
    slo = summary["slo"]
    if slo["ttft_ms"] is not None or slo["tpot_ms"] is not None:
        rows.append(("SLO TTFT / TPOT (ms)", f"{_fmt(slo['ttft_ms'], 0)} / {_fmt(slo['tpot_ms'], 0)}"))
        attainment = summary["slo_attainment"]
        rows.append(("SLO attainment (both)", "-" if attainment is None else f"{100 * attainment:.1f}%"))
        rows.append(("goodput (req/s)", _fmt(summary["goodput"], 2)))
    return rows


def format_table(summary: dict[str, Any]) -> str:
    """A plain-text table of the summary."""
    rows = summary_rows(summary)
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)

"""What `tandem top` shows, as pure data and a rich table: per-service state, sparklines, and Prometheus'
histogram_quantile rule applied to scraped buckets."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.table import Table
from rich.text import Text

from tandem.operator.autoscale.sources.scrape import histogram_quantile as scrape_quantile

SPARKS = "▁▂▃▄▅▆▇█"


@dataclass
class PoolState:
    desired: int | None = None
    ready: int | None = None


@dataclass
class ServiceState:
    """One InferenceService as seen now; None where the source does not know."""

    name: str
    namespace: str | None = None  # None: the source does not know (a router's /metrics)
    pools: dict[str, PoolState] = field(default_factory=dict)
    ttft_s: float | None = None  # at the SLO's percentile, over the last window
    tpot_s: float | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    objective: float | None = None  # the fraction of requests that must meet the targets
    attainment: dict[str, float] = field(default_factory=dict)  # by slo (ttft, tpot): fraction met
    requests_per_s: float | None = None
    errors_per_s: float | None = None
    last_scaling: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace or "", self.name)

    def merge(self, other: ServiceState) -> ServiceState:
        """Fields `other` knows override ours (sources are merged in order)."""
        out = ServiceState(self.name, self.namespace or other.namespace, {**self.pools})
        for pool, st in other.pools.items():
            mine = out.pools.get(pool, PoolState())
            out.pools[pool] = PoolState(
                st.desired if st.desired is not None else mine.desired,
                st.ready if st.ready is not None else mine.ready,
            )
        for f in (
            "ttft_s",
            "tpot_s",
            "slo_ttft_s",
            "slo_tpot_s",
            "objective",
            "requests_per_s",
            "errors_per_s",
            "last_scaling",
        ):
            ours, theirs = getattr(self, f), getattr(other, f)
            setattr(out, f, theirs if theirs is not None else ours)
        out.attainment = {**self.attainment, **other.attainment}
        return out


def merge_sources(*sources: Sequence[ServiceState]) -> list[ServiceState]:
    """One row per InferenceService: states with the same namespace and name merge, and a state whose
    namespace is unknown merges into the only one of that name (later sources win field by field)."""
    rows: list[ServiceState] = []
    for states in sources:
        for st in states:
            same = [
                r
                for r in rows
                if r.name == st.name and (r.namespace == st.namespace or None in (r.namespace, st.namespace))
            ]
            if len(same) == 1:
                rows[rows.index(same[0])] = same[0].merge(st)
            else:
                rows.append(st)
    return rows


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The autoscaler's scrape-side histogram_quantile (Prometheus' rule), with None instead of NaN for no
    data."""
    value = scrape_quantile(q, buckets)
    return None if math.isnan(value) else value


def sparkline(values: Sequence[float | None], width: int = 16) -> str:
    """The last `width` values as block characters scaled to their own max; a gap where a value is None."""
    tail = list(values)[-width:]
    known = [v for v in tail if v is not None]
    top = max(known, default=0.0)
    out = []
    for v in tail:
        if v is None:
            out.append(" ")
        else:
            out.append(
                SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1)))] if top > 0 else SPARKS[0]
            )
    return "".join(out)


class History:
    """Recent TTFT and TPOT values per service, for the sparklines."""

    def __init__(self, length: int = 32):
        self.length = length
        self.series: dict[tuple[tuple[str, str], str], deque[float | None]] = {}

    def add(self, state: ServiceState) -> None:
        for metric in ("ttft_s", "tpot_s"):
            d = self.series.setdefault((state.key, metric), deque(maxlen=self.length))
            d.append(getattr(state, metric))

    def get(self, state: ServiceState, metric: str) -> list[float | None]:
        return list(self.series.get((state.key, metric), ()))


def _ms(seconds: float | None) -> str:
    return (
        "-"
        if seconds is None
        else f"{seconds * 1000:.0f}ms"
        if seconds >= 0.01
        else f"{seconds * 1000:.1f}ms"
    )


def _latency(value: float | None, target: float | None, spark: str) -> Text:
    text = Text(
        _ms(value),
        style="bold red" if value is not None and target is not None and value > target else "green",
    )
    text.append(f" / {_ms(target)} " if target is not None else " ")
    text.append(spark, style="cyan")
    return text


def _pools(state: ServiceState) -> str:
    parts = []
    for pool in sorted(
        state.pools,
        key=lambda p: (
            ("prefill", "decode", "colocated", "router").index(p)
            if p in ("prefill", "decode", "colocated", "router")
            else 9
        ),
    ):
        st = state.pools[pool]
        ready = "?" if st.ready is None else str(st.ready)
        parts.append(f"{pool} {ready}/{st.desired}" if st.desired is not None else f"{pool} {ready}")
    return "  ".join(parts) or "-"


def _attainment(state: ServiceState) -> Text:
    text = Text()
    for slo in ("ttft", "tpot"):
        if slo in state.attainment:
            value = state.attainment[slo]
            bad = state.objective is not None and value < state.objective
            text.append(f"{slo} {value * 100:.1f}% ", style="bold red" if bad else "green")
    if state.objective is not None:
        text.append(f"(objective {state.objective * 100:.0f}%)", style="dim")
    return text or Text("-")


def table(states: Sequence[ServiceState], history: History, title: str = "tandem top") -> Table:
    """The view: one row per InferenceService."""
    t = Table(title=title, expand=False)
    for col in (
        "InferenceService",
        "pools ready/desired",
        "TTFT / SLO",
        "TPOT / SLO",
        "SLO attainment",
        "req/s",
        "last scaling",
    ):
        t.add_column(col, no_wrap=True)
    for s in sorted(states, key=lambda s: s.key):
        rate = "-" if s.requests_per_s is None else f"{s.requests_per_s:.2f}"
        if s.errors_per_s:
            rate += f" ({s.errors_per_s:.2f} err)"
        t.add_row(
            f"{s.namespace}/{s.name}" if s.namespace else s.name,
            _pools(s),
            _latency(s.ttft_s, s.slo_ttft_s, sparkline(history.get(s, "ttft_s"))),
            _latency(s.tpot_s, s.slo_tpot_s, sparkline(history.get(s, "tpot_s"))),
            _attainment(s),
            rate,
            s.last_scaling or "-",
        )
    if not states:
        t.add_row("(no InferenceService found)", "", "", "", "", "", "")
    return t

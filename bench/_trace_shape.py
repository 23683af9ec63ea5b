"""The goodput benchmark's workload decisions (pure): trace lengths scaled for a CPU model, arrivals at a
target rate, SLOs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tandem.loadgen.report import percentile
from tandem.loadgen.workload import RequestSpec, shape_workload
from tandem.slo import Slo


@dataclass(frozen=True)
class LengthShaping:
    """Trace lengths divided by `scale` (rounded, at least 1 token), then capped."""

    scale: float = 4.0
    max_input_len: int = 512
    max_output_len: int = 64

    def apply(self, spec: RequestSpec) -> RequestSpec:
        in_len = min(self.max_input_len, max(1, round(spec.input_len / self.scale)))
        out_len = min(self.max_output_len, max(1, round(spec.output_len / self.scale)))
        return RequestSpec(spec.arrival_s, in_len, out_len)


def thinned(
    trace: Sequence[RequestSpec], n: int, shaping: LengthShaping, shift: float = 0.0
) -> list[RequestSpec]:
    """`n` rows evenly spaced over the whole trace, in order, lengths shaped, arrivals re-based to 0: the
    lengths follow the whole trace's distribution (a short contiguous window need not) and the gaps are
    those of the thinned arrival process. `shift` in [0, 1) moves every row that fraction of the spacing
    on, so repeats can sample other rows of the same trace."""
    ordered = sorted(trace, key=lambda s: s.arrival_s)
    if not 2 <= n <= len(ordered):
        raise ValueError(f"need 2 <= n <= {len(ordered)} trace rows, got {n}")
    if not 0 <= shift < 1:
        raise ValueError(f"shift must be in [0, 1), got {shift}")
    offset = int(shift * len(ordered))
    rows = [ordered[(i * len(ordered) + offset) // n] for i in range(n)]
    return shape_workload([shaping.apply(s) for s in rows])


def mean_rate(specs: Sequence[RequestSpec]) -> float:
    """Requests per second over the window's arrivals (n - 1 gaps over the span)."""
    span = specs[-1].arrival_s - specs[0].arrival_s
    if len(specs) < 2 or span <= 0:
        raise ValueError("need at least two requests at different times")
    return (len(specs) - 1) / span


def at_rate(window: Sequence[RequestSpec], rate: float) -> list[RequestSpec]:
    """The window replayed with its inter-arrival pattern stretched or squeezed to `rate` req/s on average."""
    return shape_workload(window, time_scale=rate / mean_rate(window))


def requests_for_rate(rate: float, probe_s: float, lo: int, hi: int) -> int:
    """How many requests a probe at `rate` sends: about `probe_s` seconds of arrivals, within [lo, hi]."""
    return max(lo, min(hi, round(rate * probe_s)))


def median_lengths(specs: Sequence[RequestSpec]) -> tuple[int, int]:
    """(median input, median output) length of a shaped workload, as whole tokens."""
    return (
        round(percentile([s.input_len for s in specs], 50) or 1),
        round(percentile([s.output_len for s in specs], 50) or 1),
    )


def slo_from_idle(idle: Sequence[Slo], ttft_factor: float, tpot_factor: float) -> Slo:
    """SLOs as multiples of the idle latencies (each system's median TTFT and TPOT, as an Slo), from the
    slower system on each metric so that neither system's own idle overhead counts against it."""
    return Slo(ttft_factor * max(s.ttft_ms for s in idle), tpot_factor * max(s.tpot_ms for s in idle))

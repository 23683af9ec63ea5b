"""The soak's RSS report: growth per process incarnation, measured only after its own warm-up."""

from bench._soak import Sample, growth, replay_specs
from tandem.trace import TraceRequest


def _series(name: str, pid: int, start: float, rss: list[int], every: float = 5.0) -> list[Sample]:
    return [Sample(start + i * every, name, pid, r) for i, r in enumerate(rss)]


def test_growth_is_measured_after_the_warm_up_per_incarnation():
    warm = [50_000, 90_000, 100_000]  # loading the model: not growth
    router = _series("router", 1, 0.0, warm + [100_000] * 3 + [101_000] * 10 + [104_000] * 3)
    restarted = _series("decode-0", 7, 40.0, [60_000] * 3)  # killed again before its warm-up ended: no row
    (g,) = growth(router + restarted, warmup_s=15.0, min_span_s=30.0)
    assert (g.name, g.pid, g.baseline_kib, g.end_kib) == ("router", 1, 100_000, 104_000)
    assert round(g.percent, 1) == 4.0


def test_replay_keeps_the_trace_s_rhythm_at_the_asked_rate():
    trace = [TraceRequest(t, 1600, 160) for t in (0.0, 1.0, 3.0, 4.0)]
    specs = replay_specs(trace, rate_rps=3.0)
    assert [round(s[0], 3) for s in specs] == [0.0, 0.25, 0.75, 1.0]  # 3 gaps in 1 s
    assert all(200 <= s[1] < 204 and s[2] == 20 for s in specs)

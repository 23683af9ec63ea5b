"""`tandem top`'s pure parts: Prometheus' quantile rule on buckets, sparklines, a router's real exposition
turned into a row, InferenceService objects and Events, sources merged, and the rendered table."""

from __future__ import annotations

import datetime as dt
import math

from prometheus_client import generate_latest
from rich.console import Console

from tandem.operator.top.kube import last_scaling, service_state
from tandem.operator.top.scrape import parse, state
from tandem.operator.top.view import (
    History,
    PoolState,
    ServiceState,
    histogram_quantile,
    merge_sources,
    sparkline,
    table,
)
from tandem.slo import Slo
from tandem.worker.router.metrics import RouterMetrics


def test_histogram_quantile_follows_prometheus():
    buckets = [(0.1, 10.0), (0.2, 20.0), (math.inf, 20.0)]
    assert histogram_quantile(0.5, buckets) == 0.1
    assert histogram_quantile(0.75, buckets) == 0.15000000000000002  # linear inside (0.1, 0.2]
    assert (
        histogram_quantile(0.99, [(0.1, 10.0), (math.inf, 12.0)]) == 0.1
    )  # rank in +Inf: highest finite bound
    assert histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None  # no requests
    assert histogram_quantile(0.5, []) is None


def test_sparkline_scales_to_its_max_and_leaves_gaps():
    assert sparkline([0, 1, 2, None, 4]) == "▁▂▄ █"
    assert sparkline([0, 0]) == "▁▁"
    assert len(sparkline(list(range(40)), width=16)) == 16


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _router_text(fast: int, slow: int) -> str:
    """A real router registry after `fast` requests meeting a 100 ms TTFT target and `slow` missing it."""
    m = RouterMetrics(
        "llama",
        lambda: 0,
        slo=Slo(ttft_ms=100, tpot_ms=10, percentile=90),
        routable_workers=lambda: {"prefill": 1, "decode": 2, "colocated": 0},
    )
    clock = Clock()
    for ttft in [0.05] * fast + [0.4] * slow:
        req = m.start_request(clock)
        clock.t += ttft
        for _ in range(5):
            req.on_token()
            clock.t += 0.005
        req.finish("200")
    m.count("429")
    return generate_latest(m.registry).decode()


def test_router_exposition_becomes_a_row():
    first = parse(_router_text(0, 0), at=0.0)["llama"]
    cur = parse(_router_text(8, 2), at=10.0)["llama"]
    st = state("llama", cur, first, first)
    assert (st.slo_ttft_s, st.slo_tpot_s, st.objective) == (0.1, 0.01, 0.9)
    assert st.attainment == {"ttft": 0.8, "tpot": 1.0}  # 2 of 10 missed the TTFT target
    assert 0.3 < st.ttft_s <= 0.5  # p90 falls among the slow ones (the 0.3-0.5 bucket)
    assert st.tpot_s <= 0.0075
    assert st.pools == {"prefill": PoolState(None, 1), "decode": PoolState(None, 2)}
    assert st.requests_per_s == 1.0 and st.errors_per_s == 0.0  # 10 more in 10 s; the 429 was there at first
    since_start = state("llama", cur, cur, cur)  # the first poll: since the router started
    assert since_start.attainment["ttft"] == 0.8 and since_start.requests_per_s is None


def test_inference_service_and_its_scaling_events():
    obj = {
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {"slo": {"ttftMs": 300, "tpotMs": 40, "percentile": 95}},
        "status": {
            "pools": {
                "prefill": {"desiredReplicas": 2, "readyReplicas": 1},
                "decode": {"desiredReplicas": 3, "readyReplicas": 3},
            }
        },
    }
    st = service_state(obj)
    assert st.key == ("ml", "llama") and (st.slo_ttft_s, st.slo_tpot_s, st.objective) == (0.3, 0.04, 0.95)
    assert st.pools["prefill"] == PoolState(2, 1)
    now = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)

    def event(name, kind, reason, ago, message):
        return {
            "involvedObject": {"kind": kind, "name": name},
            "reason": reason,
            "message": message,
            "lastTimestamp": (now - dt.timedelta(seconds=ago)).isoformat().replace("+00:00", "Z"),
        }

    events = [
        event("llama-decode", "TandemPool", "Scaled", 90, "2 -> 3: TPOT p90 over target"),
        event("llama-prefill", "TandemPool", "SLOBreach", 30, "prefill 1->2: prefill queue wait"),
        event("llama", "InferenceService", "Ready", 5, "ready"),
        event("llamas-decode", "TandemPool", "Scaled", 1, "another service"),
    ]
    assert last_scaling(events, "llama", now) == "30s ago llama-prefill: prefill 1->2: prefill queue wait"
    assert last_scaling(events[:1], "llama", now) == "90s ago llama-decode: 2 -> 3: TPOT p90 over target"
    assert last_scaling(events[2:3], "llama", now) is None


def test_sources_merge_into_one_row_and_render():
    kube = ServiceState("llama", "ml", {"decode": PoolState(3, 2)}, slo_ttft_s=0.3, last_scaling="30s ago x")
    router = ServiceState(
        "llama", None, {"decode": PoolState(None, 3)}, ttft_s=0.45, attainment={"ttft": 0.5}, objective=0.95
    )
    other = ServiceState("llama", "other-ns")
    rows = merge_sources([kube, other], [router])
    assert len(rows) == 3  # the router's row (namespace unknown) cannot pick between two namespaces: its own
    (row,) = merge_sources([kube], [router])
    assert row.key == ("ml", "llama") and row.pools["decode"] == PoolState(3, 3) and row.ttft_s == 0.45
    history = History()
    for v in (0.1, 0.2, 0.45):
        row.ttft_s = v
        history.add(row)
    console = Console(record=True, width=200)
    console.print(table([row], history))
    text = console.export_text()
    assert "ml/llama" in text and "decode 3/3" in text and "450ms / 300ms" in text
    assert "ttft 50.0%" in text and "(objective 95%)" in text and "30s ago x" in text and "▂▄█" in text


def test_a_local_spec_gives_desired_replicas_and_the_slo(tmp_path):
    from tandem.operator.top.cli import parse_args, sources
    from tandem.operator.top.local import SpecSource
    from tandem.operator.top.scrape import RouterScrape

    path = tmp_path / "svc.yaml"
    path.write_text(
        "apiVersion: serving.tandem.dev/v1alpha1\nkind: InferenceService\nmetadata: {name: tiny}\n"
        "spec:\n  model: {source: {path: m}, servedName: tiny}\n  prefill: {replicas: 2}\n  decode: "
        "{replicas: 3}\n  slo: {ttftMs: 400, tpotMs: 30, percentile: 95}\n"
    )
    (st,) = SpecSource([str(path)]).poll()
    assert st.key == ("", "tiny") and st.pools == {
        "prefill": PoolState(2, None),
        "decode": PoolState(3, None),
    }
    assert (st.slo_ttft_s, st.slo_tpot_s, st.objective) == (0.4, 0.03, 0.95)
    (row,) = merge_sources([st], [ServiceState("tiny", None, {"prefill": PoolState(None, 1)}, ttft_s=0.2)])
    assert row.pools["prefill"] == PoolState(2, 1) and row.ttft_s == 0.2 and row.slo_ttft_s == 0.4
    # -f alone still scrapes the local router; --prometheus alone does not
    assert [type(s) for s in sources(parse_args(["-f", str(path)]))] == [SpecSource, RouterScrape]
    assert all(
        not isinstance(s, RouterScrape) for s in sources(parse_args(["--prometheus", "http://127.0.0.1:1"]))
    )


def test_an_unreachable_router_is_reported_in_the_title():
    import socket

    from tandem.operator.top.cli import poll_all
    from tandem.operator.top.scrape import RouterScrape

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    states, problems = poll_all([RouterScrape([f"http://127.0.0.1:{port}"])])
    assert states == [] and len(problems) == 1 and f"127.0.0.1:{port}/metrics" in problems[0]

"""The real-Prometheus fixture scrapes what a test gives it and answers PromQL through its HTTP API."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from tests.prometheus import PrometheusError, Target, config


def _exporter() -> tuple[str, Gauge, Counter, object]:
    registry = CollectorRegistry()
    gauge = Gauge("tandem_kv_blocks_used", "x", ["service", "pool"], registry=registry)
    counter = Counter("tandem_requests", "x", ["service", "pool", "status"], registry=registry)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    return f"127.0.0.1:{port}", gauge, counter, server


def test_config_groups_targets_by_path_and_honours_labels():
    cfg = config([Target("a:1", {"pod": "x"}), Target("b:2", path="/m"), Target("c:3")], scrape_interval="2s")
    assert cfg["global"]["scrape_interval"] == "2s"
    jobs = {j["metrics_path"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"/metrics", "/m"} and all(j["honor_labels"] for j in jobs.values())
    assert [g["targets"] for g in jobs["/metrics"]["static_configs"]] == [["a:1"], ["c:3"]]
    assert jobs["/metrics"]["static_configs"][0]["labels"] == {"pod": "x"}
    assert len({j["job_name"] for j in cfg["scrape_configs"]}) == 2


def test_scrapes_a_live_exporter_and_answers_queries(prometheus):
    address, gauge, counter, server = _exporter()
    try:
        gauge.labels(service="svc", pool="decode").set(7)
        counter.labels(service="svc", pool="router", status="200").inc(3)
        prom = prometheus([Target(address, {"namespace": "ns1"})])
        (target,) = prom.wait_targets_up()
        assert target["labels"]["namespace"] == "ns1"
        (series,) = prom.wait_for('tandem_kv_blocks_used{namespace="ns1"}')
        assert (
            series["metric"]["service"] == "svc" and series["metric"]["pool"] == "decode"
        )  # honoured, not exported_*
        assert float(series["value"][1]) == 7
        gauge.labels(service="svc", pool="decode").set(11)
        prom.wait_for("tandem_kv_blocks_used", ok=lambda r: bool(r) and float(r[0]["value"][1]) == 11)
        total = prom.query('sum(tandem_requests_total{status="200"})')
        assert float(total[0]["value"][1]) == 3
        assert prom.query("tandem_no_such_series") == []
        with pytest.raises(PrometheusError, match="parse"):
            prom.query("sum(")
    finally:
        server.shutdown()

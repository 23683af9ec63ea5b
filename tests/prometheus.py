"""A real Prometheus server for tests: started on a loopback port with a generated scrape config and a
temporary TSDB, queried through its HTTP API, stopped at the end. Skips when the binary is absent."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

INSTALL_HINT = "apt-get install prometheus (Debian's package brings prometheus and promtool)"


def binary(name: str = "prometheus") -> str | None:
    """The prometheus (or promtool) binary: $TANDEM_PROMETHEUS_BIN/<name>, else PATH."""
    folder = os.environ.get("TANDEM_PROMETHEUS_BIN")
    if folder and (Path(folder) / name).exists():
        return str(Path(folder) / name)
    return shutil.which(name)


def require(name: str = "prometheus") -> str:
    """The binary's path, or skip the test saying how to get it."""
    path = binary(name)
    if path is None:
        pytest.skip(f"no {name} binary on PATH: {INSTALL_HINT}")
    return path


@dataclass(frozen=True)
class Target:
    """One scrape target: host:port, the labels Prometheus attaches to its series, the metrics path."""

    address: str
    labels: dict[str, str] = field(default_factory=dict)
    path: str = "/metrics"


def config(
    targets: Sequence[Target],
    scrape_interval: str = "1s",
    rule_files: Sequence[Path] = (),
    job: str = "tandem",
) -> dict:
    """The prometheus.yml for `targets`: one job per metrics path, labels honoured the way the chart's
    PodMonitor does (honor_labels), so series keep the service and pool they export."""
    jobs: dict[str, list[dict]] = {}
    for t in targets:
        jobs.setdefault(t.path, []).append({"targets": [t.address], "labels": dict(t.labels)})
    scrape = [
        {
            "job_name": job if i == 0 else f"{job}-{i}",
            "metrics_path": path,
            "honor_labels": True,
            "static_configs": groups,
        }
        for i, (path, groups) in enumerate(sorted(jobs.items()))
    ]
    return {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": scrape_interval,
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": scrape,
    }


class PrometheusError(RuntimeError):
    pass


class Prometheus:
    """A client for one running server's HTTP API (instant and range queries, targets, rules, alerts)."""

    def __init__(self, url: str, config_file: Path, log_file: Path):
        self.url, self.config_file, self.log_file = url, config_file, log_file
        self.http = httpx.Client(base_url=url, timeout=10)

    def _get(self, path: str, **params) -> dict | list:
        resp = self.http.get(path, params=params)
        body = resp.json()
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's result list ({'metric': labels, 'value': [t, 'v']} for a vector)."""
        data = self._get("/api/v1/query", query=expr)
        assert isinstance(data, dict)
        result = data["result"]
        return result if data["resultType"] in ("vector", "matrix") else [{"metric": {}, "value": result}]

    def query_range(self, expr: str, start: float, end: float, step: str = "1s") -> list[dict]:
        data = self._get("/api/v1/query_range", query=expr, start=start, end=end, step=step)
        assert isinstance(data, dict)
        return data["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's `label_values(match, label)` variable query lists."""
        data = self._get(f"/api/v1/label/{label}/values", **{"match[]": match})
        assert isinstance(data, list)
        return data

    def targets(self) -> list[dict]:
        data = self._get("/api/v1/targets", state="active")
        assert isinstance(data, dict)
        return data["activeTargets"]

    def rule_groups(self) -> list[dict]:
        data = self._get("/api/v1/rules")
        assert isinstance(data, dict)
        return data["groups"]

    def alerts(self) -> list[dict]:
        data = self._get("/api/v1/alerts")
        assert isinstance(data, dict)
        return data["alerts"]

    def wait_for(
        self, expr: str, timeout_s: float = 30.0, ok: Callable[[list[dict]], bool] = bool
    ) -> list[dict]:
        """Poll `expr` until `ok(result)` (default: any series at all); the last result, or TimeoutError."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if ok(result):
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expr!r} gave {result} after {timeout_s:.0f}s")
            time.sleep(0.5)

    def wait_targets_up(self, timeout_s: float = 30.0) -> list[dict]:
        """Every configured target scraped successfully at least once."""
        deadline = time.monotonic() + timeout_s
        while True:
            targets = self.targets()
            if targets and all(t["health"] == "up" for t in targets):
                return targets
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"targets not up after {timeout_s:.0f}s: "
                    f"{[(t['scrapeUrl'], t['health'], t['lastError']) for t in targets]}"
                )
            time.sleep(0.3)

    def close(self) -> None:
        self.http.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_prometheus(
    targets: Sequence[Target],
    work_dir: Path,
    scrape_interval: str = "1s",
    rule_files: Sequence[Path] = (),
    ready_timeout_s: float = 30.0,
) -> Iterator[Prometheus]:
    """Start Prometheus scraping `targets` (config, TSDB and log under `work_dir`), wait until it is ready,
    yield a client, and stop the server (SIGTERM, then SIGKILL) however the block ends."""
    exe = require("prometheus")
    work_dir.mkdir(parents=True, exist_ok=True)
    config_file = work_dir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config(targets, scrape_interval, rule_files), sort_keys=False))
    port = _free_port()
    log_file = work_dir / "prometheus.log"
    argv = [
        exe,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={work_dir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        "--storage.tsdb.retention.time=1d",
        "--log.level=warn",
    ]
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    prom = Prometheus(f"http://127.0.0.1:{port}", config_file, log_file)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if proc.poll() is not None:
                raise PrometheusError(
                    "prometheus exited with "
                    f"{proc.returncode}:\n{log_file.read_text(errors='replace')[-3000:]}"
                )
            try:
                if prom.http.get("/-/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus not ready after {ready_timeout_s:.0f}s; log in {log_file}")
            time.sleep(0.2)
        yield prom
    finally:
        prom.close()
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

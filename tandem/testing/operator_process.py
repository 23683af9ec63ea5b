"""The operator (`python -m tandem.operator`) as a subprocess against a loopback ControlPlane, for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tandem.testing.cluster import LOOPBACK, ControlPlane, free_port


class Operator:
    """`python -m tandem.operator` as a subprocess against a ControlPlane, with the operator's own user."""

    def __init__(
        self,
        cp: ControlPlane,
        name: str = "operator",
        extra_env: dict | None = None,
        args: list[str] | None = None,
        kubeconfig: Path | None = None,
    ):
        """`args` replace the test defaults (lease timings) after `tandem operator`, e.g. the chart's own;
        `kubeconfig` replaces the tandem-operator user's, e.g. one with a ServiceAccount's token."""
        self.cp, self.name = cp, name
        # kwok's pods have made-up IPs that serve nothing: the autoscaler must never dial them, so by default
        # it reads "Prometheus" at a loopback port where none listens (metrics unavailable, pools hold).
        no_prometheus = f"http://127.0.0.1:{free_port()}"
        self.env = {
            "TANDEM_RESYNC_SECONDS": "10",
            "TANDEM_PROMETHEUS_URL": no_prometheus,
            **(extra_env or {}),
        }
        self.args = (
            args
            if args is not None
            else [
                "--lease-namespace",
                "default",
                "--lease-seconds",
                "6",
                "--renew-seconds",
                "4",
                "--retry-seconds",
                "1",
            ]
        )
        self.kubeconfig = kubeconfig or cp.kubeconfig("tandem-operator")
        self.proc: subprocess.Popen | None = None
        self.log_path = cp.logs / f"{name}.log"
        self.health_port = (
            free_port()
        )  # /healthz on loopback, whatever port `args` name (argparse: last wins)

    def start(self) -> Operator:
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tandem.operator",
                "--kubeconfig",
                str(self.kubeconfig),
                *self.args,
                "--health-port",
                str(self.health_port),
                "--health-host",
                LOOPBACK,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            start_new_session=True,
        )
        return self

    def wait_leading(self, timeout: float = 60) -> Operator:
        """Return once this operator holds the lease; fail fast, with its log, if it dies first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "leads" in self.log().split("waiting for")[-1]:
                return self
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"operator exited before leading:\n{self.log()[-4000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"operator did not lead within {timeout}s:\n{self.log()[-4000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a node failure or the OOM killer would: no cleanup, the Lease is left to expire."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

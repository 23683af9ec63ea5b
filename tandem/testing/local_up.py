"""`tandem up` as users run it, for the tests and benches that drive a local stack: the process on a free
block of loopback ports, and the workers its router can route to."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tandem import names
from tandem.operator.local.stack import free_port_block


def launch(spec: dict, work: Path, *flags: str, new_session: bool = False) -> tuple[subprocess.Popen, str]:
    """`tandem up -f` of `spec` (written to work/spec.yaml) with `flags` (`--create-tiny`), its output in
    work/tandem-up.log and its processes' logs under work/logs: the process and the router's URL, at once
    (it serves a while later). `new_session`: in a process group of its own, to be killed as one."""
    spec_file = work / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    port = free_port_block(24)
    with open(work / "tandem-up.log", "wb") as log:  # the child holds its own copy
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "tandem", "up", "-f", str(spec_file), *flags),
                *("--port", str(port), "--worker-port", str(port + 2), "--log-dir", str(work / "logs")),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
        )
    return proc, f"http://127.0.0.1:{port}"


def routable_workers(url: str) -> dict[str, int]:
    """The workers the router can route to, by role, from its /metrics; httpx.HTTPError when it does not
    answer."""
    text = httpx.get(f"{url}/metrics", timeout=5, trust_env=False).text
    by_role: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name == names.ROUTER_ROUTABLE_WORKERS:
            for s in family.samples:
                by_role[s.labels["role"]] = by_role.get(s.labels["role"], 0) + int(s.value)
    return by_role


def routable(url: str, role: str) -> int:
    """How many workers of `role` the router can route to (0 while it does not answer)."""
    try:
        return routable_workers(url).get(role, 0)
    except httpx.HTTPError:
        return 0

"""A fault-injecting proxy between the workers and the decode worker: a KV push cut or reset in the
middle of a transfer ends the request with a clear error and frees every block on both workers; a slow
link only slows it down; a stalled one (bytes held, connection open) is given up once the decode lease
runs out, the reservation freed, and the request fails over to the other decode worker or fails clearly;
once the link heals the stack serves again."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest

from tests.faultproxy import Fault, FaultProxy
from tests.integration.stacks import load, running_stack, spec

pytestmark = pytest.mark.slow

PROMPT = " ".join(f"word{i}" for i in range(150))  # ~700 tokens: MiBs of KV, pushed over gRPC
KV_CUT_AFTER = 64 * 1024


def _complete(url: str) -> httpx.Response:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=90)


def _routable_decode(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(
        float(li.split()[-1])
        for li in text.splitlines()
        if li.startswith("tandem_router_routable_workers{") and 'role="decode"' in li
    )


def _idle(plan, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while True:
        r = load(plan)
        if r.free_kv_blocks == r.total_kv_blocks and r.reserved_kv_blocks == 0 and r.running_sequences == 0:
            return r
        assert time.monotonic() < deadline, f"{plan.name} still holds blocks: {r}"
        time.sleep(0.1)


def _serves_again(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (r := _complete(url)).status_code != 200:
        assert time.monotonic() < deadline, f"the healed link does not serve: {r.status_code} {r.text}"
        time.sleep(0.5)


def _through_proxy(tmp_path, decode, others: tuple[str, ...] = ()) -> FaultProxy:
    """The router (and so the prefill worker) reach `decode` through a fault proxy; `others` directly."""
    proxy = FaultProxy(decode.address)
    workers_file = tmp_path / "workers.json"
    doc = json.loads(workers_file.read_text())
    doc["decode"] = [proxy.address, *others]
    workers_file.with_suffix(".tmp").write_text(json.dumps(doc))
    os.replace(workers_file.with_suffix(".tmp"), workers_file)
    deadline = time.monotonic() + 60
    while proxy.accepted == 0:  # the router re-read the file and dialled the proxy in the old address's place
        assert time.monotonic() < deadline, "the router never dialled the proxy"
        time.sleep(0.05)
    return proxy


def test_kv_push_cut_or_reset_mid_transfer(tiny_model_dir, tmp_path):
    obj = spec("kvfaults", tiny_model_dir)
    obj["spec"]["kvTransfer"] = {"transport": "grpc"}  # KV bytes on the socket, not in shared memory
    with running_stack(obj, tmp_path) as (stack, url):
        decode = next(p for p in stack.plans if p.role == "decode")
        prefill = next(p for p in stack.plans if p.role == "prefill")
        proxy = _through_proxy(tmp_path, decode)
        try:
            _serves_again(url)
            for mode in ("cut", "reset"):
                proxy.fault = Fault(mode, after_bytes=KV_CUT_AFTER)
                injected = proxy.faults_injected
                started = time.monotonic()
                r = _complete(url)
                assert r.status_code == 503, r.text
                error = r.json()["error"]
                assert error["type"] == "server_error" and "decode" in error["message"], (
                    error
                )  # not the prefill

                assert proxy.faults_injected > injected, "the transfer was never cut"
                assert time.monotonic() - started < 60
                _idle(decode)  # asked directly, not through the proxy: the reservation is gone
                _idle(prefill)
                proxy.fault = Fault()
                _serves_again(url)
            proxy.fault = Fault("delay", delay_s=0.005)
            assert _complete(url).status_code == 200
            proxy.fault = Fault()
            _idle(decode)
            assert _routable_decode(url) == 1
        finally:
            proxy.close()


LEASE_MS = 2000


def test_a_stalled_kv_link_is_given_up_at_the_lease_and_fails_over_or_fails_clearly(tiny_model_dir, tmp_path):
    obj = spec("kvstall", tiny_model_dir, decode=2)
    obj["spec"]["kvTransfer"] = {"transport": "grpc", "leaseMs": LEASE_MS}
    with running_stack(obj, tmp_path) as (stack, url):
        stalled, healthy = (p for p in stack.plans if p.role == "decode")
        prefill = next(p for p in stack.plans if p.role == "prefill")
        proxy = _through_proxy(tmp_path, stalled, others=(healthy.address,))
        try:
            _serves_again(url)
            # fail over: every request is answered; the ones that met the stall took about one lease more
            proxy.fault = Fault("stall", after_bytes=KV_CUT_AFTER)
            took = []
            while proxy.faults_injected == 0 or len(took) < 3:
                started = time.monotonic()
                r = _complete(url)
                took.append(time.monotonic() - started)
                assert r.status_code == 200, r.text
                assert len(took) < 30, "no request ever reached the stalled decode worker"
            assert max(took) < LEASE_MS / 1000 + 15, took  # not the 30-60 s transport timeouts
            _idle(stalled)  # asked directly: the lease freed the stalled reservation
            _idle(healthy)
            _idle(prefill)

            # fail clearly: with only the stalled worker there is nowhere to go
            proxy.fault = Fault()
            proxy.close()
            proxy = _through_proxy(tmp_path, stalled)
            _serves_again(url)
            proxy.fault = Fault("stall", after_bytes=KV_CUT_AFTER)
            started = time.monotonic()
            r = _complete(url)
            took_s = time.monotonic() - started
            assert r.status_code == 503, r.text
            assert r.json()["error"]["type"] == "server_error" and "decode" in r.json()["error"]["message"]
            assert proxy.faults_injected > 0
            assert LEASE_MS / 1000 <= took_s < LEASE_MS / 1000 + 15, took_s
            _idle(stalled)
            _idle(prefill)
            print(
                f"stall, lease {LEASE_MS} ms: slowest failed-over request {max(took):.1f} s, 503 after "
                f"{took_s:.1f} s"
            )
            proxy.fault = Fault()
            _serves_again(url)
        finally:
            proxy.close()

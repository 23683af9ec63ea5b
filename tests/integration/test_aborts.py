"""A client that leaves before its first token frees the decode reservation at once (not at lease expiry),
the KV gauge shows it without another engine step, and the router counts a disconnect, not a 500."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.integration.stacks import load, running_stack, spec

pytestmark = pytest.mark.slow

LEASE_S = 30.0  # the router's lease: freeing must come well before it


def _send_raw(url: str, body: dict) -> socket.socket:
    """POST a streaming request on a bare socket, so the test decides when the connection drops."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_client_gone_before_first_token_frees_the_decode_reservation_now(tiny_model_dir, tmp_path):
    obj = spec("aborts", tiny_model_dir, prefillChunkTokens=16)
    with running_stack(obj, tmp_path) as (stack, url):
        decode = next(p for p in stack.plans if p.role == "decode")
        prompt = " ".join(f"word{i}" for i in range(600))  # ~2.7k tokens, prefilled 16 at a time
        sock = _send_raw(url, {"model": "tiny", "prompt": prompt, "max_tokens": 64, "stream": True})
        deadline = time.monotonic() + 30
        while load(decode).reserved_kv_blocks == 0:
            assert time.monotonic() < deadline, "the decode worker never reserved blocks for the request"
            time.sleep(0.02)
        held = load(decode).reserved_kv_blocks
        sock.close()  # the client goes away while the prompt is still being prefilled
        gone = time.monotonic()
        while True:
            report = load(decode)
            if report.reserved_kv_blocks == 0 and report.free_kv_blocks == report.total_kv_blocks:
                break
            # now, not at the lease's expiry: a busy host may take seconds, the lease alone takes LEASE_S
            assert time.monotonic() - gone < LEASE_S / 2, f"{held} reserved blocks still held: {report}"
            time.sleep(0.05)
        host = decode.address.rsplit(":", 1)[0]
        worker_metrics = httpx.get(f"http://{host}:{decode.metrics_port}/metrics", timeout=5).text
        assert _metric(worker_metrics, "tandem_kv_blocks_used") == 0
        prefill = next(p for p in stack.plans if p.role == "prefill")
        deadline = time.monotonic() + LEASE_S / 2
        while (r := load(prefill)).free_kv_blocks != r.total_kv_blocks:
            assert time.monotonic() < deadline, f"prefill still holds blocks: {r}"
            time.sleep(0.05)
        router_metrics = httpx.get(f"{url}/metrics", timeout=5).text
        assert 'status="499"' in router_metrics and 'status="500"' not in router_metrics
        ok = httpx.post(
            f"{url}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4}, timeout=60
        )
        assert ok.status_code == 200

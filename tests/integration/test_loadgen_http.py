"""`tandem bench` against a real HTTP server on loopback: a tiny FastAPI double that streams OpenAI-style
SSE with injected delays, so the measured TTFT/ITL can be checked against what the server did. The double
notes when it really sent each token (a busy host stretches its sleeps), and the bench's figures are held to
those times, measured in the same run."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tandem.loadgen.cli import main

TTFT_S = 0.12  # the double waits this long before the first token
ITL_S = 0.04  # and this long between tokens
REJECT_EVERY = 5  # every 5th request gets a 429


def make_app() -> FastAPI:
    app = FastAPI()
    state = {"n": 0, "bodies": [], "sent": []}  # sent: per stream, the arrival and each token's send time
    app.state.seen = state

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "double-model", "object": "model"}]}

    async def stream(body: dict, chat: bool, arrived: float):
        n_tokens = int(body["max_tokens"])
        sent = [arrived]
        state["sent"].append(sent)
        await asyncio.sleep(TTFT_S)
        if chat:  # like vLLM: a role-only chunk first, which must not count as the first token
            yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"
        for i in range(n_tokens):
            if i:
                await asyncio.sleep(ITL_S)
            piece = {"delta": {"content": f" t{i}"}} if chat else {"text": f" t{i}"}
            sent.append(time.monotonic())
            yield "data: " + json.dumps({"choices": [{"index": 0, **piece}]}) + "\n\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 1, "completion_tokens": n_tokens, "total_tokens": n_tokens + 1}
            yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n"
        yield "data: [DONE]\n\n"

    async def handle(request: Request, chat: bool):
        arrived = time.monotonic()
        body = await request.json()
        state["n"] += 1
        state["bodies"].append(body)
        if state["n"] % REJECT_EVERY == 0:
            return JSONResponse({"error": {"message": "busy", "code": 429}}, status_code=429)
        return StreamingResponse(stream(body, chat, arrived), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await handle(request, chat=True)

    return app


@pytest.fixture
def server() -> Iterator[tuple[str, FastAPI]]:
    app = make_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline, "test server did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}", app
    srv.should_exit = True
    thread.join(timeout=5)
    sock.close()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_bench_measures_injected_delays(server, endpoint: str, tmp_path: Path) -> None:
    url, app = server
    out = tmp_path / "out"
    argv = [
        "--url",
        url,
        "--endpoint",
        endpoint,
        "--rate",
        "20",
        "--num-requests",
        "10",
        "--input-len",
        "8:16",
        "--output-len",
        "6",
        "--seed",
        "3",
        "--no-progress",
        "--slo-ttft-ms",
        "1000",
        "--slo-tpot-ms",
        "1000",
        "--out",
        str(out),
    ]
    assert main(argv) == 0

    doc = json.loads((out / "results.json").read_text())
    summary = doc["summary"]
    assert doc["config"]["model"] == "double-model"  # discovered from /v1/models
    assert summary["requests"] == 10
    assert summary["errors"] == {"429": 2}
    assert summary["completed"] == 8
    assert summary["output_tokens"] == 8 * 6
    # The client can only see the delays later than the server makes them, never earlier; the reference is
    # what the server really did in this run (its sleeps stretch on a busy host). The slack is for the client,
    # which shares the machine (and one GIL) with the server; TTFT also pays for the connection. What must
    # hold: TTFT sits at the server's first token, not at ITL, and ITL at its gaps between tokens.
    sent = app.state.seen["sent"]
    server_ttft = 1000 * statistics.median(s[1] - s[0] for s in sent)
    server_itl = 1000 * statistics.median(b - a for s in sent for a, b in itertools.pairwise(s[1:]))
    ttft, itl, tpot = summary["ttft_ms"], summary["itl_ms"], summary["tpot_ms"]
    assert (
        1000 * TTFT_S <= server_ttft <= ttft["p50"] < server_ttft + 1000
    )  # a disk-busy host once gave 674 ms
    assert 1000 * ITL_S <= server_itl
    assert server_itl * 0.8 <= itl["p50"] < server_itl + 60, (itl, server_itl)
    assert server_itl * 0.8 <= tpot["p50"] < server_itl + 60, (tpot, server_itl)
    assert ttft["p50"] > 2 * itl["p50"]
    assert itl["count"] == 8 * 5
    # joint SLO: generous SLOs, so exactly the 8 successes meet them; the 2 rejections do not
    assert summary["slo_attainment"] == pytest.approx(0.8)
    assert summary["goodput"] == pytest.approx(8 / summary["duration_s"])
    assert all(r["usage_reported"] for r in doc["requests"] if r["ok"])

    for png in ("latency_cdf.png", "throughput.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    bodies = app.state.seen["bodies"]
    assert all(b["stream"] and b["ignore_eos"] and b["max_tokens"] == b["min_tokens"] == 6 for b in bodies)
    prompt_words = [len((b.get("prompt") or b["messages"][0]["content"]).split()) for b in bodies]
    assert all(8 <= n <= 16 for n in prompt_words)


def test_bench_tight_ttft_slo_fails_everyone(server, tmp_path: Path) -> None:
    url, _ = server
    argv = [
        "--url",
        url,
        "--model",
        "double-model",
        "--rate",
        "inf",
        "--num-requests",
        "5",
        "--input-len",
        "4",
        "--output-len",
        "3",
        "--no-progress",
        "--concurrency",
        "2",
        "--slo-ttft-ms",
        str(1000 * TTFT_S / 2),
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "results.json").read_text())["summary"]
    assert summary["completed"] == 4 and summary["slo_attainment"] == 0.0 and summary["goodput"] == 0.0
    # concurrency 2 and 4 streams of 3 tokens: two waves, each at least TTFT + 2 ITL long
    assert summary["duration_s"] >= 2 * (TTFT_S + 2 * ITL_S)


def test_bench_unreachable_server_counts_connection_errors(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [
        "--url",
        f"http://127.0.0.1:{port}",
        "--model",
        "m",
        "--num-requests",
        "3",
        "--output-len",
        "2",
        "--no-progress",
        "--timeout",
        "5",
    ]
    assert main(argv) == 1  # nothing completed

"""The router's models, health and metrics endpoints, its SLO series, and what stays off the API port."""

from __future__ import annotations

import pytest

from tandem import names
from tandem.slo import Slo
from tandem.worker.router.app import create_app
from tandem.worker.router.metrics import slo_outcomes
from tests.unit.router_harness import SERVED, ScriptedBackend, client_for, post

# ---- models, health, metrics ----


@pytest.mark.asyncio
async def test_models_liveness_and_readiness(tok):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    async with client_for(app) as c:
        models = (await c.get("/v1/models")).json()
        assert models["object"] == "list" and [m["id"] for m in models["data"]] == [SERVED]
        for path in (names.LIVENESS_PATH, names.READINESS_PATH, "/health"):
            assert (await c.get(path)).status_code == 200, path
        backend.healthy = (
            False  # no worker can serve: not ready, but the process is alive and must not be restarted
        )
        assert (await c.get(names.LIVENESS_PATH)).status_code == 200
        for path in (names.READINESS_PATH, "/health"):
            r = await c.get(path)
            assert r.status_code == 503 and r.json()["status"] == "unavailable", path


@pytest.mark.asyncio
async def test_metrics_after_a_request(tok):
    backend = ScriptedBackend(tok)
    backend.delay_s = 0.002
    app = create_app(backend, tok, SERVED, service_name="svc")
    other = create_app(ScriptedBackend(tok), tok, SERVED, service_name="other")  # own registry: no clash
    await post(app, "/v1/completions", {"model": SERVED, "prompt": "x", "stream": True})
    await post(app, "/v1/completions", {"model": "nope", "prompt": "x"})
    async with client_for(app) as c:
        r = await c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    labels = 'pool="router",service="svc"'
    n = len(backend.ids)
    routed = 'pool="router",prefill="disaggregated",service="svc"'
    assert f"tandem_ttft_seconds_count{{{routed}}} 1.0" in text
    assert f"tandem_tpot_seconds_count{{{labels}}} 1.0" in text
    assert f"tandem_inter_token_latency_seconds_count{{{labels}}} {float(n - 1)}" in text
    assert f"tandem_e2e_latency_seconds_count{{{labels}}} 1.0" in text
    assert f'tandem_requests_total{{{routed},status="200"}} 1.0' in text
    # refused before it was routed: counted with prefill="none"
    assert 'tandem_requests_total{pool="router",prefill="none",service="svc",status="404"} 1.0' in text
    assert f"tandem_router_queue_depth{{{labels}}} 0.0" in text
    # what the autoscaler reads: arrivals (the 404 arrived too), prompt and output lengths of the served one
    assert f"tandem_request_arrivals_total{{{labels}}} 2.0" in text
    assert f"tandem_request_prompt_tokens_count{{{labels}}} 1.0" in text
    assert f"tandem_request_output_tokens_count{{{labels}}} 1.0" in text
    assert f"tandem_request_output_tokens_sum{{{labels}}} {float(n)}" in text
    tpot_sum = float(
        next(li for li in text.splitlines() if li.startswith("tandem_tpot_seconds_sum")).split()[-1]
    )
    assert 0.0015 < tpot_sum < 1.0  # about the scripted 2 ms per token
    async with client_for(other) as c:
        assert 'service="other"' in (await c.get("/metrics")).text


@pytest.mark.asyncio
async def test_slo_series_judge_each_completed_request(tok):
    backend = ScriptedBackend(tok)
    backend.delay_s = 0.02  # 20 ms per token: meets a 1 s TTFT target, misses a 5 ms TPOT target
    app = create_app(
        backend, tok, SERVED, service_name="svc", slo=Slo(ttft_ms=1000, tpot_ms=5, percentile=95)
    )
    await post(app, "/v1/completions", {"model": SERVED, "prompt": "x", "stream": True})
    await post(app, "/v1/completions", {"model": "nope", "prompt": "x"})  # a 404 is not judged
    async with client_for(app) as c:
        text = (await c.get("/metrics")).text
    labels = 'pool="router",service="svc"'
    assert f'tandem_slo_target_seconds{{{labels},slo="ttft"}} 1.0' in text
    assert f'tandem_slo_target_seconds{{{labels},slo="tpot"}} 0.005' in text
    assert f'tandem_slo_objective_ratio{{{labels},slo="tpot"}} 0.95' in text
    assert f'tandem_slo_requests_total{{met="true",{labels},slo="ttft"}} 1.0' in text
    assert f'tandem_slo_requests_total{{met="false",{labels},slo="ttft"}} 0.0' in text
    assert f'tandem_slo_requests_total{{met="false",{labels},slo="tpot"}} 1.0' in text
    assert f'tandem_slo_requests_total{{met="true",{labels},slo="tpot"}} 0.0' in text
    assert 'tandem_router_routable_workers{pool="router",role="prefill",service="svc"} 2.0' in text
    backend.healthy = False
    async with client_for(app) as c:
        assert (
            'tandem_router_routable_workers{pool="router",role="decode",service="svc"} 0.0'
            in (await c.get("/metrics")).text
        )


def test_slo_outcomes():
    slo = Slo(ttft_ms=500, tpot_ms=50)
    assert slo_outcomes(slo, 0.5, 0.051) == {"ttft": True, "tpot": False}
    assert slo_outcomes(slo, 0.6, None) == {"ttft": False}  # one token: no TPOT to judge


@pytest.mark.asyncio
async def test_where_the_prompt_ran_is_a_response_header_and_a_metric_label(tok):
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED)
    for route, stream in (("local", True), ("local", False), ("disaggregated", False)):
        backend.route = route
        r = await post(app, "/v1/completions", {"model": SERVED, "prompt": "x", "stream": stream})
        assert r.status_code == 200 and r.headers[names.PREFILL_ROUTE_HEADER] == route
    text = (await client_for(app).get("/metrics")).text
    for route, n in (("local", 2), ("disaggregated", 1)):
        labels = f'pool="router",prefill="{route}",service="default"'
        assert f"tandem_ttft_seconds_count{{{labels}}} {float(n)}" in text
        assert f'tandem_requests_total{{{labels},status="200"}} {float(n)}' in text


@pytest.mark.asyncio
async def test_metrics_and_docs_stay_off_the_api_port_unless_asked(tok):
    hidden = create_app(ScriptedBackend(tok), tok, SERVED, public_metrics=False)
    async with client_for(hidden) as c:
        for path in ("/metrics", "/docs", "/redoc", "/openapi.json"):
            assert (await c.get(path)).status_code == 404, path
        assert (await c.get(names.LIVENESS_PATH)).status_code == 200
    shown = create_app(ScriptedBackend(tok), tok, SERVED, public_metrics=True, docs=True)
    async with client_for(shown) as c:
        for path in ("/metrics", "/docs", "/openapi.json"):
            assert (await c.get(path)).status_code == 200, path

"""The router's vLLM-named series: vLLM's names, buckets and `model_name` label, fed by the observations
tandem's own series get (one request's first token, each later token, its completion)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tandem import names
from tandem.worker.router.metrics import (
    VLLM_E2E_BUCKETS,
    VLLM_ITL_BUCKETS,
    VLLM_TTFT_BUCKETS,
    RouterMetrics,
)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _serve(m: RouterMetrics, prompt: int, tokens: int, ttft: float, gap: float, status: str = "200") -> None:
    clock = Clock()
    req = m.start_request(clock)
    req.on_prompt(prompt)
    clock.t += ttft
    for _ in range(tokens):
        req.on_token()
        clock.t += gap
    req.finish(status)


def test_vllm_series_match_tandems():
    m = RouterMetrics("svc", lambda: 0, model_name="llama-3")
    _serve(m, prompt=12, tokens=5, ttft=0.2, gap=0.02)
    _serve(m, prompt=30, tokens=3, ttft=1.5, gap=0.05)
    _serve(m, prompt=7, tokens=0, ttft=0.1, gap=0.0, status="503")  # failed before its first token
    get = m.registry.get_sample_value
    ours, vllm = {"service": "svc", "pool": "router"}, {"model_name": "llama-3"}

    def ttft(suffix: str) -> float:  # tandem's TTFT is split by where the prompt ran
        return sum(
            get(names.TTFT_SECONDS + suffix, {**ours, "prefill": p}) or 0 for p in ("none", "disaggregated")
        )

    assert get(names.VLLM_TTFT_SECONDS + "_count", vllm) == ttft("_count") == 2
    assert get(names.VLLM_TTFT_SECONDS + "_sum", vllm) == ttft("_sum")
    for theirs, mine in (
        (names.VLLM_ITL_SECONDS, names.ITL_SECONDS),
        (names.VLLM_E2E_SECONDS, names.E2E_SECONDS),
    ):
        for suffix in ("_count", "_sum"):
            assert get(theirs + suffix, vllm) == get(mine + suffix, ours), theirs + suffix
    assert get(names.VLLM_ITL_SECONDS + "_count", vllm) == 4 + 2
    # prompts count once prefilled (the failed one never was); every generated token counts
    assert get(names.VLLM_PROMPT_TOKENS + "_total", vllm) == 12 + 30
    assert (
        get(names.VLLM_GENERATION_TOKENS + "_total", vllm)
        == get(names.REQUEST_OUTPUT_TOKENS + "_sum", ours)
        == 8
    )


def test_vllm_histograms_use_vllms_buckets_and_label():
    m = RouterMetrics("svc", lambda: 0, model_name="llama-3")
    _serve(m, prompt=4, tokens=2, ttft=0.01, gap=0.01)
    text = m.exposition()[0].decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, buckets in (
        (names.VLLM_TTFT_SECONDS, VLLM_TTFT_BUCKETS),
        (names.VLLM_ITL_SECONDS, VLLM_ITL_BUCKETS),
        (names.VLLM_E2E_SECONDS, VLLM_E2E_BUCKETS),
    ):
        f = families[name]
        assert f.type == "histogram"
        les = [float(s.labels["le"]) for s in f.samples if s.name.endswith("_bucket")]
        assert les == [*buckets, float("inf")], name
        assert {frozenset(s.labels) - {"le"} for s in f.samples} == {frozenset({"model_name"})}
    assert len(VLLM_TTFT_BUCKETS) == 22 and len(VLLM_ITL_BUCKETS) == 19 and len(VLLM_E2E_BUCKETS) == 21
    assert f'{names.VLLM_PROMPT_TOKENS}_total{{model_name="llama-3"}} 4.0' in text


def test_metrics_port_keeps_vllms_colons_whatever_the_scraper_asks():
    """A Prometheus server asks for OpenMetrics, whose prometheus_client output rewrites `vllm:` to `vllm_`
    in the samples; the workers' metrics port answers in the classic text format, names intact."""
    import httpx

    from tandem.worker.api.metrics_http import serve_metrics

    m = RouterMetrics("svc", lambda: 0, model_name="llama-3")
    _serve(m, prompt=4, tokens=2, ttft=0.01, gap=0.01)
    server = serve_metrics(0, "127.0.0.1", m.registry)
    try:
        accept = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"
        resp = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", headers={"Accept": accept})
    finally:
        server.shutdown()
        server.server_close()
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain;")
    assert f'{names.VLLM_PROMPT_TOKENS}_total{{model_name="llama-3"}} 4.0' in resp.text
    assert "vllm_" not in resp.text

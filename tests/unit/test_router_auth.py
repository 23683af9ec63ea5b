"""Router API keys: without or with a wrong `Authorization: Bearer` key a request gets a 401 in the OpenAI
error shape (the openai client raises AuthenticationError), probes stay open, /metrics has its own switch,
and a rotated keys file takes effect without a restart."""

from __future__ import annotations

import os

import httpx
import pytest

from tandem.worker.router.app import create_app
from tandem.worker.router.auth import ApiKeys, bearer_token, parse_keys
from tests.unit.router_harness import SERVED, ScriptedBackend, client_for

BODY = {"model": SERVED, "prompt": "Once upon a time", "max_tokens": 4}


def test_parse_keys_and_bearer():
    assert parse_keys("k1\n# a comment\n\n k2 , k3 # trailing\n") == {"k1", "k2", "k3"}
    assert bearer_token("Bearer abc") == "abc" and bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None and bearer_token("Bearer") is None and bearer_token(None) is None


def test_keys_from_env_and_nothing_configured(monkeypatch):
    monkeypatch.setenv("ROUTER_KEYS", "a,b")
    keys = ApiKeys.from_sources(None, "ROUTER_KEYS")
    assert keys is not None and keys.accepts("a") and keys.accepts("b") and not keys.accepts("c")
    assert ApiKeys.from_sources(None, None) is None
    monkeypatch.setenv("EMPTY_KEYS", " ")
    with pytest.raises(ValueError, match="no API keys"):
        ApiKeys.from_sources(None, "EMPTY_KEYS")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic c2VjcmV0"}]
)
async def test_missing_or_wrong_key_is_401_in_openai_shape(tok, headers):  # noqa: F811
    backend = ScriptedBackend(tok)
    app = create_app(backend, tok, SERVED, api_keys=ApiKeys(["secret-1"]))
    async with client_for(app) as c:
        for path in ("/v1/completions", "/v1/chat/completions"):
            r = await c.post(path, json=BODY, headers=headers)
            assert r.status_code == 401
            assert r.headers["www-authenticate"] == "Bearer"
            err = r.json()["error"]
            assert (
                err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error" and err["message"]
            )
        assert (await c.get("/v1/models", headers=headers)).status_code == 401
    assert backend.calls == []  # nothing reached the workers


@pytest.mark.asyncio
async def test_valid_key_passes_and_probes_and_metrics_stay_open(tok):  # noqa: F811
    app = create_app(ScriptedBackend(tok), tok, SERVED, api_keys=ApiKeys(["secret-1", "secret-2"]))
    async with client_for(app) as c:
        r = await c.post("/v1/completions", json=BODY, headers={"Authorization": "Bearer secret-2"})
        assert r.status_code == 200, r.text
        for path in ("/livez", "/readyz", "/health", "/metrics"):
            assert (await c.get(path)).status_code == 200, path


@pytest.mark.asyncio
async def test_protect_metrics_switch(tok):  # noqa: F811
    app = create_app(ScriptedBackend(tok), tok, SERVED, api_keys=ApiKeys(["k"]), protect_metrics=True)
    async with client_for(app) as c:
        assert (await c.get("/metrics")).status_code == 401
        assert (await c.get("/metrics", headers={"Authorization": "Bearer k"})).status_code == 200
        assert (await c.get("/readyz")).status_code == 200


@pytest.mark.asyncio
async def test_rotated_keys_file_takes_effect(tok, tmp_path):  # noqa: F811
    path = tmp_path / "api-keys"
    path.write_text("old-key\n")
    app = create_app(ScriptedBackend(tok), tok, SERVED, api_keys=ApiKeys(file=path))
    async with client_for(app) as c:
        assert (await c.get("/v1/models", headers={"Authorization": "Bearer old-key"})).status_code == 200
        path.write_text("new-key\n")
        os.utime(path, ns=(1, 1))  # a new mtime even on a coarse clock
        assert (await c.get("/v1/models", headers={"Authorization": "Bearer old-key"})).status_code == 401
        assert (await c.get("/v1/models", headers={"Authorization": "Bearer new-key"})).status_code == 200


def test_openai_client_sees_an_authentication_error(tok):  # noqa: F811
    openai = pytest.importorskip("openai")
    app = create_app(ScriptedBackend(tok), tok, SERVED, api_keys=ApiKeys(["right"]))
    transport = httpx.ASGITransport(app=app)

    async def run(key: str):
        client = openai.AsyncOpenAI(
            base_url="http://router/v1",
            api_key=key,
            max_retries=0,
            http_client=httpx.AsyncClient(transport=transport),
        )
        return await client.completions.create(model=SERVED, prompt="hi", max_tokens=2)

    import asyncio

    with pytest.raises(openai.AuthenticationError):
        asyncio.run(run("wrong"))
    assert asyncio.run(run("right")).choices[0].text is not None

"""Property-based fuzzing of the router's HTTP API from its own OpenAPI document.

Bodies are drawn from each route's request schema, leaning on the edges of every range (bound - 1,
bound, bound + 1), with any field swapped for arbitrary JSON now and then, plus bodies that are not
JSON objects at all. Whatever comes in: no 5xx, no hang, every refusal a 4xx in the OpenAI error
shape, and the router healthy with nothing left in flight afterwards. Bounded to a few hundred requests.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.v1 import common_pb2
from tandem.worker.api.wire import params_from_proto, params_to_proto
from tandem.worker.router.app import create_app
from tandem.worker.router.limits import RequestLimits
from tests.unit.router_harness import CHAT, SERVED, ScriptedBackend, client_for, sse_events

REQUEST_TIMEOUT_S = 10.0
EXAMPLES = 100  # per route; each is one request through the real app

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


def _edges(schema: dict[str, Any]) -> list[float]:
    bounds = [schema.get(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")]
    return [b + d for b in bounds if b is not None for d in (-1, 0, 1)]


def from_schema(schema: dict[str, Any], doc: dict[str, Any], wild: bool = False) -> st.SearchStrategy[Any]:
    """Values for a JSON schema of the OpenAPI document: valid ones (small, so that requests get through),
    or with `wild` the edges of each range (bound - 1, bound, bound + 1), huge numbers and empty or
    overlong strings and lists."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return st.deferred(lambda: from_schema(doc["components"]["schemas"][name], doc, wild))
    if "anyOf" in schema:
        return st.one_of([from_schema(s, doc, wild) for s in schema["anyOf"]])
    kind = schema.get("type")
    lo = schema.get("minimum", schema.get("exclusiveMinimum"))
    hi = schema.get("maximum", schema.get("exclusiveMaximum"))
    if kind == "integer":
        if wild:
            return st.sampled_from([int(e) for e in _edges(schema)] + [2**64, -(2**63) - 1]) | st.integers()
        return st.integers(lo if lo is not None else 0, min(hi, (lo or 0) + 64) if hi is not None else 64)
    if kind == "number":
        if wild:
            return st.sampled_from(_edges(schema) + [1e308, -1e308, 5e-324]) | st.floats(allow_nan=False)
        return st.floats(
            lo, hi, allow_nan=False, allow_infinity=False, exclude_min="exclusiveMinimum" in schema
        )
    if kind == "string":
        longest = schema.get("maxLength")
        if wild:
            return st.sampled_from(["", "x" * (longest + 1)] if longest else [""]) | st.text()
        return st.text(min_size=schema.get("minLength", 0), max_size=min(longest or 40, 40))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        most = schema.get("maxItems")
        items = from_schema(schema.get("items", {}), doc, wild)
        if wild and most:
            return st.lists(items, min_size=most + 1, max_size=most + 1) | st.lists(items, max_size=3)
        return st.lists(items, max_size=3)
    if kind == "object":
        props = {k: field(k, v, doc) for k, v in schema.get("properties", {}).items()}
        required = {k: v for k, v in props.items() if k in schema.get("required", [])}
        optional = {k: v for k, v in props.items() if k not in required}
        return st.fixed_dictionaries(required, optional=optional)
    return JSON


def field(name: str, schema: dict[str, Any], doc: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A property's valid values, its default half the time; the served model; short chats."""
    if name == "model":
        return st.just(SERVED)
    if name == "messages":
        role = st.one_of(st.sampled_from(["system", "user", "assistant"]), st.text(max_size=8))
        message = st.fixed_dictionaries({"role": role}, optional={"content": st.text(max_size=30)})
        return st.lists(message, max_size=3)
    if "default" in schema:  # many fields are supported only at their default (n, echo, penalties)
        other = from_schema(schema, doc)
        return st.sampled_from([0, 0, 1]).flatmap(lambda i: other if i else st.just(schema["default"]))
    return from_schema(schema, doc)


def _body_strategy(doc: dict[str, Any], path: str) -> st.SearchStrategy[bytes]:
    """A valid body with at most one field pushed to an edge or swapped for any JSON, or no object at all."""
    schema = doc["components"]["schemas"][
        doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit(
            "/", 1
        )[-1]
    ]
    props = schema["properties"]
    required = {k: field(k, props[k], doc) for k in schema["required"]}
    optional = sorted(set(props) - set(required))
    objects = st.sets(st.sampled_from(optional), max_size=5).flatmap(
        lambda names: st.fixed_dictionaries(
            {**required, **{k: field(k, props[k], doc) for k in sorted(names)}}
        )
    )
    wild_field = st.sampled_from(sorted(props)).flatmap(
        lambda name: st.tuples(st.just(name), from_schema(props[name], doc, wild=True) | JSON)
    )
    pushed = st.tuples(objects, wild_field).map(lambda b: {**b[0], b[1][0]: b[1][1]})
    dropped = st.tuples(objects, st.sampled_from(sorted(props))).map(
        lambda b: {k: v for k, v in b[0].items() if k != b[1]}
    )
    encoded = st.one_of(objects, pushed, pushed, dropped).map(lambda b: json.dumps(b).encode())
    junk = JSON.map(lambda b: json.dumps(b).encode()) | st.binary(max_size=64)
    return st.one_of(encoded, encoded, encoded, junk)


def edge_values(schema: dict[str, Any], doc: dict[str, Any]) -> list[Any]:
    """Every boundary a schema names, one step either side, and values of the wrong type."""
    if "$ref" in schema:
        return edge_values(doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]], doc)
    if "anyOf" in schema:
        return [v for s in schema["anyOf"] for v in edge_values(s, doc)]
    kind = schema.get("type")
    if kind == "integer":
        return [int(e) for e in _edges(schema)] + [0, -1, 2**32, 2**64, -(2**63) - 1]
    if kind == "number":
        return _edges(schema) + [0.0, -1.0, 1e308, -1e308, 5e-324]
    if kind == "string":
        longest = schema.get("maxLength")
        return ["", "\x00", "x" * (longest + 1 if longest else 100_000)]
    if kind == "array":
        items = edge_values(schema.get("items", {}), doc)
        most = schema.get("maxItems", 300)
        return [[], [v for v in items[:1]] * (most + 1)] + [[v] for v in items]
    if kind == "object":
        return [{}, {"x": 1}]
    return [None, "x", 1, [], {}, True]


def check_response(status: int, headers: Any, text: str, body: bytes) -> None:
    assert status < 500, (status, text, body[:300])
    if status >= 400:
        error = json.loads(text)["error"]
        assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
        assert error["type"] in ("invalid_request_error", "rate_limit_error")
        return
    assert status == 200, (status, text)
    if headers["content-type"].startswith("text/event-stream"):
        assert sse_events(text)[-1] == "[DONE]"
    else:
        assert json.loads(text)["choices"]


class WireBackend(ScriptedBackend):
    """The scripted answer, after the sampling parameters went through the protobuf messages the real
    backend sends the workers (and the workers' parsing of them), so a value the wire cannot carry fails."""

    async def generate(self, request_id, prompt_ids, params, timing):
        params_from_proto(params_to_proto(params))
        common_pb2.GenerateRequest(request_id=request_id, prompt_token_ids=prompt_ids)
        async for token in super().generate(request_id, prompt_ids, params, timing):
            yield token


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_fuzzed_bodies_never_get_a_5xx_and_leave_the_router_healthy(tok, path):
    backend = WireBackend(tok, "short answer")
    app = create_app(backend, tok, SERVED, max_model_len=64, limits=RequestLimits(max_body_bytes=16_384))
    doc = app.openapi()
    loop = asyncio.new_event_loop()
    client = client_for(app)

    async def send(body: bytes):
        headers = {"content-type": "application/json"}
        return await asyncio.wait_for(client.post(path, content=body, headers=headers), REQUEST_TIMEOUT_S)

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(body=_body_strategy(doc, path))
    def fuzz(body: bytes) -> None:
        r = loop.run_until_complete(send(body))
        check_response(r.status_code, r.headers, r.text, body)

    try:
        fuzz()
        health = loop.run_until_complete(client.get("/health"))
        assert health.status_code == 200 and health.json()["in_flight"] == 0
        assert app.state.admission.in_flight == 0 and backend.in_flight == 0
        statuses = loop.run_until_complete(client.get("/metrics")).text
        assert 'status="200"' in statuses and 'status="5' not in statuses  # some got through, none failed
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_every_edge_of_every_field_in_the_document(tok, path):
    """A sweep beside the random search: each property of the request schema set, alone, to each of its
    edge values (and wrong types) on top of a minimal valid body."""
    backend = WireBackend(tok, "short answer")
    app = create_app(backend, tok, SERVED, max_model_len=64)
    doc = app.openapi()
    name = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][name.rsplit("/", 1)[-1]]
    base = (
        {"model": SERVED, "prompt": "hello"}
        if "prompt" in schema["properties"]
        else {"model": SERVED, "messages": CHAT}
    )
    sent = 0
    async with client_for(app) as c:
        assert (await c.post(path, json=base)).status_code == 200
        for prop, prop_schema in sorted(schema["properties"].items()):
            for value in edge_values(prop_schema, doc) + [None, "x", [], {}, True]:
                body = json.dumps({**base, prop: value}).encode()
                r = await asyncio.wait_for(
                    c.post(path, content=body, headers={"content-type": "application/json"}),
                    REQUEST_TIMEOUT_S,
                )
                check_response(r.status_code, r.headers, r.text, body)
                sent += 1
        assert (await c.get("/health")).status_code == 200
    assert sent > 200 and app.state.admission.in_flight == 0 and backend.in_flight == 0


def test_the_openapi_document_describes_both_request_bodies(tok):
    doc = create_app(ScriptedBackend(tok), tok, SERVED).openapi()
    schemas = doc["components"]["schemas"]
    for path, name in (
        ("/v1/completions", "CompletionRequest"),
        ("/v1/chat/completions", "ChatCompletionRequest"),
    ):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{name}"}
    assert schemas["CompletionRequest"]["properties"]["top_k"]["anyOf"][0]["minimum"] == -1
    assert set(schemas["ChatCompletionRequest"]["required"]) == {"model", "messages"}

"""The router's HTTP routes: OpenAI completions and chat (JSON or SSE), models, health and metrics; what a
request may ask is `admission`, how failures answer is `errors`, how an answer reaches the client is
`answers`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tandem import names
from tandem.slo import Slo
from tandem.worker.hf.tokenizer import Tokenizer
from tandem.worker.router import choices
from tandem.worker.router import openai_schema as oa
from tandem.worker.router.admission import (
    Admission,
    chat_prompt_ids,
    check_model,
    check_prompt_fits,
    completion_prompt_ids,
    max_token_bytes,
    resolve_max_tokens,
)
from tandem.worker.router.answers import (
    ClientGone,
    ClosingStreamingResponse,
    StreamEnd,
    sse_stream,
    timing_headers,
    until_disconnect,
)
from tandem.worker.router.auth import ApiKeys, RequireApiKey
from tandem.worker.router.backend import Backend
from tandem.worker.router.choices import Generations
from tandem.worker.router.errors import add_error_handlers, error_of, error_response, parse_request
from tandem.worker.router.limits import BodyGone, RequestLimits, read_body
from tandem.worker.router.metrics import STATUS_CLIENT_GONE, Connections, RouterMetrics
from tandem.worker.router.openapi import document_request_bodies
from tandem.worker.router.warm import warm_request_path

log = logging.getLogger(__name__)

Req = TypeVar("Req", bound=oa.SamplingRequest)
DEFAULT_CHAT_MAX_TOKENS = 1024  # when neither the request nor the model's context length bounds it
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass
class Serving:
    """One completion request, end to end: read and check it, admit it, tokenise it off the event loop, then
    answer it whole or as a stream (which then owns the cleanup); every failure answers through `errors`."""

    backend: Backend
    tokenizer: Tokenizer
    served_name: str
    max_model_len: int | None
    limits: RequestLimits
    admission: Admission
    metrics: RouterMetrics
    token_bytes: int

    async def serve(
        self,
        request: Request,
        model: type[Req],
        id_kind: Literal["cmpl", "chatcmpl"],
        prompt_ids_of: Callable[[Req, Tokenizer], list[int]],
        default_max_tokens: int,
        answer: Callable[[Generations, Req, str], Awaitable[dict[str, Any]]],
        chunks: Callable[[Generations, Req, str], AsyncIterator[dict]],
    ) -> Response:
        clock = self.metrics.start_request()
        admitted, handed_off, gen = False, False, None
        try:
            req = parse_request(model, await read_body(request, self.limits))
            check_model(req, self.served_name)
            req.check_supported()
            req.check_token_ids(self.tokenizer.vocab_size)
            check_prompt_fits(
                req, self.token_bytes, self.max_model_len
            )  # by its bytes: no tokeniser run for a hopeless one
            # before the costly part: a full router refuses without templating or tokenising
            self.admission.acquire()
            admitted = True
            # templates and tokenizers take time on long prompts: off the event loop, other requests go on
            prompt_ids = await anyio.to_thread.run_sync(prompt_ids_of, req, self.tokenizer)
            max_tokens = resolve_max_tokens(
                req.requested_max_tokens(), default_max_tokens, len(prompt_ids), self.max_model_len
            )
            params = await anyio.to_thread.run_sync(
                req.sampling_params, max_tokens
            )  # a grammar compiles here
            clock.on_prompt(len(prompt_ids))
            rid = oa.new_id(id_kind)  # the workers know a request by the router's id, never a client's
            gen = Generations(self.backend, self.tokenizer, rid, prompt_ids, params, clock, req.n)
            rid = req.response_id(rid)
            if not req.stream:
                body = await until_disconnect(request, answer(gen, req, rid))
                clock.finish("200")
                return JSONResponse(body, headers=timing_headers(gen.timing))
            await until_disconnect(request, gen.start())  # errors before the first token keep their status
            end = StreamEnd(gen, clock, self.admission)
            response = ClosingStreamingResponse(
                sse_stream(chunks(gen, req, rid), end),
                on_close=end,
                media_type="text/event-stream",
                headers=timing_headers(gen.timing),
            )
            handed_off = True  # from here on the response owns the cleanup
            return response
        except (ClientGone, BodyGone):
            clock.finish(STATUS_CLIENT_GONE)
            return Response(status_code=int(STATUS_CLIENT_GONE))
        except Exception as exc:
            err = error_of(exc)
            if err.status >= 500:
                log.warning("request failed: %s", err.message, exc_info=err.status == 500)
            clock.finish(str(err.status))
            return error_response(err)
        finally:
            if not handed_off:
                clock.finish(STATUS_CLIENT_GONE)  # no-op unless cancelled before an outcome was recorded
                if gen is not None:
                    await gen.close()
                if admitted:
                    self.admission.release()


def create_app(
    backend: Backend,
    tokenizer: Tokenizer,
    served_name: str,
    service_name: str = "default",
    max_queued_requests: int = 256,
    *,
    max_model_len: int | None = None,
    limits: RequestLimits | None = None,
    slo: Slo | None = None,
    api_keys: ApiKeys | None = None,
    protect_metrics: bool = False,
    public_metrics: bool = True,
    docs: bool = False,
) -> FastAPI:
    """The router's ASGI app. `max_model_len` (the context the workers serve) turns overlong prompts
    into 400s here; `limits` bound what a request body may cost before it is parsed; `slo` is what
    each completed request is judged against. `/metrics` is served here only with `public_metrics` (else on
    the metrics port alone), `/docs` and `/openapi.json` only with `docs`."""
    metrics = RouterMetrics(
        service_name,
        backend.queue_depth,
        slo=slo,
        routable_workers=backend.routable_workers,
        discovery_stale=getattr(backend, "discovery_stale", None),
        connections=backend if isinstance(backend, Connections) else None,
        model_name=served_name,
        wake_queue=getattr(backend, "wake_queue", None),
    )
    admission = Admission(max_queued_requests)
    token_bytes = max_token_bytes(tokenizer.backend.get_vocab(with_added_tokens=True))
    app = FastAPI(
        title="tandem router",
        lifespan=backend_lifespan(backend, tokenizer),
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    app.state.metrics, app.state.admission, app.state.backend = metrics, admission, backend
    if api_keys is not None:  # probes stay open; /metrics too unless protect_metrics
        app.add_middleware(RequireApiKey, keys=api_keys, protect_metrics=protect_metrics)
    add_error_handlers(app)
    serving = Serving(
        backend,
        tokenizer,
        served_name,
        max_model_len,
        limits or RequestLimits(),
        admission,
        metrics,
        token_bytes,
    )
    add_completion_routes(app, serving)
    add_model_routes(app, served_name, max_model_len)
    add_probe_routes(app, backend, admission)
    if public_metrics:
        add_metrics_route(app, metrics)
    return app


def backend_lifespan(
    backend: Backend, tokenizer: Tokenizer
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the request path is warmed up and the backend started before the first request;
    the backend closes after the last."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await warm_request_path(tokenizer)
        await backend.start()
        try:
            yield
        finally:
            await backend.close()

    return lifespan


def add_completion_routes(app: FastAPI, serving: Serving) -> None:
    """OpenAI's completions and chat completions, answered whole or streamed, and their bodies in the docs."""
    serve, served_name = serving.serve, serving.served_name

    async def answer_completion(gen: Generations, req: oa.CompletionRequest, rid: str) -> dict[str, Any]:
        return choices.answer_completion(await choices.collect(gen), gen, req, rid, served_name)

    async def answer_chat(gen: Generations, req: oa.ChatCompletionRequest, rid: str) -> dict[str, Any]:
        return choices.answer_chat(await choices.collect(gen), gen, req, rid, served_name)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve(
            request,
            oa.CompletionRequest,
            "cmpl",
            completion_prompt_ids,
            DEFAULT_COMPLETION_MAX_TOKENS,
            answer_completion,
            lambda gen, req, rid: choices.completion_chunks(gen, req, rid, oa.now_s(), served_name),
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve(
            request,
            oa.ChatCompletionRequest,
            "chatcmpl",
            chat_prompt_ids,
            DEFAULT_CHAT_MAX_TOKENS,
            answer_chat,
            lambda gen, req, rid: choices.chat_chunks(gen, req, rid, oa.now_s(), served_name),
        )

    document_request_bodies(
        app, {"/v1/completions": oa.CompletionRequest, "/v1/chat/completions": oa.ChatCompletionRequest}
    )


def add_model_routes(app: FastAPI, served_name: str, max_model_len: int | None) -> None:
    """The one model this router serves, as OpenAI's model list."""

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": served_name, "object": "model", "created": oa.now_s(), "owned_by": "tandem"}
        if max_model_len is not None:
            card["max_model_len"] = max_model_len
        return {"object": "list", "data": [card]}


def add_probe_routes(app: FastAPI, backend: Backend, admission: Admission) -> None:
    """Liveness (the event loop answers) and readiness (a worker to route to), for Kubernetes' probes."""

    @app.get(names.LIVENESS_PATH)
    async def livez() -> dict[str, str]:  # answered by the event loop: no worker needed to be alive
        return {"status": "alive"}

    @app.get(names.READINESS_PATH)
    @app.get("/health")  # the same readiness answer, for clients of the older path
    async def readyz() -> JSONResponse:
        ready = backend.ready()
        body = {"status": "ok" if ready else "unavailable", "in_flight": admission.in_flight}
        return JSONResponse(body, status_code=200 if ready else 503)


def add_metrics_route(app: FastAPI, metrics: RouterMetrics) -> None:
    """`/metrics` on the app's own port, in Prometheus' text format."""

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        payload, content_type = metrics.exposition()
        return Response(payload, media_type=content_type)

"""The router's HTTP routes: OpenAI completions and chat (JSON or SSE), models, health and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from tandem import names
from tandem.slo import Slo
from tandem.worker.api.params import InvalidRequest
from tandem.worker.hf.tokenizer import ChatTemplateError, Tokenizer
from tandem.worker.router import choices
from tandem.worker.router import openai_schema as oa
from tandem.worker.router.admission import Admission, check_prompt_fits, max_token_bytes
from tandem.worker.router.auth import ApiKeys, RequireApiKey
from tandem.worker.router.backend import Backend, BackendError, Timing
from tandem.worker.router.choices import Generations
from tandem.worker.router.limits import BodyGone, RequestLimits, read_body
from tandem.worker.router.metrics import STATUS_CLIENT_GONE, RequestClock, RouterMetrics
from tandem.worker.router.openapi import document_request_bodies
from tandem.worker.router.streaming import SSE_DONE, sse_event

log = logging.getLogger(__name__)

T = TypeVar("T")
Req = TypeVar("Req", bound=oa.SamplingRequest)
DEFAULT_CHAT_MAX_TOKENS = 1024  # when neither the request nor the model's context length bounds it
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


class ClosingStreamingResponse(StreamingResponse):
    """A streaming response that, however the stream ends (even before it starts), closes its body
    iterator and runs `on_close`."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], Awaitable[None]], **kwargs: Any):
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self.on_close()


class StreamEnd:
    """Releases what a streamed answer holds (backend stream, admission slot) and records its outcome, once."""

    def __init__(self, gen: Generations, clock: RequestClock, admission: Admission) -> None:
        self.gen, self.clock, self.admission = gen, clock, admission
        self.done = False

    async def __call__(self, status: str = STATUS_CLIENT_GONE) -> None:
        if self.done:
            return
        self.done = True
        await self.gen.close()
        self.admission.release()
        self.clock.finish(status)


def error_of(exc: BaseException) -> oa.ApiError:
    """The HTTP error a failure maps to."""
    if isinstance(exc, oa.ApiError):
        return exc
    if isinstance(exc, InvalidRequest | ChatTemplateError):
        return oa.ApiError(400, str(exc))
    if isinstance(exc, BackendError):
        return oa.ApiError(exc.status, str(exc), retry_after_s=exc.retry_after_s)
    return oa.ApiError(500, f"internal error: {type(exc).__name__}")


def timing_headers(timing: Timing) -> dict[str, str]:
    """Which workers served the request and how many retries it took, for clients and tests to see."""
    headers = {
        "X-Tandem-Prefill-Worker": timing.prefill_worker,
        "X-Tandem-Decode-Worker": timing.decode_worker,
        "X-Tandem-Retries": str(timing.retries) if timing.retries else "",
        names.PREFILL_ROUTE_HEADER: timing.prefill,
    }
    return {k: v for k, v in headers.items() if v}


BUSY_RETRY_AFTER_S = 1  # a 429 or 503 that names no delay of its own


def error_response(err: oa.ApiError) -> JSONResponse:
    retry_after = err.retry_after_s
    if retry_after is None and err.status in (429, 503):  # every "not now" answer says when to come back
        retry_after = BUSY_RETRY_AFTER_S
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(
        oa.error_body(err.status, err.message, err.param, err.code), err.status, headers=headers
    )


def parse_request(model: type[Req], body: bytes) -> Req:
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        message, param = oa.describe_validation_error(e)
        raise oa.ApiError(400, message, param=param) from None


def resolve_max_tokens(
    requested: int | None, default: int, prompt_len: int, max_model_len: int | None
) -> int:
    """The output budget: the request's, else the default, bounded by the context left after the prompt."""
    if max_model_len is not None and prompt_len >= max_model_len:
        raise oa.ApiError(
            400,
            f"prompt is too long: {prompt_len} tokens, the model's context is {max_model_len}",
            param="prompt",
        )
    room = None if max_model_len is None else max_model_len - prompt_len
    if requested is None:
        return default if room is None else min(default, room)
    if room is not None and requested > room:
        raise oa.ApiError(
            400,
            f"prompt ({prompt_len} tokens) plus max_tokens ({requested}) exceeds the model's context of "
            f"{max_model_len} tokens",
            param="max_tokens",
        )
    return requested


def completion_prompt_ids(req: oa.CompletionRequest, tokenizer: Tokenizer) -> list[int]:
    prompt = req.single_prompt()
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    else:
        bad = [i for i in prompt if not 0 <= i < tokenizer.vocab_size]
        if bad:
            raise oa.ApiError(400, f"prompt has token ids outside the vocabulary: {bad[:5]}", param="prompt")
        ids = list(prompt)
    if not ids:
        raise oa.ApiError(400, "prompt is empty", param="prompt")
    return ids


def chat_prompt_ids(req: oa.ChatCompletionRequest, tokenizer: Tokenizer) -> list[int]:
    messages = [m.for_template() for m in req.messages]
    return tokenizer.encode_chat(messages, add_generation_prompt=True, tools=req.tool_dicts())


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, unless the client disconnects first (then cancel it and raise ClientGone)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    if task.cancelled():
        raise ClientGone()
    return task.result()


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
) -> FastAPI:
    """The router's ASGI app. `max_model_len` (the context the workers serve) turns overlong prompts
    into 400s here; `limits` bound what a request body may cost before it is parsed; `slo` is what
    each completed request is judged against."""
    metrics = RouterMetrics(
        service_name, backend.queue_depth, slo=slo, routable_workers=backend.routable_workers,
        discovery_stale=getattr(backend, "discovery_stale", None), model_name=served_name,
    )  # fmt: skip
    admission = Admission(max_queued_requests)
    limits = limits or RequestLimits()
    token_bytes = max_token_bytes(tokenizer.backend.get_vocab(with_added_tokens=True))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        try:
            yield
        finally:
            await backend.close()

    app = FastAPI(title="tandem router", lifespan=lifespan)
    app.state.metrics, app.state.admission, app.state.backend = metrics, admission, backend
    if api_keys is not None:  # probes stay open; /metrics too unless protect_metrics
        app.add_middleware(RequireApiKey, keys=api_keys, protect_metrics=protect_metrics)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Unknown paths (404) and wrong methods (405) answer in the OpenAI error shape too."""
        response = error_response(oa.ApiError(exc.status_code, str(exc.detail)))
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(Exception)
    async def unexpected_error(_: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=exc)
        return error_response(oa.ApiError(500, f"internal error: {type(exc).__name__}"))

    def check_model(req: oa.SamplingRequest) -> None:
        if req.model != served_name:
            raise oa.ApiError(
                404, f"model {req.model!r} does not exist; this router serves {served_name!r}",
                param="model", code="model_not_found",
            )  # fmt: skip

    async def serve(
        request: Request,
        model: type[Req],
        id_kind: Literal["cmpl", "chatcmpl"],
        prompt_ids_of: Callable[[Req, Tokenizer], list[int]],
        default_max_tokens: int,
        answer: Callable[[Generations, Req, str], Awaitable[dict[str, Any]]],
        chunks: Callable[[Generations, Req, str], AsyncIterator[dict]],
    ) -> Response:
        clock = metrics.start_request()
        admitted, handed_off, gen = False, False, None
        try:
            req = parse_request(model, await read_body(request, limits))
            check_model(req)
            req.check_supported()
            req.check_token_ids(tokenizer.vocab_size)
            check_prompt_fits(req, token_bytes, max_model_len)  # by its bytes: no tokeniser run for a hopeless one
            admission.acquire()  # before the costly part: a full router refuses without templating or tokenising
            admitted = True
            # templates and tokenizers take time on long prompts: off the event loop, other requests go on
            prompt_ids = await anyio.to_thread.run_sync(prompt_ids_of, req, tokenizer)
            max_tokens = resolve_max_tokens(
                req.requested_max_tokens(), default_max_tokens, len(prompt_ids), max_model_len
            )
            params = await anyio.to_thread.run_sync(req.sampling_params, max_tokens)  # a grammar compiles here
            clock.on_prompt(len(prompt_ids))
            rid = oa.new_id(id_kind)
            gen = Generations(backend, tokenizer, rid, prompt_ids, params, clock, req.n)
            if not req.stream:
                body = await until_disconnect(request, answer(gen, req, rid))
                clock.finish("200")
                return JSONResponse(body, headers=timing_headers(gen.timing))
            await until_disconnect(request, gen.start())  # errors before the first token keep their status
            end = StreamEnd(gen, clock, admission)
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
                    admission.release()

    async def answer_completion(gen: Generations, req: oa.CompletionRequest, rid: str) -> dict[str, Any]:
        return choices.answer_completion(await choices.collect(gen), gen, req, rid, served_name)

    async def answer_chat(gen: Generations, req: oa.ChatCompletionRequest, rid: str) -> dict[str, Any]:
        return choices.answer_chat(await choices.collect(gen), gen, req, rid, served_name)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve(
            request, oa.CompletionRequest, "cmpl", completion_prompt_ids, DEFAULT_COMPLETION_MAX_TOKENS,
            answer_completion, lambda gen, req, rid: choices.completion_chunks(gen, req, rid, oa.now_s(), served_name),
        )  # fmt: skip

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve(
            request, oa.ChatCompletionRequest, "chatcmpl", chat_prompt_ids, DEFAULT_CHAT_MAX_TOKENS, answer_chat,
            lambda gen, req, rid: choices.chat_chunks(gen, req, rid, oa.now_s(), served_name),
        )  # fmt: skip

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": served_name, "object": "model", "created": oa.now_s(), "owned_by": "tandem"}
        if max_model_len is not None:
            card["max_model_len"] = max_model_len
        return {"object": "list", "data": [card]}

    @app.get(names.LIVENESS_PATH)
    async def livez() -> dict[str, str]:  # answered by the event loop: no worker needed to be alive
        return {"status": "alive"}

    @app.get(names.READINESS_PATH)
    @app.get("/health")  # the same readiness answer, for clients of the older path
    async def readyz() -> JSONResponse:
        ready = backend.ready()
        body = {"status": "ok" if ready else "unavailable", "in_flight": admission.in_flight}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        payload, content_type = metrics.exposition()
        return Response(payload, media_type=content_type)

    document_request_bodies(
        app, {"/v1/completions": oa.CompletionRequest, "/v1/chat/completions": oa.ChatCompletionRequest}
    )
    return app


async def sse_stream(chunks: AsyncIterator[dict], end: StreamEnd) -> AsyncIterator[str]:
    """The SSE body of a streaming answer; a failure mid-stream becomes an error event, then [DONE]."""
    status = STATUS_CLIENT_GONE  # unless the stream gets to its end
    try:
        try:
            async for chunk in chunks:
                yield sse_event(chunk)
            status = "200"
        except Exception as exc:
            err = error_of(exc)
            status = str(err.status)
            log.warning("stream failed after it started: %s", err.message, exc_info=err.status == 500)
            yield sse_event(oa.error_body(err.status, err.message, err.param, err.code))
        yield SSE_DONE
    finally:
        with anyio.CancelScope(shield=True):
            await end(status)

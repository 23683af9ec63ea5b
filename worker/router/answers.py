"""How a request's answer reaches the client: the SSE stream, which owns the request's cleanup (backend
streams, admission slot, outcome) however it ends, the headers naming who served it, and waiting on work
unless the client leaves first. What the chunks and bodies hold is `choices`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tandem import names
from tandem.worker.router import openai_schema as oa
from tandem.worker.router.admission import Admission
from tandem.worker.router.backend import COLD_START_S, Timing
from tandem.worker.router.choices import Generations
from tandem.worker.router.errors import error_of
from tandem.worker.router.metrics import STATUS_CLIENT_GONE, RequestClock
from tandem.worker.router.streaming import SSE_DONE, sse_event

log = logging.getLogger(__name__)
T = TypeVar("T")


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
    """Releases what a streamed answer holds (backend stream, admission slot) and records its outcome,
    once."""

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


def timing_headers(timing: Timing) -> dict[str, str]:
    """How many retries the request took and where its prompt ran; never which workers (their addresses
    are the cluster's, not the client's to know)."""
    cold_start_s = timing.extra.get(COLD_START_S)
    headers = {
        "X-Tandem-Retries": str(timing.retries) if timing.retries else "",
        names.PREFILL_ROUTE_HEADER: timing.prefill,
        names.COLD_START_HEADER: f"{cold_start_s * 1000:.0f}" if cold_start_s else "",
    }
    return {k: v for k, v in headers.items() if v}


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

"""What one request may cost the router before it is refused: body size, time to send the body."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.requests import ClientDisconnect, Request

from tandem.options import BODY_TIMEOUT_S as DEFAULT_BODY_TIMEOUT_S
from tandem.options import MAX_BODY_BYTES as DEFAULT_MAX_BODY_BYTES
from tandem.worker.router.openai_schema import ApiError


@dataclass(frozen=True)
class RequestLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S


class BodyGone(Exception):
    """The client disconnected while sending its request body."""


def too_large(size: int, limits: RequestLimits) -> ApiError:
    return ApiError(
        413,
        f"request body of {size} bytes or more exceeds the limit of {limits.max_body_bytes} bytes",
        code="request_too_large",
    )


async def read_body(request: Request, limits: RequestLimits) -> bytes:
    """The request body, refused (413) as soon as it is known to pass the size limit, before any parsing,
    and timed out (408) when the client sends it too slowly."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ApiError(400, f"invalid Content-Length header: {declared[:32]!r}") from None
        if size > limits.max_body_bytes:
            raise too_large(size, limits)
    chunks: list[bytes] = []
    received = 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            async for chunk in request.stream():
                received += len(chunk)
                if received > limits.max_body_bytes:
                    raise too_large(received, limits)
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(
            408, f"request body not received within {limits.body_timeout_s:g} s", code="request_timeout"
        ) from None
    except ClientDisconnect:
        raise BodyGone() from None
    return b"".join(chunks)

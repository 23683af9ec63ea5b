"""The router's HTTP server: uvicorn over h11 with a connection cap, a deadline for a request's headers, an
idle keep-alive timeout and a bound on the header block, so that slow or idle clients cannot hold the router.

Past the cap, a new connection's request is answered 503 with Retry-After and the connection closed (uvicorn's
own `limit_concurrency` answers without Retry-After). A connection whose request headers are not complete
within the deadline (a slow sender, or one that never sends) is closed.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from tandem.options import HEADER_TIMEOUT_S as DEFAULT_HEADER_TIMEOUT_S
from tandem.options import KEEP_ALIVE_S as DEFAULT_KEEP_ALIVE_S
from tandem.options import MAX_CONNECTIONS as DEFAULT_MAX_CONNECTIONS

MAX_HEADER_BYTES = 64 * 1024
OVER_CAPACITY_RETRY_AFTER_S = 1


@dataclass(frozen=True)
class ServerLimits:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    max_header_bytes: int = MAX_HEADER_BYTES


def over_capacity(open_connections: int, max_connections: int) -> bool:
    """A new connection (already counted in `open_connections`) is past the cap (pure)."""
    return open_connections > max_connections


async def _refuse(scope: Any, receive: Any, send: Any) -> None:
    """503 with Retry-After, in the OpenAI error shape, and the connection closed."""
    body = json.dumps(
        {
            "error": {
                "message": "the router is at its connection limit; retry later",
                "type": "server_error",
                "param": None,
                "code": "too_many_connections",
            }
        }
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(OVER_CAPACITY_RETRY_AFTER_S).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def bounded_protocol(limits: ServerLimits) -> type:
    """An h11 protocol class enforcing `limits` on every connection."""
    from uvicorn.protocols.http.h11_impl import H11Protocol  # uvicorn only once the server starts

    class BoundedH11Protocol(H11Protocol):
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if over_capacity(len(self.connections), limits.max_connections):
                self.app = _refuse  # this connection's requests are refused; the others go on
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # a request's headers are in: the body has its own timeout

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers, on a kept-alive connection

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_deadline = self.loop.call_later(limits.header_timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_too_slow(self) -> None:
            self._header_deadline = None
            if self.cycle is None or self.cycle.response_complete:
                self.transport.close()

    return BoundedH11Protocol


def uvicorn_config(app: Any, host: str, port: int, limits: ServerLimits, log_level: str = "info") -> Any:
    """A uvicorn Config serving `app` under `limits`."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        http=bounded_protocol(limits),  # type: ignore[arg-type]
        timeout_keep_alive=max(1, round(limits.keep_alive_s)),
        h11_max_incomplete_event_size=limits.max_header_bytes,
    )

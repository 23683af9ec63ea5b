"""Optional API keys for the router: `Authorization: Bearer <key>`, keys from a file or an environment
variable, a 401 in the OpenAI error shape otherwise. Probes (and /metrics unless asked) stay open."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tandem import names
from tandem.worker.router.openai_schema import error_body

log = logging.getLogger(__name__)

PROBE_PATHS = frozenset({names.LIVENESS_PATH, names.READINESS_PATH, "/health"})
METRICS_PATH = "/metrics"


def parse_keys(text: str) -> frozenset[str]:
    """Keys one per line or comma-separated; blank lines and `#` comments ignored (pure)."""
    keys: set[str] = set()
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        keys.update(k.strip() for k in line.split(",") if k.strip())
    return frozenset(keys)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None (pure)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class ApiKeys:
    """The keys a request may present. A file is re-read when it changes (a rotated Kubernetes Secret)."""

    def __init__(self, keys: Iterable[str] = (), file: str | Path | None = None):
        self._static = frozenset(keys)
        self._file = Path(file) if file else None
        self._stamp: tuple[int, int] | None = None
        self._digests: frozenset[bytes] = frozenset()
        self._reload()
        if not self._digests:
            raise ValueError("API keys are enabled but none were given")

    @classmethod
    def from_sources(cls, file: str | None, env: str | None) -> ApiKeys | None:
        """Keys from `file` and from the environment variable named `env`; None when neither is set."""
        if not file and not env:
            return None
        keys = parse_keys(os.environ.get(env, "")) if env else frozenset()
        if env and not keys:
            raise ValueError(f"environment variable {env} holds no API keys")
        return cls(keys, file)

    def _reload(self) -> None:
        keys = set(self._static)
        if self._file is not None:
            st = self._file.stat()
            self._stamp = (st.st_mtime_ns, st.st_size)
            keys |= parse_keys(self._file.read_text())
        self._digests = frozenset(_digest(k) for k in keys)

    def _refresh(self) -> None:
        if self._file is None:
            return
        try:
            st = self._file.stat()
            if (st.st_mtime_ns, st.st_size) != self._stamp:
                self._reload()
        except OSError as e:  # keep the keys we have rather than open the door
            log.warning("cannot re-read the API keys file: %s", e.strerror)

    def accepts(self, token: str | None) -> bool:
        """Whether `token` is one of the keys, compared in constant time."""
        if token is None:
            return False
        self._refresh()
        d = _digest(token)
        return any(hmac.compare_digest(d, k) for k in self._digests)


class RequireApiKey:
    """ASGI middleware: every HTTP request but the open paths must carry a valid bearer key."""

    def __init__(self, app: Any, keys: ApiKeys, protect_metrics: bool = False):
        self.app, self.keys = app, keys
        self.open_paths = PROBE_PATHS if protect_metrics else PROBE_PATHS | {METRICS_PATH}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
        if self.keys.accepts(bearer_token(header)):
            await self.app(scope, receive, send)
            return
        message = "missing API key: send Authorization: Bearer <key>" if header is None else "invalid API key"
        body = json.dumps(error_body(401, message, code="invalid_api_key")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
            }
        )
        await send({"type": "http.response.body", "body": body})

"""The operator pod's /healthz for its liveness and readiness probes: up from the first second (a standby
waiting for the Lease is healthy), and failing once the leader's event loop stops beating."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STALE_SECONDS = 60.0


class Heartbeat:
    """The leader's event loop calls beat(); a standby never leads, so it is judged alive while it waits."""

    def __init__(self, stale_seconds: float = STALE_SECONDS):
        self.stale_seconds = stale_seconds
        self.leading = False
        self._last = time.monotonic()

    def beat(self) -> None:
        self._last = time.monotonic()

    def lead(self) -> None:
        self.leading = True
        self.beat()  # kopf's start-up counts from here

    def healthy(self) -> tuple[bool, str]:
        if not self.leading:
            return True, "standby: waiting for the lease"
        age = time.monotonic() - self._last
        if age > self.stale_seconds:
            return False, f"leader: event loop silent for {age:.0f}s"
        return True, "leader"


HEARTBEAT = Heartbeat()


def serve(port: int, host: str = "0.0.0.0", heartbeat: Heartbeat = HEARTBEAT) -> ThreadingHTTPServer:
    """Start /healthz in a daemon thread; returns the server (its port when `port` is 0)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            ok, words = heartbeat.healthy() if self.path == "/healthz" else (False, "not found")
            code = 200 if ok else (404 if words == "not found" else 503)
            body = (words + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: no access log
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="healthz").start()
    return server

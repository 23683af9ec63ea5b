"""A registry's /metrics over plain HTTP, always in Prometheus' classic text format (the router's /metrics
format): prometheus_client's OpenMetrics output, which a Prometheus server asks for, rewrites the colons of
vLLM's metric names (`vllm:...`) to underscores in the samples."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


def serve_metrics(port: int, host: str, registry: CollectorRegistry) -> ThreadingHTTPServer:
    """Serve `registry` on host:port from a daemon thread; returns the server (its port, its shutdown)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # scrapes every few seconds: no access log
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server

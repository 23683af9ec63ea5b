"""A local HTTP server that answers the Hugging Face Hub's download API for in-memory repositories, so the
real `huggingface_hub` client can be pointed at it (HF_ENDPOINT) where the Hub cannot be reached. It counts
what it serves, can throttle its bandwidth, and can die in the middle of a file."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


class FakeHub:
    """`repos`: repo id -> file name -> content, all at one commit (`COMMIT`; the revision `main` names it).

    `gets[file]` counts the GETs of a file's content, `served[file]` the bytes sent; `bandwidth` (bytes/s, the
    whole server) throttles content. `die_in(file, after)` makes the next GET of `file` send `after` bytes of
    it and then stop the server, the connection cut mid-body; `start()` serves again on the same port.
    """

    def __init__(self, repos: dict[str, dict[str, bytes]], bandwidth: float | None = None, port: int = 0):
        self.repos, self.bandwidth, self.port = repos, bandwidth, port
        self.gets: Counter[str] = Counter()
        self.api_calls: Counter[str] = Counter()
        self.served: Counter[str] = Counter()
        self._die: dict[str, int] = {}
        self._lock = threading.Lock()
        self._next_send = 0.0
        self._server: ThreadingHTTPServer | None = None
        self._dead = False  # after a death, connections still open get cut too

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def die_in(self, name: str, after: int) -> None:
        self._die[name] = after

    def start(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                hub._handle(self, head=False)

            def do_HEAD(self) -> None:
                hub._handle(self, head=True)

        self._dead = False
        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="fake-hub", daemon=True).start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- the API ----------------------------------------------------------------------------------------

    def _handle(self, req: BaseHTTPRequestHandler, head: bool) -> None:
        if self._dead:
            req.close_connection = True
            return
        path = unquote(urlsplit(req.path).path)
        if m := _INFO.match(path):
            self.api_calls[path] += 1
            files = self.repos.get(m["repo"])
            if files is None or m["rev"] not in ("main", COMMIT):
                return _send(
                    req, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, head
                )
            info = {
                "id": m["repo"],
                "modelId": m["repo"],
                "sha": COMMIT,
                "private": False,
                "siblings": [_sibling(name, data) for name, data in sorted(files.items())],
            }
            return _send(req, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
        if m := _TREE.match(path):  # what snapshot_download lists (the whole repository, in one page)
            self.api_calls[path] += 1
            files = self.repos.get(m["repo"])
            if files is None or m["rev"] not in ("main", COMMIT):
                return _send(
                    req, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, head
                )
            tree = [_tree_entry(name, data) for name, data in sorted(files.items())]
            return _send(req, 200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, head)
        if m := _RESOLVE.match(path):
            data = (self.repos.get(m["repo"]) or {}).get(m["file"])
            if data is None or m["rev"] not in ("main", COMMIT):
                return _send(req, 404, b"Entry not found", {"X-Error-Code": "EntryNotFound"}, head)
            headers = {
                "X-Repo-Commit": COMMIT,
                "ETag": f'"{_etag(data)}"',
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }
            if head:
                return _send(req, 200, data, headers, head=True)
            return self._content(req, m["file"], data, headers)
        _send(req, 404, b"not found", {}, head)

    def _content(self, req: BaseHTTPRequestHandler, name: str, data: bytes, headers: dict[str, str]) -> None:
        start, status = 0, 200
        if rng := re.match(r"bytes=(\d+)-$", req.headers.get("Range") or ""):
            start, status = int(rng[1]), 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        with self._lock:
            self.gets[name] += 1
            cut = self._die.pop(name, None)
        body = data[start:]
        req.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(body))}.items():
            req.send_header(k, v)
        req.end_headers()
        end = len(body) if cut is None else min(cut, len(body))
        for i in range(0, end, 1 << 16):
            chunk = body[i : min(i + (1 << 16), end)]
            self._throttle(len(chunk))
            req.wfile.write(chunk)
            self.served[name] += len(chunk)
        if cut is not None:  # the server dies mid-file: the client sees the connection cut short
            self._dead = True
            req.wfile.flush()
            req.close_connection = True
            threading.Thread(target=self.stop, daemon=True).start()

    def _throttle(self, n: int) -> None:
        if not self.bandwidth:
            return
        with self._lock:
            now = time.monotonic()
            at = max(now, self._next_send)
            self._next_send = at + n / self.bandwidth
        if at > now:
            time.sleep(at - now)


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sibling(name: str, data: bytes) -> dict[str, object]:
    out: dict[str, object] = {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
    if name.endswith((".safetensors", ".bin", ".pt", ".msgpack", ".h5")):
        out["lfs"] = {"size": len(data), "sha256": _etag(data), "pointerSize": 134}
    return out


def _tree_entry(name: str, data: bytes) -> dict[str, object]:
    out: dict[str, object] = {
        "type": "file",
        "path": name,
        "size": len(data),
        "oid": hashlib.sha1(data).hexdigest(),
    }
    if name.endswith((".safetensors", ".bin", ".pt", ".msgpack", ".h5")):
        out["lfs"] = {"size": len(data), "oid": _etag(data), "pointerSize": 134}
    return out


def _send(req: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
    req.send_response(status)
    for k, v in {**headers, "Content-Length": str(len(body))}.items():
        req.send_header(k, v)
    req.end_headers()
    if not head:
        req.wfile.write(body)

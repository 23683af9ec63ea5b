"""The operator's /healthz: healthy while a standby waits, then only while the leader's loop beats."""

import urllib.error
import urllib.request

from tandem.operator.runtime.health import Heartbeat, serve


def _get(port: int, path: str = "/healthz") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_standby_is_healthy_the_leader_only_while_its_loop_beats():
    beat = Heartbeat(stale_seconds=0.2)
    server = serve(0, "127.0.0.1", beat)
    port = server.server_address[1]
    try:
        assert _get(port) == (200, "standby: waiting for the lease\n")
        beat.lead()
        assert _get(port) == (200, "leader\n")
        beat._last -= 1.0  # the event loop stopped a second ago
        code, words = _get(port)
        assert code == 503 and "event loop silent" in words
        beat.beat()
        assert _get(port)[0] == 200
        assert _get(port, "/other")[0] == 404
    finally:
        server.shutdown()

"""`tandem up` with both pools at `minReplicas: 0`, run as users run it, over real sockets: the router holds
the first requests while the autoscaler starts the pools' first workers, answers them with their cold start in
X-Tandem-Cold-Start-Ms, refuses past its bound with 503 and Retry-After, forgets a client that left while
held, and the pools go back to zero once idle and wake again."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx
import pytest

from tandem import names
from tandem.testing.local_up import routable
from tests.integration.stacks import spec
from tests.integration.test_supervisor import start_tandem_up, wait_for

pytestmark = pytest.mark.slow

BODY = {"model": "tiny", "prompt": "hi", "max_tokens": 4}


def from_zero_spec(tiny_model_dir) -> dict:
    obj = spec("wake", tiny_model_dir, prefill=0, decode=0)
    for pool in ("prefill", "decode"):
        obj["spec"][pool].update(minReplicas=0, maxReplicas=1)
    obj["spec"]["router"] = {"wakeQueue": {"maxRequests": 3, "timeoutSeconds": 240}}
    obj["spec"]["autoscaling"] = {
        "enabled": True,
        "intervalSeconds": 1,
        "windowSeconds": 6,
        "stabilizationSeconds": 8,
        "scaleUpCooldownSeconds": 0,
        "scaleDownCooldownSeconds": 1,
    }
    return obj


def gauge(url: str, name: str, role: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(
        float(li.split()[-1])
        for li in text.splitlines()
        if li.startswith(name + "{") and f'role="{role}"' in li
    )


def queue_depth(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(
        float(li.split()[-1]) for li in text.splitlines() if li.startswith(names.ROUTER_QUEUE_DEPTH + "{")
    )


class Held(threading.Thread):
    """One completion sent from its own thread; the client gives up after `timeout_s`."""

    def __init__(self, url: str, timeout_s: float = 300):
        super().__init__(daemon=True)
        self.url, self.timeout_s = url, timeout_s
        self.response: httpx.Response | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            self.response = httpx.post(f"{self.url}/v1/completions", json=BODY, timeout=self.timeout_s)
        except httpx.HTTPError as e:
            self.error = e


@pytest.mark.timeout(900)
def test_a_stack_at_zero_holds_wakes_answers_and_returns_to_zero(tiny_model_dir, tmp_path: Path):
    up, url = start_tandem_up(tiny_model_dir, tmp_path, obj=from_zero_spec(tiny_model_dir))
    log_path = tmp_path / "tandem-up.log"
    try:
        assert routable(url, "prefill") == 0 and routable(url, "decode") == 0  # ready with no worker at all
        wait_for("the autoscaler to start", lambda: "autoscaling wake every 1s" in log_path.read_text(), 30)

        # two requests are held; a client that gives up while held leaves nothing behind
        held = [Held(url) for _ in range(2)]
        for h in held:
            h.start()
        wait_for("two held requests", lambda: gauge(url, names.ROUTER_HELD_REQUESTS, "decode") == 2, 30)
        leaver = Held(url, timeout_s=3.0)
        leaver.start()
        wait_for(
            "the leaving client's request held too",
            lambda: gauge(url, names.ROUTER_HELD_REQUESTS, "decode") == 3,
            3,
        )
        leaver.join(timeout=10)
        assert isinstance(leaver.error, httpx.TimeoutException), leaver.error  # it left before an answer
        wait_for("its hold to go", lambda: gauge(url, names.ROUTER_HELD_REQUESTS, "decode") == 2, 10)
        assert gauge(url, names.ROUTER_HELD_OLDEST_SECONDS, "decode") > 0

        # a third fills the queue; a fourth is refused at once, saying why and when to come back
        held.append(Held(url))
        held[-1].start()
        wait_for("three held requests", lambda: gauge(url, names.ROUTER_HELD_REQUESTS, "decode") == 3, 30)
        refused = httpx.post(f"{url}/v1/completions", json=BODY, timeout=30)
        assert refused.status_code == 503, refused.text
        assert (
            int(refused.headers["Retry-After"]) >= 1 and "already wait" in refused.json()["error"]["message"]
        )

        # the autoscaler wakes both pools; the held requests are answered, their cold start said
        for h in held:
            h.join(timeout=300)
        for h in held:
            assert h.response is not None and h.response.status_code == 200, h.response and h.response.text
            assert int(h.response.headers[names.COLD_START_HEADER]) >= 500
        said = [li for li in log_path.read_text().splitlines() if li.startswith("autoscaler: ")]
        assert any("decode 0->1" in li and "[WakeFromZero]" in li for li in said), said
        assert any("prefill 0->1" in li and "[WakeFromZero]" in li for li in said), said
        warm = httpx.post(f"{url}/v1/completions", json=BODY, timeout=60)
        assert warm.status_code == 200 and names.COLD_START_HEADER not in warm.headers

        # idle for the stabilization window: back to zero, and a new request wakes the pools again
        wait_for(
            "both pools back at zero",
            lambda: routable(url, "prefill") == 0 and routable(url, "decode") == 0,
            120,
        )
        again = httpx.post(f"{url}/v1/completions", json=BODY, timeout=300)
        assert again.status_code == 200 and int(again.headers[names.COLD_START_HEADER]) >= 500
        assert (
            gauge(url, names.ROUTER_HELD_REQUESTS, "decode") == 0 and queue_depth(url) == 0
        )  # nothing left behind
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=30) == 0
    finally:
        if up.poll() is None:
            up.kill()

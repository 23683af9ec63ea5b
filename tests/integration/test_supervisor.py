"""`tandem up` as a supervisor, run as users run it: a worker killed with SIGKILL is restarted while the
other decode worker keeps serving, and the router routes to it again; SIGTERM stops everything (the drain
grace, then SIGKILL); and SIGKILL of `tandem up` itself leaves no child behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tandem.shm_segments import SHM_DIR, creator_of
from tandem.testing.local_up import launch, routable
from tests.integration.stacks import spec

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 240.0
# The guard on events that take well under a second on an idle host (a SIGKILLed process exiting, the
# supervisor's restart after its 0.5 s backoff, tandem up's stop within its 5 s grace): a hundredfold margin.
HANG_S = 60.0


def children(pid: int) -> list[int]:
    """Live child processes of `pid` (from /proc), zombies left out."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return [c for c in out if alive(c)]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_for(what: str, check, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def complete_answer(url: str) -> tuple[int, str]:
    """One short completion: its HTTP status (0 when none came) and body. It waits for the router's answer,
    with no deadline of its own: the router bounds every request itself (each attempt's Reserve and Prefill
    deadlines, three attempts, then a 503), a bound longer than any fixed client wait would have to be on a
    busy host while a worker restarts beside it; pytest's timeout catches a router that never answers."""
    try:
        r = httpx.post(
            f"{url}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4}, timeout=None
        )
    except httpx.HTTPError as e:
        return 0, repr(e)
    return r.status_code, r.text


def complete(url: str) -> int:
    return complete_answer(url)[0]


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def start_tandem_up(
    tiny_model_dir, tmp_path: Path, decode: int = 1, obj: dict | None = None, new_session: bool = False
) -> tuple[subprocess.Popen, str]:
    """`tandem up -f` of `obj` (default: a stack with `decode` decode workers), once it serves; its output in
    tmp_path/tandem-up.log. `new_session`: in a process group of its own, to be killed as one."""
    proc, url = launch(obj or spec("sup", tiny_model_dir, decode=decode), tmp_path, new_session=new_session)
    try:
        wait_for("the stack to serve", lambda: healthy(url) or proc.poll() is not None, START_TIMEOUT_S)
    except AssertionError:
        proc.kill()
        raise
    assert proc.poll() is None, (tmp_path / "tandem-up.log").read_text()
    return proc, url


def test_a_killed_worker_is_restarted_while_the_rest_serves_and_sigterm_stops_all(tiny_model_dir, tmp_path):
    up, url = start_tandem_up(tiny_model_dir, tmp_path, decode=2)
    try:
        wait_for("both decode workers to be routable", lambda: routable(url, "decode") == 2, START_TIMEOUT_S)
        kids = children(up.pid)
        assert len(kids) == 4, [cmdline(k) for k in kids]  # router, prefill, two decode workers
        victim = next(k for k in kids if "--role decode" in cmdline(k))
        os.kill(victim, signal.SIGKILL)
        wait_for("the victim to go", lambda: not alive(victim), HANG_S)
        status, body = complete_answer(url)
        assert status == 200, body  # the other decode worker serves while the victim restarts
        log = tmp_path / "tandem-up.log"
        wait_for(
            "the supervisor to restart the victim", lambda: "restarted (restart 1)" in log.read_text(), HANG_S
        )
        assert "exited with code -9; restarting in" in log.read_text()
        replacement = [k for k in children(up.pid) if "--role decode" in cmdline(k) and k not in kids]
        assert len(replacement) == 1 and len(children(up.pid)) == 4 and up.poll() is None
        wait_for(
            "the router to route to the restarted worker",
            lambda: routable(url, "decode") == 2,
            START_TIMEOUT_S,
        )
        assert complete(url) == 200
        kids = children(up.pid)
        up.send_signal(signal.SIGTERM)
        assert (
            up.wait(timeout=HANG_S) == 0
        )  # the children's drain grace, then SIGKILL: never their whole drain
        wait_for("every child to exit", lambda: not any(alive(k) for k in kids), HANG_S)
    finally:
        if up.poll() is None:
            up.kill()


def test_sigkill_of_tandem_up_takes_every_child_with_it(tiny_model_dir, tmp_path):
    up, _ = start_tandem_up(tiny_model_dir, tmp_path, decode=1)
    kids = children(up.pid)
    assert len(kids) == 3
    up.kill()
    up.wait()
    wait_for("the orphans to die", lambda: not any(alive(k) for k in kids), HANG_S)


def test_shared_memory_of_a_killed_run_is_removed_by_the_next_tandem_up(tiny_model_dir, tmp_path):
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first, _ = start_tandem_up(tiny_model_dir, tmp_path / "first", decode=1, new_session=True)
    kids = children(first.pid)
    decode = next(k for k in kids if "--role decode" in cmdline(k))
    segments = [n for n in os.listdir(SHM_DIR) if creator_of(n) == decode]
    assert segments, "the decode worker lends no shared-memory staging rings"
    os.killpg(first.pid, signal.SIGKILL)  # the whole run at once, resource trackers included
    first.wait()
    wait_for("the run to die", lambda: not any(alive(k) for k in kids), HANG_S)
    # they are left now (unless another stack on this host started meanwhile and already swept them)
    second, _ = start_tandem_up(tiny_model_dir, tmp_path / "second", decode=1)
    try:
        left = [n for n in segments if os.path.exists(os.path.join(SHM_DIR, n))]
        assert left == [], f"the dead run's segments survived the next tandem up: {left}"
    finally:
        second.kill()
        second.wait()

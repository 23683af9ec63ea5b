"""Repeated SIGKILL of each role under streaming load on the `tandem up` supervisor (two prefill and two
decode workers): requests that had not started streaming are retried and succeed, streams on a killed
decode worker end with an error event, no client waits past its deadline, every worker's KV blocks return
to zero (what a dead router reserved, by the lease), and the stack is whole again within a few of its own
start times. The router's own streams die with it; while it restarts, clients are refused at once. Each
step waits on what it expects (load served, a worker replaced), never on a sleep. bench/faults.py runs the
long version."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tandem.testing.fault_load import FaultLoad
from tests.integration.stacks import load, running_stack, spec

pytestmark = pytest.mark.slow

DEADLINE_S = 30.0
LEASE_MS = 5000  # a reservation whose router died is freed by its lease alone
RECOVERY_TIMEOUT_S = 240.0  # a hang, not slowness: the bound below is relative to the stack's own start
HANG_S = 120.0  # the other waits: events that come, however busy the host; past this they hang


def _routable(url: str, role: str) -> int:
    try:
        text = httpx.get(f"{url}/metrics", timeout=2, trust_env=False).text
    except httpx.HTTPError:
        return 0
    return int(
        sum(
            float(li.split()[-1])
            for li in text.splitlines()
            if li.startswith("tandem_router_routable_workers{") and f'role="{role}"' in li
        )
    )


def _whole(url: str) -> bool:
    return _routable(url, "prefill") == 2 and _routable(url, "decode") == 2


def _wait(what: str, check, timeout_s: float) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.1)
    return time.monotonic() - started


def _idle(stack, timeout_s: float = LEASE_MS / 1000 + HANG_S) -> None:
    """Every worker, the survivors and the restarted ones, holds no KV block and runs nothing."""
    deadline = time.monotonic() + timeout_s
    while True:
        reports = {p.name: load(p) for p in stack.plans if p.role != "router"}
        held = {
            n: (r.total_kv_blocks - r.free_kv_blocks, r.reserved_kv_blocks, r.running_sequences)
            for n, r in reports.items()
        }
        if all(v == (0, 0, 0) for v in held.values()):
            return
        assert time.monotonic() < deadline, f"blocks still held (used, reserved, running): {held}"
        time.sleep(0.2)


def _kill(stack, *names: str) -> list[int]:
    pids = [stack.running[n].pid for n in names]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return pids


def _replaced(stack, names: tuple[str, ...], pids: list[int]) -> bool:
    return all(stack.running[n].pid != pid for n, pid in zip(names, pids, strict=True))


def test_repeated_kill_of_each_role_under_streaming_load(tiny_model_dir, tmp_path):
    started = time.monotonic()
    obj = spec("kills", tiny_model_dir, prefill=2, decode=2)
    obj["spec"]["kvTransfer"] = {"leaseMs": LEASE_MS}
    with running_stack(obj, tmp_path) as (stack, url):
        start_s = _wait("every worker routable", lambda: _whole(url), 120) + (time.monotonic() - started)
        recovery = {}
        # one worker of each pool at a time, each twice: the pool's other worker keeps serving
        for victims in (("prefill-0", "decode-0"), ("prefill-1", "decode-1")):
            with FaultLoad(url, clients=3, deadline_s=DEADLINE_S) as clients:
                began = time.monotonic()
                _wait("the load served", lambda c=clients, t=began: c.ok_since(t), HANG_S)
                pids = _kill(stack, *victims)
                recovery[victims] = _wait(
                    f"{victims} replaced and routed to",
                    lambda victims=victims, pids=pids: _replaced(stack, victims, pids) and _whole(url),
                    RECOVERY_TIMEOUT_S,
                )
                whole_at = time.monotonic()
                _wait(
                    "the load served by the whole stack", lambda c=clients, t=whole_at: c.ok_since(t), HANG_S
                )
            answers = clients.answers
            kinds = clients.kinds()
            assert kinds.get("ok", 0) > 0, kinds
            # a request the kill met before its first token was retried on the other worker: never refused
            assert set(kinds) <= {"ok", "error_event"}, [
                a for a in answers if a.kind not in ("ok", "error_event")
            ]
            for a in answers:
                assert a.took_s < DEADLINE_S, a
                if a.kind == "error_event":
                    assert "decode" in a.detail or "mid-stream" in a.detail, (
                        a
                    )  # a stream on the killed decode
            _idle(stack)
        for kill in range(2):
            with FaultLoad(url, clients=3, deadline_s=DEADLINE_S) as clients:
                began = time.monotonic()
                _wait("the load served", lambda c=clients, t=began: c.ok_since(t), HANG_S)
                proc = stack.running["router"]
                (pid,) = _kill(stack, "router")
                _wait("the router gone", lambda proc=proc: proc.poll() is not None, HANG_S)
                dead_at = time.monotonic()
                recovery[(f"router#{kill + 1}",)] = _wait(
                    "the router back",
                    lambda pid=pid: _replaced(stack, ("router",), [pid]) and _whole(url),
                    RECOVERY_TIMEOUT_S,
                )
                back_at = time.monotonic()
                _wait("the load served by the new router", lambda c=clients, t=back_at: c.ok_since(t), HANG_S)
            kinds = clients.kinds()
            assert set(kinds) <= {"ok", "cut", "refused"} and kinds.get("ok", 0) > 0, kinds
            for a in clients.answers:
                assert a.took_s < DEADLINE_S, a
                if a.kind == "cut":  # only the router's own streams (and connections) at the moment it died
                    assert a.start < dead_at, a
                if (
                    a.kind == "refused"
                ):  # nobody listens: told while the router is down, not kept until it is back
                    assert a.start + a.took_s < back_at, a
            assert kinds.get("cut", 0) <= 3, kinds
            _idle(stack)
        print(
            f"start {start_s:.1f} s; whole again after "
            + ", ".join(f"{'+'.join(k)} {v:.1f} s" for k, v in recovery.items())
        )
        # A replacement starts on a host busy with the load and the other restarts, the stack's first start
        # on an idle one: within a few of those start times, plus the supervisor's backoff.
        assert all(s < 3 * start_s + 5 for s in recovery.values()), (start_s, recovery)

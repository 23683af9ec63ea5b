"""When `tandem up` restarts a crashed child: doubling backoff, capped, forgotten after a stable run."""

from __future__ import annotations

import os
import subprocess
import sys

from tandem.operator.local.supervisor import (
    RESTART_BASE_S,
    RESTART_CAP_S,
    ChildState,
    restart_delay,
)


def test_restart_delay_doubles_up_to_the_cap():
    assert [restart_delay(n) for n in (1, 2, 3)] == [RESTART_BASE_S, 2 * RESTART_BASE_S, 4 * RESTART_BASE_S]
    assert restart_delay(50) == RESTART_CAP_S


def test_a_crash_loop_backs_off_and_a_stable_run_starts_afresh():
    child = ChildState(started_at=0.0)
    delays = []
    now = 1.0
    for _ in range(4):  # crashes a second after each start
        delays.append(child.exited(now, stable_after_s=60))
        assert child.restart_at == now + delays[-1]
        now = child.restart_at
        child.restarted(now)
        now += 1.0
    assert delays == [0.5, 1.0, 2.0, 4.0] and child.restarts == 4
    assert child.exited(now + 120, stable_after_s=60) == RESTART_BASE_S  # ran two minutes: a fresh crash


CHILD = "from tandem.lifecycle import honour_parent_death; honour_parent_death(); print('ok')"


def test_a_child_that_asks_to_die_with_its_parent_runs_normally():
    from tandem.lifecycle import die_with_parent_env

    env = {**os.environ, **die_with_parent_env()}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout == "ok\n"


def test_a_child_whose_parent_is_already_gone_exits_at_once():
    from tandem.lifecycle import PARENT_ENV

    env = {**os.environ, PARENT_ENV: "1"}  # not this child's parent: that one is gone
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and out.stdout == ""

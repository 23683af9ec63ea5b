"""Staging segments carry their creator's pid, and the sweep removes exactly those whose creator has died:
real processes creating real /dev/shm segments, killed with SIGKILL together with their resource tracker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tandem.shm_segments import SHM_DIR, creator_of, dead_segments, new_segment_name, sweep_dead_segments

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="no /dev/shm")

HOLDER = textwrap.dedent(
    """
    import sys, time
    from tandem.worker.kv_transport.staging import StagingRing
    ring = StagingRing.create_shm(1 << 12)
    print(ring.name, flush=True)
    time.sleep(120)
    """
)


def test_names_carry_the_creator():
    assert creator_of(new_segment_name(4242)) == 4242
    assert creator_of(new_segment_name()) == os.getpid()
    assert creator_of("tandem-kv-" + "a" * 24) is None  # an older name: no creator to judge by
    assert creator_of("tandem-kv-12-../x") is None and creator_of("psm_1234") is None
    names = [new_segment_name(10), new_segment_name(11), "tandem-kv-" + "b" * 24, "other"]
    assert dead_segments(names, alive=lambda pid: pid == 11) == [names[0]]


def _holder() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def test_the_sweep_removes_a_killed_creators_segments_and_keeps_a_live_ones():
    dead, dead_name = _holder()
    live, live_name = _holder()
    try:
        os.killpg(
            dead.pid, signal.SIGKILL
        )  # the process and its resource tracker: nothing unlinks the segment
        dead.wait(timeout=10)
        assert os.path.exists(os.path.join(SHM_DIR, dead_name)), (
            "the killed process's segment is already gone"
        )
        removed = sweep_dead_segments()
        assert dead_name in removed and live_name not in removed
        assert not os.path.exists(os.path.join(SHM_DIR, dead_name))
        assert os.path.exists(os.path.join(SHM_DIR, live_name))
    finally:
        os.killpg(live.pid, signal.SIGKILL)
        live.wait(timeout=10)
        sweep_dead_segments()

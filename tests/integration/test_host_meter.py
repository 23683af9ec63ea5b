"""The benches' CPU meter on the real host (Linux /proc): a process it does not own counts as other work, at
least for the CPU time that process used, however busy the rest of the host is."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from bench._host import CpuMeter

SPIN_CPU_S = 0.5  # CPU time the foreign process burns, whatever the wall time that takes on a busy host


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="the meter reads Linux /proc")
def test_a_process_the_meter_does_not_own_counts_as_other_work():
    cpu0, wall0 = _children_cpu_s(), time.monotonic()
    meter = CpuMeter(lambda: [os.getpid()]).start()
    spin = f"import time\nwhile time.process_time() < {SPIN_CPU_S}: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)
    shares = meter.shares()
    wall, spent = time.monotonic() - wall0, _children_cpu_s() - cpu0
    assert spent >= SPIN_CPU_S
    # other work only adds to the share, and the meter's window lies inside ours (its capacity is no larger);
    # a fifth of slack: /proc/stat samples CPU time by the tick, the child's own account is exact
    at_least = 0.8 * spent / (wall * (os.cpu_count() or 1))
    foreign = shares["foreign_cpu_share"]
    assert foreign is not None and foreign >= at_least, (foreign, at_least, wall)
    assert set(shares) == {"foreign_cpu_share", "steal_cpu_share", "interrupt_cpu_share"}
    assert all(v is not None and v >= 0.0 for v in shares.values())

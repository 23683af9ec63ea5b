"""How busy the host was with other work while a benchmark ran: the load average, and the CPU time that
processes other than the benchmark's own used (Linux /proc), which the benchmark's own load does not blur."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

T = TypeVar("T")

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
QUIET_FOREIGN_SHARE = 0.1  # other processes may use at most this share of the host's CPUs for a verdict


def load_average() -> float:
    """The host's 1-minute load average."""
    return os.getloadavg()[0]


def busy_ticks(stat_first_line: str) -> int:
    """Clock ticks the host's CPUs spent busy, from /proc/stat's `cpu` line (pure): all but idle and
    iowait."""
    fields = [int(x) for x in stat_first_line.split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields[:8]) - idle


STAT_COLUMNS = (
    "user",
    "nice",
    "system",
    "idle",
    "iowait",
    "irq",
    "softirq",
    "steal",
)  # of /proc/stat's cpu line


def stat_column(stat_first_line: str, name: str) -> int:
    """One column of /proc/stat's `cpu` line, in clock ticks (pure; 0 where an old kernel lacks it). `steal`
    is time the hypervisor gave to other machines; `irq` and `softirq` are interrupt work no process is
    charged for (with IRQ time accounting), most of it the benchmark's own loopback traffic."""
    fields = stat_first_line.split()[1:]
    i = STAT_COLUMNS.index(name)
    return int(fields[i]) if len(fields) > i else 0


def process_ticks(stat_line: str) -> int:
    """User plus system clock ticks of one process, from its /proc/PID/stat line (pure)."""
    fields = stat_line.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _read(path: str) -> str:
    with open(path) as f:
        return f.readline()


def _ours(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += process_ticks(_read(f"/proc/{pid}/stat"))
        except OSError:  # ended since: its ticks are gone with it
            pass
    return total


@dataclass
class CpuMeter:
    """Between start() and share(): the share of the host's CPU capacity that processes other than `pids()`
    used. None where /proc is not there."""

    pids: Callable[[], Iterable[int]]
    _start: tuple[float, int, int] | None = None
    _stat: str = ""  # /proc/stat's cpu line at start

    def start(self) -> CpuMeter:
        try:
            self._stat = _read("/proc/stat")
            self._start = (time.monotonic(), busy_ticks(self._stat), _ours(self.pids()))
        except OSError:
            self._start = None
        return self

    def column_share(self, *names: str) -> float | None:
        """The share of the CPU capacity that these /proc/stat columns took since start(): part of share()."""
        if self._start is None:
            return None
        try:
            stat = _read("/proc/stat")
        except OSError:
            return None
        ticks = sum(stat_column(stat, n) - stat_column(self._stat, n) for n in names)
        return foreign_share(ticks, 0, (time.monotonic() - self._start[0]) * TICKS * (os.cpu_count() or 1))

    def shares(self) -> dict[str, float | None]:
        """share() and the parts of it a reader asks about next: hypervisor steal and interrupt work."""
        return {
            "foreign_cpu_share": self.share(),
            "steal_cpu_share": self.column_share("steal"),
            "interrupt_cpu_share": self.column_share("irq", "softirq"),
        }

    def share(self) -> float | None:
        if self._start is None:
            return None
        wall0, busy0, ours0 = self._start
        try:
            busy, ours = busy_ticks(_read("/proc/stat")), _ours(self.pids())
        except OSError:
            return None
        capacity = (time.monotonic() - wall0) * TICKS * (os.cpu_count() or 1)
        return foreign_share(busy - busy0, ours - ours0, capacity)


class HostMeter(Protocol):
    """What `quietly` reads the host through: started before a measurement, its shares read after it
    (CpuMeter on a real host; a scripted one in a test)."""

    def start(self) -> HostMeter: ...

    def shares(self) -> dict[str, float | None]: ...


def quietly(
    measure: Callable[[], T],
    meter: Callable[[], HostMeter],
    reruns: int,
    quiet: float = QUIET_FOREIGN_SHARE,
    before: Callable[[], object] = lambda: None,
) -> tuple[T, dict[str, float | None], list[dict[str, float | None]]]:
    """Run `measure` under a fresh meter (after `before`, unmetered), and again (at most `reruns` more times)
    while other work took more than `quiet` of the CPUs during it. Returns the last result, its host shares,
    and the shares of the attempts thrown away: a burst of other work costs a rerun, not the run's verdict."""
    discarded: list[dict[str, float | None]] = []
    while True:
        before()
        running = meter().start()
        result = measure()
        shares = running.shares()
        foreign = shares["foreign_cpu_share"]
        if foreign is None or foreign <= quiet or len(discarded) >= reruns:
            return result, shares, discarded
        discarded.append(shares)


def foreign_share(busy_ticks: int, our_ticks: int, capacity_ticks: float) -> float:
    """The share of the CPU capacity that other processes kept busy (pure; never below 0)."""
    return max(0.0, busy_ticks - our_ticks) / capacity_ticks if capacity_ticks > 0 else 0.0


def busy_reason(
    loads: Iterable[float],
    foreign: Iterable[float | None],
    quiet_load: float,
    quiet_foreign: float = QUIET_FOREIGN_SHARE,
) -> str | None:
    """Why the host counts as busy, or None (pure): other processes' CPU share above `quiet_foreign` where it
    was measured (the benchmark's own processes raise the load average too), else a load average above
    `quiet_load`."""
    shares = [f for f in foreign if f is not None]
    if shares:
        worst = max(shares)
        return (
            f"other processes used {worst:.0%} of the CPUs (> {quiet_foreign:.0%})"
            if worst > quiet_foreign
            else None
        )
    loads = list(loads)
    if loads and max(loads) > quiet_load:
        return f"load average reached {max(loads):.2f} (> {quiet_load:g})"
    return None

"""A pytest plugin that fails any test whose body runs longer than SLOW_UNMARKED_S without
`@pytest.mark.slow`, so CI's time stays visible: a slow test is either marked (and known) or made faster.
Fixture setup is not counted (a module-scoped stack started once is the point), only the test's own call.

The limit is wall time on an unshared machine: where the host's 1-minute load average per core is above 1
(other jobs on a shared host), the limit stretches by that factor, so that the guard flags tests that are
slow rather than hosts that are busy. `slow` tests still run in CI; only a soak belongs in bench/.
"""

from __future__ import annotations

import os

import pytest

SLOW_UNMARKED_S = 60.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "slow_unmarked_seconds", f"longest test body without @pytest.mark.slow (default {SLOW_UNMARKED_S:g})"
    )


def load_per_core() -> float:
    """The 1-minute load average per CPU (0 where the platform has none)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


def limit_s(base_s: float, load: float) -> float:
    """The longest an unmarked test body may run at `load` per core: `base_s`, stretched past a full host."""
    return base_s * max(1.0, load)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.passed or item.get_closest_marker("slow") is not None:
        return
    base = float(item.config.getini("slow_unmarked_seconds") or SLOW_UNMARKED_S)
    if call.duration <= base:
        return
    load = load_per_core()
    limit = limit_s(base, load)
    if call.duration > limit:
        report.outcome = "failed"
        stretched = f" ({base:g} s stretched by a load of {load:.1f} per core)" if limit > base else ""
        report.longrepr = (
            f"{item.nodeid} took {call.duration:.1f} s, over {limit:g} s{stretched} without "
            "@pytest.mark.slow: mark it slow, or share its slow fixtures (start them once per module)"
        )

"""A pytest plugin that fails any test whose body runs longer than SLOW_UNMARKED_S without `@pytest.mark.slow`,
so CI's time stays visible: a slow test is either marked (and known) or made faster. Fixture setup is not
counted (a module-scoped stack started once is the point), only the test's own call."""

from __future__ import annotations

import pytest

SLOW_UNMARKED_S = 60.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("slow_unmarked_seconds", f"longest test body without @pytest.mark.slow (default {SLOW_UNMARKED_S:g})")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.passed or item.get_closest_marker("slow") is not None:
        return
    limit = float(item.config.getini("slow_unmarked_seconds") or SLOW_UNMARKED_S)
    if call.duration > limit:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {call.duration:.1f} s, over {limit:g} s without @pytest.mark.slow: "
            "mark it slow, or share its slow fixtures (start them once per module)"
        )

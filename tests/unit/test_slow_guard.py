"""The slow-test guard: an unmarked test over the limit fails, naming itself; a marked one passes; a host busy
with other work stretches the limit by its load per core, and only past a full host."""

import pytest

import tests.slow_guard as slow_guard

INNER = """
import time
import pytest

def test_quick():
    pass

def test_unmarked_slow():
    time.sleep(0.3)

@pytest.mark.slow
def test_marked_slow():
    time.sleep(0.3)
"""
INI = (
    "[pytest]\nslow_unmarked_seconds = 0.1\nasyncio_default_fixture_loop_scope = function\n"
    "markers =\n    slow: slow\n"
)


@pytest.fixture
def inner(pytester, monkeypatch):
    pytester.makeini(INI)
    pytester.makepyfile(test_inner=INNER)

    def run(load: float):
        monkeypatch.setattr(slow_guard, "load_per_core", lambda: load)
        return pytester.runpytest("-p", "no:cacheprovider", plugins=[slow_guard])

    return run


def test_an_unmarked_test_over_the_limit_fails(inner):
    result = inner(load=0.5)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_unmarked_slow took *over 0.1 s without @pytest.mark.slow*"])


def test_a_busy_host_stretches_the_limit_by_its_load(inner):
    inner(load=10.0).assert_outcomes(passed=3)  # 0.3 s is under 0.1 s x 10
    result = inner(load=2.0)  # 0.3 s is over 0.1 s x 2
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*took *over 0.2 s (0.1 s stretched by a load of 2.0 per core)*"])


def test_the_limit_never_shrinks_below_the_base():
    assert slow_guard.limit_s(60, 0.0) == slow_guard.limit_s(60, 1.0) == 60
    assert slow_guard.limit_s(60, 3.0) == 180

"""The slow-test guard: an unmarked test over the limit fails, naming itself; a marked one passes."""

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


def test_an_unmarked_test_over_the_limit_fails(pytester):
    pytester.makeini("[pytest]\nslow_unmarked_seconds = 0.1\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest("-p", "no:cacheprovider", plugins=[slow_guard])
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_unmarked_slow took *without @pytest.mark.slow*"])

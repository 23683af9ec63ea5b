"""A child of `tandem up` dies with the thread that started it: the child asks the kernel itself, at start.

The request (Linux's PR_SET_PDEATHSIG) used to run as a `preexec_fn`, Python code between fork and exec
in a parent with many threads, which can deadlock the child on a lock another thread held at the fork
(seen as a supervisor stuck in `Popen` for good under load). Now the parent only names itself in the
child's environment and the child makes the request first thing, then checks that parent is still its own.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "TANDEM_DIE_WITH_PARENT"
PR_SET_PDEATHSIG = 1


def die_with_parent_env() -> dict[str, str]:
    """The environment that makes a tandem child die with this process's starting thread."""
    return {PARENT_ENV: str(os.getpid())} if sys.platform.startswith("linux") else {}


def honour_parent_death() -> None:
    """In the child: SIGKILL when the starting thread ends; exit now if that parent is already gone."""
    parent = os.environ.pop(PARENT_ENV, None)
    if parent is None or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(parent):  # the parent died before the request was in place
        os._exit(1)

"""Names of the shared-memory staging segments, and the sweep that removes those a dead process left behind.

A segment's name carries the id of the process that created it (`tandem-kv-<pid>-<96 random bits>`). A
process killed with SIGKILL cannot unlink what it created, so a worker that starts (a restart) and `tandem up`
remove every segment of this user whose creator is no longer alive. A live creator's segments are never
touched; a reused pid only delays a removal.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"  # where POSIX shared memory lives on Linux
SEGMENT_PREFIX = "tandem-kv-"
SEGMENT_NAME = re.compile(re.escape(SEGMENT_PREFIX) + r"(?:(?P<pid>[1-9][0-9]{0,9})-)?[0-9a-f]{24}")


def new_segment_name(pid: int | None = None) -> str:
    """A fresh name: the prefix, the creator's pid and 96 random bits (the only form a peer may send back)."""
    return f"{SEGMENT_PREFIX}{os.getpid() if pid is None else pid}-{secrets.token_hex(12)}"


def creator_of(name: str) -> int | None:
    """The pid a segment name carries, or None for a name that is not a minted segment with a pid."""
    m = SEGMENT_NAME.fullmatch(name)
    return int(m["pid"]) if m and m["pid"] else None


def dead_segments(names: Iterable[str], alive: Callable[[int], bool]) -> list[str]:
    """The segment names whose creator is not alive (pure); names without a creator are not ours to judge."""
    return [n for n in names if (pid := creator_of(n)) is not None and not alive(pid)]


def pid_alive(pid: int) -> bool:
    """A process with this id exists and is not a zombie."""
    if os.path.isdir("/proc/self"):
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
        except (OSError, IndexError):
            return True  # unreadable: assume alive, never remove a live process's segment
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_dead_segments(shm_dir: str = SHM_DIR, alive: Callable[[int], bool] = pid_alive) -> list[str]:
    """Unlink this user's segments whose creator has died; returns the names removed."""
    try:
        entries = os.listdir(shm_dir)
    except OSError:
        return []
    removed = []
    uid = os.getuid()
    for name in dead_segments(entries, alive):
        path = os.path.join(shm_dir, name)
        try:
            if os.lstat(path).st_uid != uid:
                continue
            os.unlink(path)
        except OSError:
            continue
        removed.append(name)
    if removed:
        log.info("removed %d shared-memory segments of dead processes: %s", len(removed), ", ".join(removed))
    return removed

"""One daemon thread that runs a check every few seconds until stopped and survives the check's failures:
the shape of the worker's health and role-label watches, the decode worker's lease expiry and the local
autoscaler's tick."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Every:
    """Calls `check` every `every_s` seconds on a daemon thread named `name` (the first call one period
    in)."""

    def __init__(self, every_s: float, check: Callable[[], object], name: str) -> None:
        self.every_s, self.check, self.name = every_s, check, name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Every:
        self._thread.start()
        return self

    def stop(self, join_s: float | None = None) -> None:
        """Stop after the call in progress, if any; wait up to `join_s` seconds for it (None: do not wait)."""
        self._stop.set()
        if join_s is not None and self._thread.is_alive():
            self._thread.join(timeout=join_s)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.check()
            except Exception:  # keep going whatever one call did
                log.exception("%s failed", self.name)

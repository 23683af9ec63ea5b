"""Runs the engine on its own thread so gRPC handlers on other threads can submit, reserve and abort.

Every touch of the engine happens under one lock; the loop steps while there is work and sleeps on an
event otherwise. Each request's tokens go to its own queue, ended by a final event, so a handler streams
them without polling and a failing step fails its requests instead of hanging them.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from tandem.worker.engine import Engine, StepOutput
from tandem.worker.sampling import SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class StreamEnd:
    """The last item of a request's queue: why it ended (`error` set when it failed)."""

    finish_reason: str
    error: str = ""


class EngineLoop:
    def __init__(self, engine: Engine, on_step: Callable[[Engine], None] | None = None):
        self.engine = engine
        self.on_step = on_step
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._streams: dict[str, queue.Queue[StepOutput | StreamEnd]] = {}
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        self._thread.join(timeout=10)

    # --- called from handler threads ---------------------------------------------------------
    def call(self, fn: Callable[[Engine], T]) -> T:
        """Run `fn(engine)` under the engine lock (for reserve, release, load reports)."""
        with self._lock:
            return fn(self.engine)

    def submit(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> queue.Queue[StepOutput | StreamEnd]:
        """Queue a request; raises InvalidRequest at once for a bad one."""
        stream: queue.Queue[StepOutput | StreamEnd] = queue.Queue()
        with self._lock:
            self.engine.add_request(prompt_ids, params, request_id)
            self._streams[request_id] = stream
        self._wake.set()
        return stream

    def admit(
        self, request_id: str, fn: Callable[[Engine], list[StepOutput]], stream: queue.Queue[StepOutput | StreamEnd]
    ) -> None:
        """Admit a sequence via `fn` (e.g. `engine.admit_prefilled`); its tokens go to `stream`."""
        with self._lock:
            self._streams[request_id] = stream
            try:
                first = fn(self.engine)
            except Exception:
                del self._streams[request_id]
                raise
            self._deliver(first)
        self._wake.set()

    def abort(self, request_id: str, reason: str = "abort") -> bool:
        with self._lock:
            found = self.engine.abort(request_id)
            stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.put(StreamEnd(reason))
        return found

    @staticmethod
    def iterate(stream: queue.Queue[StepOutput | StreamEnd], timeout_s: float = 600.0) -> Iterator[StepOutput | StreamEnd]:
        """Items of one request's queue up to and including its end."""
        while True:
            item = stream.get(timeout=timeout_s)
            yield item
            if isinstance(item, StreamEnd) or item.finish_reason is not None:
                return

    # --- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopped.is_set():
            with self._lock:
                busy = self.engine.has_work()
                if busy:
                    try:
                        self._deliver(self.engine.step())
                    except Exception as exc:  # fail what was running, keep serving
                        log.exception("engine step failed")
                        self._fail_all(f"engine step failed: {exc}")
                    if self.on_step is not None:
                        self.on_step(self.engine)
            if not busy:
                self._wake.wait(timeout=0.5)
                self._wake.clear()

    def _deliver(self, outputs: list[StepOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            stream.put(out)
            if out.finish_reason is not None:
                del self._streams[out.request_id]

    def _fail_all(self, message: str) -> None:
        for request_id, stream in list(self._streams.items()):
            self.engine.abort(request_id)
            stream.put(StreamEnd("error", message))
        self._streams.clear()

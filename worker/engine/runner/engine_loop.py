"""Runs the engine on its own thread; gRPC handlers on other threads hand it commands.

The engine thread owns the engine: submit, reserve, admit and abort arrive as commands that run between
two steps, so a handler waits at most one step (a lock would let the busy loop starve them). Each
request's tokens go to its own queue, ended by a final event, so a handler streams them without polling,
and a failing step fails its requests instead of hanging them. A load snapshot, refreshed after every
step and command, answers load reports without waiting.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from tandem.worker.api.params import SamplingParams
from tandem.worker.engine.runner.engine import Engine, StepOutput

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class StreamEnd:
    """The last item of a request's queue: why it ended (`error` set when it failed)."""

    finish_reason: str
    error: str = ""


@dataclass(frozen=True)
class LoadSnapshot:
    queued_prompt_tokens: int = 0
    running: int = 0
    waiting: int = 0
    free_kv_blocks: int = 0
    total_kv_blocks: int = 0


TokenQueue = queue.Queue[StepOutput | StreamEnd]


class EngineLoop:
    def __init__(self, engine: Engine, on_step: Callable[[Engine], None] | None = None):
        self.engine = engine
        self.on_step = on_step
        self._commands: queue.SimpleQueue[tuple[Callable[[Engine], Any], Future] | None] = queue.SimpleQueue()
        self._stopped = threading.Event()
        self._streams: dict[str, TokenQueue] = {}
        self.snapshot = LoadSnapshot()
        self.beat = time.monotonic()  # when the loop last came round (a step or an idle wait ended)
        self.failed_steps = 0  # steps that failed in a row (a broken device fails every one)
        self._refresh()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """The engine thread is alive (started and not ended)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stopped.set()
        self._commands.put(None)
        self._thread.join(timeout=10)

    # --- called from handler threads ---------------------------------------------------------
    def call(self, fn: Callable[[Engine], T]) -> T:
        """Run `fn(engine)` on the engine thread between steps; its exception is raised here."""
        if threading.current_thread() is self._thread:
            return fn(self.engine)
        done: Future = Future()
        self._commands.put((fn, done))
        return done.result()

    def submit(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> TokenQueue:
        """Queue a request; raises InvalidRequest at once for a bad one."""
        stream: TokenQueue = queue.Queue()

        def add(engine: Engine) -> None:
            engine.add_request(prompt_ids, params, request_id)
            self._streams[request_id] = stream

        self.call(add)
        return stream

    def admit(self, request_id: str, fn: Callable[[Engine], list[StepOutput]], stream: TokenQueue) -> None:
        """Admit a sequence via `fn` (e.g. `engine.admit_prefilled`); its tokens go to `stream`."""

        def admit(engine: Engine) -> None:
            self._streams[request_id] = stream
            try:
                first = fn(engine)
            except Exception:
                del self._streams[request_id]
                raise
            self._deliver(first)

        self.call(admit)

    def abort(self, request_id: str, reason: str = "abort") -> bool:
        """End a request and free its blocks; True if the engine held it. Waits for the step in progress."""
        return self.call(self._aborter(request_id, reason))

    def abort_soon(self, request_id: str, reason: str = "abort") -> None:
        """Queue an abort without waiting: for gRPC callbacks, which all run on the server's one polling
        thread, so a callback that waits out a step delays every other cancellation (and the server) by a
        step."""
        self.post(self._aborter(request_id, reason))

    def post(self, fn: Callable[[Engine], object]) -> None:
        """Run `fn(engine)` on the engine thread between steps without waiting for it; a failure is logged."""
        done: Future = Future()
        done.add_done_callback(_log_failure)
        self._commands.put((fn, done))

    def _aborter(self, request_id: str, reason: str) -> Callable[[Engine], bool]:
        def abort(engine: Engine) -> bool:
            found = engine.abort(request_id)
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.put(StreamEnd(reason))
            return found

        return abort

    @staticmethod
    def iterate(stream: TokenQueue, timeout_s: float = 600.0) -> Iterator[StepOutput | StreamEnd]:
        """Items of one request's queue up to and including its end."""
        while True:
            item = stream.get(timeout=timeout_s)
            yield item
            if isinstance(item, StreamEnd) or item.finish_reason is not None:
                return

    # --- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopped.is_set():
            self.beat = time.monotonic()
            busy = self.engine.has_work()
            self._run_commands(block=not busy)
            if not self.engine.has_work():
                continue
            try:
                self._deliver(self.engine.step())
                self.failed_steps = 0
            except Exception as exc:  # fail what was running, keep serving
                self.failed_steps += 1
                log.exception("engine step failed")
                self._fail_all(f"engine step failed: {exc}")
            if self.on_step is not None:
                self.on_step(self.engine)
            self._refresh()

    def _run_commands(self, block: bool) -> None:
        try:
            item = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            fn, done = item
            try:
                done.set_result(fn(self.engine))
            except BaseException as exc:
                done.set_exception(exc)
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                break
        self._refresh()

    def _refresh(self) -> None:
        e = self.engine
        self.snapshot = LoadSnapshot(
            e.queued_prompt_tokens, e.num_running, e.num_waiting, e.blocks.num_free, e.blocks.num_blocks
        )

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


def _log_failure(done: Future) -> None:
    if done.exception() is not None:
        log.error("posted engine command failed: %s", done.exception())

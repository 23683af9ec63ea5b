"""Colocated workers in the simulator: each worker serves both phases of a request, prefill chunks riding in
its decode steps (chunked prefill), as the shape rule's capacity model (autoscale/colocated.py) assumes.

A request goes to the ready worker with the least work (queued prompt tokens, then running sequences). A
worker's step runs its whole decode batch and, when prompts wait, the prompts at the queue's head while their
tokens fit the profile's chunk and the batch and KV caps: such a step takes the decode step time at the batch
plus the prefill time of those tokens; the prompts' first tokens come at its end, and they join the batch; a
prompt longer than the chunk spans steps. A step without prompts is a plain decode step. Workers are billed as
the decode pool's replicas; there is no prefill pool and no KV transfer. Not yet a shape the autoscaler
drives: a fixed controller sizes the workers (`Pool.decode` counts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

from tandem.operator.autoscale.core.types import Pool
from tandem.operator.autoscale.sim.simulator import (
    Controller,
    Replica,
    Request,
    SimConfig,
    SimResult,
    Simulation,
)
from tandem.trace import TraceRequest


class ColocatedSimulation(Simulation):
    workers = Pool.decode  # the pool the colocated workers are counted in (sim/auto.py: Pool.colocated)

    def __init__(self, trace: Sequence[TraceRequest], config: SimConfig, controller: Controller):
        self._prefilled: dict[int, int] = {}  # prompt tokens done, per request started but not finished
        self._prefill_step: set[int] = set()  # workers whose step in progress carries prompt tokens
        super().__init__(trace, config, controller)

    def _to_prefill(self, req: Request) -> None:
        ready = [r for r in self.replicas[self.workers] if r.ready(self.now)]
        if not ready:
            self._hold(req)
            return
        rep = min(ready, key=lambda r: (r.queued_tokens, len(r.running), r.id))
        rep.queue.append(req)
        rep.queued_tokens += req.input_len
        self._wake(rep)

    def _hold(self, req: Request) -> None:
        """No worker is ready: the request waits for the next one."""
        self._pending_decode.append(req)

    def _wake(self, rep: Replica) -> None:
        """New work on `rep`: an idle worker steps now; a busy one looks at it at its next step boundary."""
        if rep.id in self._prefill_step:
            return  # the step in progress ends with a look at the queue
        if not rep.running:
            self._resegment(rep)
            return
        self._advance(rep)  # the running batch takes the prompt at its next step boundary
        steps = math.ceil((self.now - rep.segment_start_s) / rep.step_s - 1e-9)
        rep.version += 1
        self._push(rep.segment_start_s + steps * rep.step_s, "decoded", (rep, rep.version))

    def _to_decode(self, req: Request) -> None:
        self._to_prefill(req)  # a colocated worker takes the whole request

    def _resegment(self, rep: Replica) -> None:
        if not rep.running:
            rep.segment_start_s = max(rep.segment_start_s, self.now)
        while rep.waiting and len(rep.running) < self.profile.max_running_sequences:
            nxt = rep.waiting.popleft()  # prefilled elsewhere (a shape change in flight, sim/auto.py)
            nxt.decode_start_s = rep.segment_start_s
            rep.running.append(nxt)
        rep.serving, tokens = self._chunk(rep)
        rep.version += 1
        if tokens:
            self._prefill_step.add(rep.id)
            decode_ms = (
                self.profile.decode_step_ms(len(rep.running), self._context(rep)) if rep.running else 0.0
            )
            rep.step_s = (decode_ms + self.profile.prefill_ms(tokens)) / 1000
            self._push(rep.segment_start_s + rep.step_s, "decoded", (rep, rep.version))
            return
        self._decode_to_next_finish(rep)

    def _chunk(self, rep: Replica) -> tuple[list[Request], int]:
        """The next step's prompt tokens, from the queue's head up to the profile's chunk (a long prompt spans
        steps), and the prompts they finish; a prompt starts only while the batch and KV caps have room."""
        done: list[Request] = []
        budget = self.profile.prefill_chunk_tokens
        kv = sum(r.input_len + r.output_len for r in rep.running)
        room = self.profile.max_running_sequences - len(rep.running)
        while rep.queue and budget > 0 and len(done) < room:
            nxt = rep.queue[0]
            started = self._prefilled.get(nxt.id, 0)
            if (
                not started
                and (rep.running or done)
                and kv + nxt.input_len + nxt.output_len > self.profile.kv_capacity_tokens
            ):
                break
            take = min(nxt.input_len - started, budget)
            budget -= take
            rep.queued_tokens -= take
            if started + take < nxt.input_len:
                self._prefilled[nxt.id] = started + take
                break
            self._prefilled.pop(nxt.id, None)
            done.append(rep.queue.popleft())
            kv += nxt.input_len + nxt.output_len
        return done, self.profile.prefill_chunk_tokens - budget

    def _on_decoded(self, payload: object) -> None:
        rep, version = cast(tuple[Replica, int], payload)
        if version != rep.version:
            return
        self._advance(rep)  # the running sequences take the step's token
        if rep.id in self._prefill_step:
            self._prefill_step.discard(rep.id)
            self._join(rep)
        self._resegment(rep)

    def _join(self, rep: Replica) -> None:
        """The prompts the step finished give their first token and join the batch."""
        finished, rep.serving = rep.serving, []
        rep.segment_start_s = self.now
        for req in finished:
            req.first_token_s = req.decode_start_s = self.now
            self.exposition.first_token(self.now - req.arrival_s)
            if req.output_len <= 1:
                req.finish_s = self.now
                self.exposition.finished(None, req.output_len)
                continue
            req.remaining = req.output_len - 1  # the first token came with the step
            rep.running.append(req)


def simulate_colocated(trace: Sequence[TraceRequest], config: SimConfig, controller: Controller) -> SimResult:
    """Replay `trace` on colocated workers; `config.initial` and the controller count them as
    `Pool.decode`."""
    return ColocatedSimulation(trace, config, controller).run()

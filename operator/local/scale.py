"""Resize a pool of `tandem up`'s worker processes: start new workers, drain chosen ones away, flip warm ones
to the other pool, tell the router.

Scaling down is drain-safe: the worker holding the fewest running sequences is chosen, told to drain
(SIGTERM), and taken out of the router's workers file at once; it finishes what it holds and exits on
its own. The router re-reads the workers file, so it picks up the new set without a restart.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import grpc

from tandem.identity import FLIPPABLE, OPERATOR
from tandem.operator.autoscale.core.flip import flip_waves
from tandem.operator.autoscale.core.types import Replicas
from tandem.operator.local.flip import dial_worker, fewest_running, set_roles, with_role
from tandem.operator.local.plan import ProcessPlan, local_tls_root, worker_plan, workers_document
from tandem.operator.local.stack import LocalStack, free_port_block
from tandem.spec import InferenceService
from tandem.v1 import colocated_pb2_grpc, common_pb2, decode_pb2_grpc, lifecycle_pb2, prefill_pb2_grpc

log = logging.getLogger(__name__)
STUBS = {
    "prefill": prefill_pb2_grpc.PrefillServiceStub,
    "decode": decode_pb2_grpc.DecodeServiceStub,
    "colocated": colocated_pb2_grpc.ColocatedServiceStub,
}


def pick_victims(running_sequences: Mapping[str, int | None], count: int) -> list[str]:
    """Which workers to remove: the fewest running sequences first; a worker that does not answer (None,
    still starting) before any that serves; among equals the newest name (highest index)."""

    def key(name: str) -> tuple[int, int, int, str]:
        running = running_sequences[name]
        _, _, index = name.rpartition("-")
        return (0 if running is None else 1, running or 0, -int(index) if index.isdigit() else 0, name)

    return sorted(running_sequences, key=key)[: max(0, count)]


@dataclass
class Leaving:
    plan: ProcessPlan
    proc: subprocess.Popen
    since: float


class LocalPools:
    """The worker pools of one running local stack, resizable one worker at a time."""

    def __init__(
        self,
        stack: LocalStack,
        svc: InferenceService,
        base: Path,
        workers_file: Path,
        host: str = "127.0.0.1",
        threads: int = 1,
        load: Callable[[ProcessPlan], common_pb2.LoadReport | None] | None = None,
    ):
        self.stack, self.svc, self.base, self.workers_file = stack, svc, base, workers_file
        self.host, self.threads = host, threads
        self.tls_root = local_tls_root(svc, base, workers_file.parent)
        self.channels = WorkerChannels()
        self.load = load or (lambda p: load_report(p, channel=self.channels.get(p)))
        self.leaving: list[Leaving] = []
        self.exited: dict[str, int] = {}  # drained workers that are gone: their exit codes
        self._lock = threading.RLock()  # pools may be resized from several threads
        self._next_index = {role: sum(1 for p in stack.plans if p.role == role) for role in STUBS}

    def members(self, role: str) -> list[ProcessPlan]:
        """Workers of `role` the router may use (started or starting, not draining)."""
        with self._lock:
            return [p for p in self.stack.plans if p.role == role and p.name in self.stack.running]

    def replicas(self, role: str) -> Replicas:
        """Ready (answers a load report and is not draining), starting, and draining workers of `role`.
        A member that died (it did not drain) is replaced first, the way a Deployment replaces a pod."""
        self.reap()
        self.replace_crashed(role)
        reports = [self.load(p) for p in self.members(role)]
        ready = sum(1 for r in reports if r is not None and not r.draining)
        return Replicas(
            ready=ready,
            starting=len(reports) - ready,
            draining=sum(1 for w in self.leaving if w.plan.role == role),
        )

    def scale(self, role: str, desired: int) -> tuple[list[str], list[str]]:
        """Start or drain workers until `role` has `desired` members; returns (started, draining) names."""
        members = self.members(role)
        started: list[str] = []
        drained: list[str] = []
        for _ in range(desired - len(members)):
            started.append(self._start(role).name)
        if desired < len(members):
            running = {p.name: running_of(self.load(p)) for p in members}
            drained = self.drain(pick_victims(running, len(members) - desired))
        if started:
            self.write_workers_file()
        return started, drained

    def drain(self, worker_names: list[str]) -> list[str]:
        """Tell these workers to drain and take them out of the router's set; they exit when done."""
        with self._lock:
            by_name = {p.name: p for p in self.stack.plans if p.name in self.stack.running}
            for name in worker_names:
                self._drain(by_name[name])
            if worker_names:
                self.write_workers_file()
        return list(worker_names)

    def flip(
        self, from_role: str, to_role: str, count: int, reason: str = "", drain_timeout_s: float = 0.0
    ) -> list[ProcessPlan]:
        """Move `count` warm workers from `from_role` to `to_role` in place (SetRole: each drains its old
        role's work, then serves the new one with its weights loaded), the fewest running sequences first.
        Returns the workers that flipped, as planned now: the router follows their reported role, and the
        workers file and the plan say it too (a crashed one restarts in it)."""
        members = self.members(from_role)
        chosen = fewest_running({p.name: running_of(self.load(p)) for p in members}, count)
        return self.flip_workers(chosen, to_role, reason, drain_timeout_s)

    def flip_workers(
        self, worker_names: list[str], to_role: str, reason: str = "", drain_timeout_s: float = 0.0
    ) -> list[ProcessPlan]:
        """Move these workers to `to_role` (at once where they leave a worker behind in their pool; a pool's
        last worker is not flipped away); those that flipped, as planned now."""
        with self._lock:
            by_name = {p.name: p for p in self.stack.plans if p.name in worker_names}
            roles = {p.name: p.role for r in FLIPPABLE for p in self.members(r)}
        waves, refused = flip_waves(roles, dict.fromkeys(by_name, to_role))
        if refused:
            log.warning(
                "not flipping %s to %s: each is the last worker of its pool", ", ".join(refused), to_role
            )
        return [p for wave in waves for p in self.flip_wave(wave, to_role, reason, drain_timeout_s)]

    def flip_wave(
        self, worker_names: list[str], to_role: str, reason: str = "", drain_timeout_s: float = 0.0
    ) -> list[ProcessPlan]:
        """Move these workers to `to_role` at once, whatever that leaves in their pools (the caller ordered
        the moves); those that flipped, as planned now."""
        with self._lock:
            by_name = {p.name: p for p in self.stack.plans if p.name in worker_names}
        replies = set_roles(
            {n: self.channels.get(p) for n, p in by_name.items()},
            to_role,
            reason or f"to {to_role}",
            drain_timeout_s,
        )
        flipped: list[ProcessPlan] = []
        with self._lock:
            for name, reply in replies.items():
                if isinstance(reply, lifecycle_pb2.SetRoleReply):
                    old = by_name[name]
                    new = replace(old, role=to_role, argv=with_role(old.argv, to_role))
                    self.stack.plans[self.stack.plans.index(old)] = new
                    flipped.append(new)
            if flipped:
                self.write_workers_file()
        return flipped

    def metrics_targets(self) -> dict[str, list[str]]:
        """Pool (or "router") -> /metrics URLs of the live processes, for the direct-scrape metric source."""
        with self._lock:
            out: dict[str, list[str]] = {}
            for p in self.stack.plans:
                if p.name not in self.stack.running:
                    continue
                host, _, port = p.address.rpartition(":")
                url = (
                    f"http://{p.address}/metrics"
                    if p.role == "router"
                    else f"http://{host}:{p.metrics_port}/metrics"
                )
                out.setdefault(p.role, []).append(url)
            return out

    def replace_crashed(self, role: str) -> list[tuple[str, int]]:
        """Members of `role` that exited without being drained: restarted as new workers (name, exit code)."""
        with self._lock:
            crashed = [p for p in self.members(role) if self.stack.running[p.name].poll() is not None]
            out = []
            for p in crashed:
                out.append((p.name, self.stack.running.pop(p.name).returncode))
                self.stack.plans.remove(p)
                self._start(role)
            if crashed:
                self.write_workers_file()
        return out

    def write_workers_file(self) -> None:
        with self._lock:
            members = [p for p in self.stack.plans if p.name in self.stack.running]
            tmp = self.workers_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(workers_document(members)))
            os.replace(tmp, self.workers_file)  # the router never reads half a file

    def reap(self) -> list[tuple[str, int]]:
        """Drained workers that have exited: (name, exit code); they leave the plan for good."""
        with self._lock:
            gone = [w for w in self.leaving if w.proc.poll() is not None]
            self.leaving = [w for w in self.leaving if w not in gone]
            for w in gone:
                self.exited[w.plan.name] = w.proc.returncode
                if w.plan in self.stack.plans:
                    self.stack.plans.remove(w.plan)
                self.channels.forget(w.plan.address)
        return [(w.plan.name, w.proc.returncode) for w in gone]

    def wait_drained(self, timeout_s: float) -> list[tuple[str, int]]:
        """Block until every draining worker exited (or the timeout passes); their exit codes."""
        deadline = time.monotonic() + timeout_s
        exited: list[tuple[str, int]] = []
        while True:
            exited += self.reap()
            if not self.leaving or time.monotonic() > deadline:
                return exited
            time.sleep(0.1)

    def close(self, grace_s: float = 10.0) -> None:
        """Stop the draining workers that are still finishing (the stack stops the rest)."""
        for w in self.leaving:
            try:
                w.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(w.proc.pid, signal.SIGKILL)
                w.proc.wait()
        self.reap()

    # --- one worker ---------------------------------------------------------------------------
    def _start(self, role: str) -> ProcessPlan:
        with self._lock:
            index = self._next_index[role]
            self._next_index[role] += 1
            p = worker_plan(
                self.svc, self.base, role, index, self.host, free_port_block(2), self.threads, self.tls_root
            )
            self.stack.spawn(p)
        return p

    def _drain(self, p: ProcessPlan) -> None:
        proc = self.stack.running.pop(p.name)  # from now on it is not the stack's to watch: it leaves
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        with self._lock:
            self.leaving.append(Leaving(p, proc, time.monotonic()))


def running_of(report: common_pb2.LoadReport | None) -> int | None:
    """Sequences a worker holds (running and waiting); None when it did not answer."""
    return None if report is None else report.running_sequences + report.waiting_sequences


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def dial(p: ProcessPlan, as_role: str = OPERATOR) -> grpc.Channel:
    """A new channel to a planned worker: mutual TLS with the stack's certificate of `as_role` (a sibling of
    the worker's own folder), asking for the worker's role, when the plan gives it one; else plaintext."""
    tls_dir, service = _flag(p.argv, "--tls-dir"), _flag(p.argv, "--service") or ""
    return dial_worker(p.address, p.role, service, None if tls_dir is None else Path(tls_dir).parent, as_role)


class WorkerChannels:
    """One gRPC channel per worker, kept (a TLS handshake per load report would cost more than the report),
    with the stack's operator identity."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def get(self, p: ProcessPlan) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(p.address)
            if channel is None:
                channel = self._channels[p.address] = dial(p)
            return channel

    def forget(self, address: str) -> None:
        with self._lock:
            channel = self._channels.pop(address, None)
        if channel is not None:
            channel.close()


def load_report(
    p: ProcessPlan, channel: grpc.Channel, timeout_s: float = 2.0
) -> common_pb2.LoadReport | None:
    """A worker's load report over `channel`, or None when it does not answer (starting, or gone)."""
    try:
        return STUBS[p.role](channel).Load(common_pb2.LoadRequest(), timeout=timeout_s)  # type: ignore[attr-defined]
    except grpc.RpcError:
        return None

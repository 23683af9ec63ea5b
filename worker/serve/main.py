"""`tandem worker`: serve one engine over gRPC as a prefill, decode or colocated worker (any of them, by
SetRole), with health and metrics."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import uuid
from concurrent import futures
from dataclasses import dataclass, replace

import grpc
import torch
from grpc_health.v1 import health, health_pb2_grpc

from tandem.identity import FLIPPABLE, Identity
from tandem.options import WorkerOptions
from tandem.v1 import colocated_pb2_grpc, common_pb2, prefill_pb2_grpc
from tandem.worker.api.metrics_http import serve_metrics
from tandem.worker.api.tls import TlsConfig, add_port
from tandem.worker.engine.runner.engine_loop import EngineLoop
from tandem.worker.kv_transport.codec import wire_compression
from tandem.worker.kv_transport.grpc_stream import BULK_CHANNEL_OPTIONS
from tandem.worker.serve.authz import Authorizer
from tandem.worker.serve.drain import Drainer
from tandem.worker.serve.drain import add_to_server as add_drain_service
from tandem.worker.serve.health import HealthWatch
from tandem.worker.serve.metrics import WorkerMetrics
from tandem.worker.serve.prepare import BadOptions, Prepared, prepare, warmed_engine
from tandem.worker.serve.roles import RoleSwitch
from tandem.worker.serve.rpc_limits import RpcLimiter, rpc_limits
from tandem.worker.serve.wire import worker_info

log = logging.getLogger("tandem.worker")
EXIT_WATCHDOG_S = 20  # after the drain: time to close the server and stop the engine before a forced exit


def parse_args(argv: list[str]) -> WorkerOptions:
    opts = WorkerOptions.from_argv(argv)
    return opts if opts.device else replace(opts, device="cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class Started:
    """A started worker: what its drain waits on and its exit stops."""

    server: grpc.Server
    services: dict
    loop: EngineLoop
    drainer: Drainer
    watches: list[object]  # held to the end: a gRPC server stops when it is collected


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    role_field = log_with_role(args.role)
    try:
        prepared = prepare(args)
    except BadOptions as e:
        print(f"tandem worker: {e}", file=sys.stderr)
        return 2
    loop, metrics = start_engine(args, prepared)
    started = start_serving(args, loop, metrics, prepared.transports, role_field, prepared.kv_plan.num_blocks)
    serve_until_drained(started)
    return 0


def log_with_role(role: str) -> RoleField:
    """Logging at the level the environment asks, each line with the worker's role (SetRole changes it)."""
    logging.basicConfig(
        level=os.environ.get("TANDEM_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(role)s %(levelname)s %(message)s",
    )
    role_field = RoleField(role)
    for handler in logging.getLogger().handlers:
        handler.addFilter(role_field)
    return role_field


def start_engine(args: WorkerOptions, prepared: Prepared) -> tuple[EngineLoop, WorkerMetrics]:
    """The engine around the loaded model, warmed up (every path a request can take), watched by its metrics,
    running."""
    engine, phases = warmed_engine(args, prepared)
    metrics = WorkerMetrics(args.service, args.role, model_name=args.served_name).watch(engine)
    for phase, seconds in phases.items():
        metrics.startup[phase].set(seconds)
    log.info("started: weights loaded in %.2f s, warmed up in %.2f s", phases["load"], phases["warmup"])
    if args.metrics_port:
        serve_metrics(args.metrics_port, args.host, metrics.registry)
    return EngineLoop(engine, on_step=metrics.on_step).start(), metrics


def start_serving(
    args: WorkerOptions,
    loop: EngineLoop,
    metrics: WorkerMetrics,
    transports: list[int],
    role_field: RoleField,
    num_blocks: int,
) -> Started:
    """The gRPC server with this worker's services, health, roles and drain, started and announced (READY)."""
    worker_id = args.worker_id or f"{args.role}-{uuid.uuid4().hex[:8]}"
    info = worker_info(loop.engine, worker_id, args.role, args.served_name, transports)
    tls = TlsConfig.optional(args.tls_dir, service=args.service)
    me = own_identity(tls, args.role, args.service)
    server, limiter = _grpc_server(args, me, tls)
    services = _add_servicers(server, args, loop, info, metrics, tls)
    services["decode"].stream_slots = limiter.slots["streams"]  # a Reserve needs a stream to follow it
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    certified = (me.roles & FLIPPABLE) if tls is not None else None
    roles = _roles(args, services, info, health_servicer, certified, metrics, role_field)
    metrics.watch_held(roles.busy)
    drainer = Drainer(roles, health_servicer, args.drain_timeout)
    add_drain_service(server, drainer, roles)
    port = add_port(server, f"{args.host}:{args.port}", tls, args.tls_dir)
    server.start()
    watches = _watch(args, loop, health_servicer, drainer, roles)
    limits = limiter.limits
    log.info(
        "gRPC: %d token streams, %d KV pushes, %d transfers at once, %d control threads",
        limits.streams,
        limits.pushes,
        limits.transfers,
        limits.control,
    )
    log.info(
        "%s worker %s serving %s on %s:%d (%d KV blocks)",
        args.role,
        worker_id,
        args.served_name,
        args.host,
        port,
        num_blocks,
    )
    print(f"READY {args.role} {args.host}:{port}", flush=True)
    return Started(server, services, loop, drainer, watches)


def _grpc_server(args: WorkerOptions, me: Identity, tls: TlsConfig | None) -> tuple[grpc.Server, RpcLimiter]:
    """The server, its threads and its interceptors. Work RPCs are bounded (past the bound: RESOURCE_EXHAUSTED
    at once) and the pool keeps threads for control RPCs, so Load, Abort, Drain and health never queue behind
    token streams; with mutual TLS, each caller's role decides what it may call, checked before any slot is
    taken."""
    limiter = RpcLimiter(rpc_limits(args.max_running_sequences, args.max_streams, args.max_transfers))
    authz = [Authorizer(me)] if tls is not None else []
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=limiter.limits.threads, thread_name_prefix="grpc"),
        interceptors=[*authz, limiter],
        options=BULK_CHANNEL_OPTIONS,
    )
    return server, limiter


def _roles(
    args: WorkerOptions,
    services: dict,
    info: common_pb2.WorkerInfo,
    health_servicer: health.HealthServicer,
    certified: frozenset[str] | None,
    metrics: WorkerMetrics,
    role_field: RoleField,
) -> RoleSwitch:
    """Who answers SetRole, and what the exit drain waits on: the worker's role is state (SetRole drains one
    service's work and opens another's, on the same engine), whichever role it started in."""

    def on_switch(role: str) -> None:
        metrics.set_pool(role)
        role_field.role = role

    roles = RoleSwitch(
        services, args.role, info, health_servicer, certified, args.drain_timeout, on_switch=on_switch
    )
    for servicer in services.values():
        servicer.load_of = roles.load
    return roles


def _watch(
    args: WorkerOptions,
    loop: EngineLoop,
    health_servicer: health.HealthServicer,
    drainer: Drainer,
    roles: RoleSwitch,
) -> list[object]:
    """What watches a started worker: its probes' own server, the engine's health and, in Kubernetes, the
    pod's role label."""
    watches: list[object] = []
    if args.health_port:  # the health service alone, on its own server and threads (and in plaintext)
        probes = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="health"))
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, probes)
        probes.add_insecure_port(f"{args.host}:{args.health_port}")
        probes.start()
        watches.append(probes)
    health_watch = HealthWatch(
        loop, health_servicer, drainer.started.is_set, stall_s=args.engine_stall_seconds
    )
    watches.append(health_watch.start())
    if args.role_file:  # Kubernetes: the pod's role label is its role
        from tandem.worker.serve.role_label import RoleLabelWatch

        watch = RoleLabelWatch(args.role_file, roles)
        watch.check()  # a pod flipped before it restarted starts in its labelled role
        watches.append(watch.start())
    return watches


def serve_until_drained(started: Started) -> None:
    """SIGTERM (Kubernetes, tandem up) or SIGINT: drain, keep serving what finishes held work, then exit."""
    drainer = started.drainer
    signal.signal(signal.SIGTERM, lambda signum, frame: drainer.begin("SIGTERM"))
    signal.signal(signal.SIGINT, lambda signum, frame: drainer.begin("SIGINT"))
    drained = drainer.wait_drained()
    log.info("drained%s; exiting", "" if drained else " (deadline passed)")
    faulthandler.dump_traceback_later(EXIT_WATCHDOG_S, exit=True)  # a stuck thread must not keep the pod
    started.server.stop(grace=2.0).wait()
    started.loop.stop()
    for servicer in started.services.values():
        close = getattr(servicer, "close", None)
        if close is not None:
            close()
    _exit_now(0)


def _exit_now(code: int) -> None:
    """Leave without the interpreter's teardown: with the server closed and the engine stopped nothing is left
    to flush but the logs, and gRPC's and torch's native threads can hang finalization past the watchdog."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class RoleField(logging.Filter):
    """Puts the worker's current role in every log line (it changes with SetRole)."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = self.role
        return True


def own_identity(tls: TlsConfig | None, role: str, service: str) -> Identity:
    """Who this worker is to the authorizer: what its certificate names (both roles for a worker that may
    flip) when that is of its role and service, else its role and service as configured."""
    named = tls.identity() if tls is not None else None
    if named is not None and role in named.roles and named.service == service:
        return named
    return Identity(role, service)


def _add_servicers(server, args, loop, info, metrics, tls) -> dict:
    """The services this worker serves, by role: prefill, decode and colocated, on one engine (one takes work
    at a time: tandem.worker.serve.roles)."""
    from tandem.worker.kv_transport import transports
    from tandem.worker.serve.colocated import ColocatedServicer
    from tandem.worker.serve.decode import DecodeServicer, add_to_server
    from tandem.worker.serve.prefill import PrefillServicer

    # the staging each offered transport lends per reservation (shared-memory rings, CUDA buffers)
    staging = {
        t.kind: t.staging(args.device) for t in transports.REGISTRY if t.staged and t.kind in info.transports
    }
    decode = DecodeServicer(
        loop, info, staging, max_lease_ms=args.kv_lease_ms, kv_authenticated=tls is not None
    )
    add_to_server(server, decode)
    compression = wire_compression(args.kv_compression, args.kv_cache_dtype)  # an 8-bit cache travels raw
    prefill = PrefillServicer(loop, info, compression, metrics, tls=tls)
    prefill_pb2_grpc.add_PrefillServiceServicer_to_server(prefill, server)
    colocated = ColocatedServicer(loop, info)
    colocated_pb2_grpc.add_ColocatedServiceServicer_to_server(colocated, server)
    return {"prefill": prefill, "decode": decode, "colocated": colocated}

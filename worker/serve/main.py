"""`tandem worker`: serve one engine over gRPC as a prefill, decode or colocated worker (any of them, by
SetRole), with health and metrics."""

from __future__ import annotations

import dataclasses
import faulthandler
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, replace

import grpc
import torch
from grpc_health.v1 import health, health_pb2_grpc

from tandem.context_limit import beyond_model
from tandem.identity import FLIPPABLE, Identity
from tandem.options import SPECULATIVE_TOKENS, WorkerOptions
from tandem.v1 import colocated_pb2_grpc, common_pb2, prefill_pb2_grpc
from tandem.worker.api.metrics_http import serve_metrics
from tandem.worker.api.tls import TlsConfig, add_port
from tandem.worker.engine.layers.attention import check_backend
from tandem.worker.engine.loading import engine_for_model, load_model
from tandem.worker.engine.memory import KvCachePlan, plan_kv_cache
from tandem.worker.engine.models.protocol import CausalLM
from tandem.worker.engine.runner.decode_graphs import check_decode_step
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.runner.engine_loop import EngineLoop
from tandem.worker.engine.speculative.proposer import SpeculativeConfig
from tandem.worker.hf.config import ModelConfig
from tandem.worker.kv_transport.codec import wire_compression
from tandem.worker.kv_transport.grpc_stream import BULK_CHANNEL_OPTIONS
from tandem.worker.serve.authz import Authorizer
from tandem.worker.serve.drain import Drainer
from tandem.worker.serve.drain import add_to_server as add_drain_service
from tandem.worker.serve.health import HealthWatch
from tandem.worker.serve.metrics import WorkerMetrics
from tandem.worker.serve.roles import RoleSwitch
from tandem.worker.serve.rpc_limits import RpcLimiter, rpc_limits
from tandem.worker.serve.wire import offered_transports, worker_info

log = logging.getLogger("tandem.worker")
EXIT_WATCHDOG_S = 20  # after the drain: time to close the server and stop the engine before a forced exit


def parse_args(argv: list[str]) -> WorkerOptions:
    opts = WorkerOptions.from_argv(argv)
    return opts if opts.device else replace(opts, device="cuda" if torch.cuda.is_available() else "cpu")


class BadOptions(Exception):
    """Options this worker cannot start with (a check, the model or the memory refused them): `main` says why
    and exits with status 2 before it serves anything."""


@contextmanager
def options_checked() -> Iterator[None]:
    """A ValueError raised inside is the options' fault: it leaves as BadOptions."""
    try:
        yield
    except ValueError as e:
        raise BadOptions(str(e)) from e


@dataclass
class Prepared:
    """What the checks and the load leave for the engine: the model, its config and the KV cache's plan."""

    transports: list[int]
    engine_config: EngineConfig
    model: CausalLM
    kv_plan: KvCachePlan
    loaded_s: float
    kv_plan_s: float  # sizing the cache (on a GPU: a pass at the largest batch)


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


def prepare(args: WorkerOptions) -> Prepared:
    """Check the options, load the model, size its KV cache; BadOptions for what this worker cannot serve."""
    device = args.device or "cpu"  # parse_args chose one
    with options_checked():
        transports = offered_transports(args.kv_transport, device)
    if (
        args.role == "colocated"
    ):  # no staging rings held for KV it may never receive: inline on gRPC if it flips
        transports = [common_pb2.KV_TRANSPORT_GRPC]
    if args.threads:
        torch.set_num_threads(args.threads)
    with options_checked():  # the spec refuses these combinations first; a hand-written command line may not
        engine_config = _engine_config(args)
        check_decode_step(args.decode_step, torch.device(device))
        check_backend(args.attention, torch.device(device))
    started = time.monotonic()
    with options_checked():  # a model the pool's GPUs cannot split, or more ranks than devices
        model = _load(args, device)
    loaded_s = time.monotonic() - started
    if why := beyond_model(engine_config.max_model_len or 0, model.config.max_position_embeddings):
        log.warning("%s (the model's own limit; the router refuses longer prompts)", why)
    with options_checked():  # a draft of the model's first layers needs the model to count them
        if engine_config.speculative is not None:
            engine_config.speculative.check_model(model.config.num_layers)
    planning = time.monotonic()
    with options_checked():  # after the weights: the cache takes what they and the largest batch leave
        kv_plan = plan_kv_cache(model, engine_config, args.num_kv_blocks, args.kv_cache_memory_percent)
    kv_plan_s = time.monotonic() - planning
    log.info(
        "%s; KV stored as %s, weights quantization %s",
        kv_plan.describe(),
        args.kv_cache_dtype,
        args.quantization,
    )
    return Prepared(transports, engine_config, model, kv_plan, loaded_s, kv_plan_s)


def warmed_engine(args: WorkerOptions, prepared: Prepared) -> tuple[Engine, dict[str, float]]:
    """The engine around the loaded model, warmed up (every path a request can take), and the seconds the
    start spent in each phase (names.STARTUP_PHASES; warmup includes decode_graphs)."""
    engine_config = dataclasses.replace(prepared.engine_config, num_kv_blocks=prepared.kv_plan.num_blocks)
    engine, _ = engine_for_model(prepared.model, args.model_dir, engine_config)
    started = time.monotonic()
    # every path a first request can take (compiled graphs, captured buckets, sampling), before the health
    # check says ready: the first request waits on none of them
    from tandem.worker.engine.runner.compiled import warm_up

    log.info("warmed up: %d steps took every path a request can take", warm_up(engine))
    warmup_s = time.monotonic() - started
    graphs = engine.decode_step.warm_up_seconds if engine.decode_step is not None else None
    phases = {
        "load": prepared.loaded_s,
        "kv_plan": prepared.kv_plan_s,
        "warmup": warmup_s,
        "decode_graphs": graphs or 0.0,
    }
    return engine, phases


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


def _load(args: WorkerOptions, device: str) -> CausalLM:
    """The model on one device, or split across `--tensor-parallel` ranks that this process starts."""
    ranks = args.tensor_parallel or 1
    if ranks <= 1:
        model = load_model(args.model_dir, args.dtype, device, args.quantization)
        if args.compile:  # one rank only: tensor parallelism runs eager steps
            from tandem.worker.engine.runner.compiled import compile_layers

            compile_layers(model)
        return model
    from tandem.worker.engine.tp.group import start_ranks
    from tandem.worker.engine.tp.model import load_tensor_parallel
    from tandem.worker.engine.tp.split import tensor_parallel_problem

    problem = tensor_parallel_problem(
        ModelConfig.from_dir(args.model_dir),
        ranks,
        device,
        args.decode_step,
        args.compile,
        torch.cuda.device_count() if device.startswith("cuda") else None,
    )
    if problem:
        raise ValueError(problem)
    group = start_ranks(ranks, device, args.threads)
    log.info(
        "model split across %d tensor-parallel ranks (%s)",
        ranks,
        "NCCL" if device.startswith("cuda") else "gloo",
    )
    # rank 0's view runs the same calls as one model (its forward, logits and KV cache span the ranks)
    return load_tensor_parallel(args.model_dir, args.dtype, args.quantization, group)


def _exit_now(code: int) -> None:
    """Leave without the interpreter's teardown: with the server closed and the engine stopped nothing is left
    to flush but the logs, and gRPC's and torch's native threads can hang finalization past the watchdog."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def speculative_config(args: WorkerOptions) -> SpeculativeConfig | None:
    if args.speculative is None:
        return None
    return SpeculativeConfig(
        method=args.speculative,
        num_tokens=args.speculative_tokens or SPECULATIVE_TOKENS,
        draft_layers=args.speculative_draft_layers,
    )


# Engine knobs WorkerOptions and EngineConfig name alike reach the engine by name; these two differ in kind.
_NOT_BY_NAME = {"num_kv_blocks", "speculative"}  # sized by plan_kv_cache; a method -> a SpeculativeConfig


def _engine_config(args: WorkerOptions) -> EngineConfig:
    by_name = {f.name for f in dataclasses.fields(EngineConfig)} & {f.name for f in dataclasses.fields(args)}
    return EngineConfig(
        **{name: getattr(args, name) for name in by_name - _NOT_BY_NAME},
        **args.engine_knobs,  # the spec's other knobs, by name (tandem/options.py)
        prefix_cache_seed=f"{args.served_name}\0{args.model_dir}\0{args.dtype}\0{args.quantization}\0{args.kv_cache_dtype}",
        speculative=speculative_config(args),
    )


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

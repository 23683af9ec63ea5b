"""`tandem worker`: serve one engine over gRPC as a prefill, decode or colocated worker, with health and metrics."""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import logging
import os
import signal
import sys
import uuid
from concurrent import futures

import grpc
import torch
from grpc_health.v1 import health, health_pb2_grpc

from tandem import names
from tandem.shm_segments import sweep_dead_segments
from tandem.v1 import colocated_pb2_grpc, prefill_pb2_grpc
from tandem.worker.api.metrics_http import serve_metrics
from tandem.worker.api.tls import TlsConfig, add_port
from tandem.worker.engine.decode_graphs import DECODE_STEPS, check_decode_step
from tandem.worker.engine.engine import EngineConfig
from tandem.worker.engine.engine_loop import EngineLoop
from tandem.worker.engine.kv_int8 import KV_CACHE_DTYPES
from tandem.worker.engine.loading import engine_for_model, load_model
from tandem.worker.engine.speculative.proposer import METHODS as SPECULATIVE_METHODS
from tandem.worker.engine.speculative.proposer import SpeculativeConfig
from tandem.worker.engine.weight_int8 import QUANTIZATIONS
from tandem.worker.kv_transport.codec import wire_compression
from tandem.worker.kv_transport.grpc_stream import BULK_CHANNEL_OPTIONS
from tandem.worker.serve.drain import Drainer
from tandem.worker.serve.drain import add_to_server as add_drain_service
from tandem.worker.serve.health import STALL_S, HealthWatch
from tandem.worker.serve.metrics import WorkerMetrics
from tandem.worker.serve.rpc_limits import RpcLimiter, rpc_limits
from tandem.worker.serve.wire import KV_TRANSPORTS, offered_transports, worker_info

log = logging.getLogger("tandem.worker")
EXIT_WATCHDOG_S = 20  # after the drain: time to close the server and stop the engine before a forced exit


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tandem worker", description=__doc__)
    p.add_argument("--role", choices=["prefill", "decode", "colocated"], required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--served-name", default="model")
    p.add_argument("--service", default="default", help="InferenceService name, for metric labels")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=names.GRPC_PORT)
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port (0: off)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-kv-blocks", type=int, default=None, help="default: from --kv-memory-percent")
    p.add_argument(
        "--kv-memory-percent", type=int, default=90,
        help="KV cache share of the GPU memory free after the weights load, less the warm-up batch's activations "
        "(CPU: of a 1 GiB budget)",
    )  # fmt: skip
    p.add_argument("--max-running", type=int, default=64)
    p.add_argument("--max-batch-tokens", type=int, default=2048)
    p.add_argument("--prefill-chunk", type=int, default=512)
    p.add_argument(
        "--max-prefill-tokens-with-decodes", type=int, default=None,
        help="stall-free batching: most prompt tokens in a step that carries decodes (default: no cap)",
    )  # fmt: skip
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--attention", choices=["sdpa", "flex"], default="sdpa", help="attention over the paged cache")
    p.add_argument(
        "--quantization", choices=QUANTIZATIONS, default="none",
        help="weights: int8 quantizes every decoder projection and an untied lm_head as the checkpoint loads",
    )  # fmt: skip
    p.add_argument(
        "--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
        help="KV cache storage: auto (the model's dtype) or int8 (values and a scale per token and head)",
    )  # fmt: skip
    p.add_argument("--compile", action="store_true", help="torch.compile norms and MLPs; warmed up before ready")
    p.add_argument(
        "--decode-step", choices=DECODE_STEPS, default="eager",
        help="pure-decode steps: eager, compiled (static shapes, torch.compile), cudaGraphs (captured per bucket)",
    )  # fmt: skip
    p.add_argument(
        "--speculative", choices=["none", *SPECULATIVE_METHODS], default="none",
        help="speculative decoding: ngram drafts from prompt lookup, draft from the model's own first layers, "
        "verified in one pass per step (none: off)",
    )  # fmt: skip
    p.add_argument("--speculative-tokens", type=int, default=4, help="draft tokens per sequence per step")
    p.add_argument(
        "--speculative-draft-layers", type=int, default=None,
        help="--speculative draft: the model's first this many layers draft (then its final norm and LM head)",
    )  # fmt: skip
    p.add_argument("--kv-compression", choices=["none", "int8"], default="none")
    p.add_argument(
        "--kv-transport", choices=KV_TRANSPORTS, default="auto",
        help="KV transfer: auto (shared memory on one host when the cache is on the CPU, else gRPC), grpc, shm",
    )  # fmt: skip
    p.add_argument("--worker-id", default=None)
    p.add_argument("--tls-dir", default=None, help="mutual TLS: tls.crt, tls.key, ca.crt (default: plaintext)")
    p.add_argument("--tls-server-name", default=None, help="name in the peers' certificates (dialled by IP)")
    p.add_argument(
        "--health-port", type=int, default=0,
        help="also serve grpc.health.v1 alone, in plaintext, on its own server and threads (the kubelet's probes; 0: off)",
    )  # fmt: skip
    p.add_argument(
        "--max-streams", type=int, default=None,
        help="token streams (StreamTokens, Generate) served at once; past it RESOURCE_EXHAUSTED (default: 2 x --max-running)",
    )  # fmt: skip
    p.add_argument(
        "--max-transfers", type=int, default=None,
        help="Reserve and Prefill RPCs served at once (KV pushes: as many as streams); past it RESOURCE_EXHAUSTED (default: --max-running)",
    )  # fmt: skip
    p.add_argument(
        "--engine-stall-seconds", type=float, default=STALL_S,
        help="liveness fails when the engine loop has not come round for this long",
    )  # fmt: skip
    p.add_argument(
        "--drain-timeout", type=float, default=float(os.environ.get("TANDEM_DRAIN_SECONDS", "600")),
        help="on SIGTERM or a Drain RPC, seconds to finish held work before exiting anyway",
    )
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=os.environ.get("TANDEM_LOG_LEVEL", "INFO").upper(), format=f"%(asctime)s {args.role} %(levelname)s %(message)s")
    try:
        transports = offered_transports(args.kv_transport, args.device)
    except ValueError as e:
        print(f"tandem worker: {e}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    from tandem.worker.engine.memory import KvCacheTooSmall, plan_kv_cache

    try:
        engine_config = _engine_config(args)
        check_decode_step(args.decode_step, torch.device(args.device))
    except ValueError as e:  # the spec refuses these combinations first; a hand-written command line may not
        print(f"tandem worker: {e}", file=sys.stderr)
        return 2
    model = load_model(args.model_dir, args.dtype, args.device, args.quantization)
    try:
        if engine_config.speculative is not None:
            engine_config.speculative.check_model(model.config.num_layers)
    except ValueError as e:  # a draft of the model's first layers needs the model to count them
        print(f"tandem worker: {e}", file=sys.stderr)
        return 2
    if args.compile:
        from tandem.worker.engine.compiled import compile_layers

        compile_layers(model)
    try:  # after the weights: the cache takes what they and the largest batch leave
        kv_plan = plan_kv_cache(model, engine_config, args.num_kv_blocks, args.kv_memory_percent)
    except KvCacheTooSmall as e:
        print(f"tandem worker: {e}", file=sys.stderr)
        return 2
    log.info("%s; KV stored as %s, weights quantization %s", kv_plan.describe(), args.kv_cache_dtype, args.quantization)
    num_blocks = kv_plan.num_blocks
    engine, _ = engine_for_model(model, args.model_dir, dataclasses.replace(engine_config, num_kv_blocks=num_blocks))
    if args.compile or args.decode_step != "eager" or (args.attention == "flex" and args.device.startswith("cuda")):
        from tandem.worker.engine.compiled import warm_up

        log.info("warming up compiled graphs (%d steps)", warm_up(engine))  # before the health check says ready
    metrics = WorkerMetrics(args.service, args.role, model_name=args.served_name).watch(engine)
    if args.metrics_port:
        serve_metrics(args.metrics_port, args.host, metrics.registry)
    loop = EngineLoop(engine, on_step=metrics.on_step).start()
    worker_id = args.worker_id or f"{args.role}-{uuid.uuid4().hex[:8]}"
    info = worker_info(engine, worker_id, args.role, args.served_name, transports)
    # Work RPCs are bounded (past the bound: RESOURCE_EXHAUSTED at once) and the pool keeps threads for
    # control RPCs, so Load, Abort, Drain and health never queue behind token streams.
    limits = rpc_limits(args.max_running, args.max_streams, args.max_transfers)
    limiter = RpcLimiter(limits)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=limits.threads, thread_name_prefix="grpc"),
        interceptors=[limiter], options=BULK_CHANNEL_OPTIONS,
    )  # fmt: skip
    tls = TlsConfig.optional(args.tls_dir, args.tls_server_name)
    servicer = _add_servicer(server, args, loop, info, metrics, tls)
    if hasattr(servicer, "stream_slots"):
        servicer.stream_slots = limiter.slots["streams"]  # a Reserve needs a stream to follow it
    metrics.watch_held(servicer.busy)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    drainer = Drainer(servicer, health_servicer, args.drain_timeout)
    add_drain_service(server, drainer)
    port = add_port(server, f"{args.host}:{args.port}", tls)
    server.start()
    if args.health_port:  # the health service alone, on its own server and threads (and in plaintext)
        probes = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="health"))
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, probes)
        probes.add_insecure_port(f"{args.host}:{args.health_port}")
        probes.start()
    HealthWatch(loop, health_servicer, drainer.started.is_set, stall_s=args.engine_stall_seconds).start()
    log.info("gRPC: %d token streams, %d KV pushes, %d transfers at once, %d control threads",
             limits.streams, limits.pushes, limits.transfers, limits.control)  # fmt: skip
    log.info("%s worker %s serving %s on %s:%d (%d KV blocks)", args.role, worker_id, args.served_name, args.host, port, num_blocks)
    print(f"READY {args.role} {args.host}:{port}", flush=True)

    # SIGTERM (Kubernetes, tandem up) or SIGINT: drain, keep serving what finishes held work, then exit.
    signal.signal(signal.SIGTERM, lambda signum, frame: drainer.begin("SIGTERM"))
    signal.signal(signal.SIGINT, lambda signum, frame: drainer.begin("SIGINT"))
    drained = drainer.wait_drained()
    log.info("drained%s; exiting", "" if drained else " (deadline passed)")
    faulthandler.dump_traceback_later(EXIT_WATCHDOG_S, exit=True)  # a stuck thread must not keep the pod
    server.stop(grace=2.0).wait()
    loop.stop()
    close = getattr(servicer, "close", None)
    if close is not None:
        close()
    _exit_now(0)
    return 0


def _exit_now(code: int) -> None:
    """Leave without the interpreter's teardown: with the server closed and the engine stopped nothing is left
    to flush but the logs, and gRPC's and torch's native threads can hang finalization past the watchdog."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def speculative_config(args: argparse.Namespace) -> SpeculativeConfig | None:
    if args.speculative == "none":
        return None
    return SpeculativeConfig(
        method=args.speculative, num_tokens=args.speculative_tokens, draft_layers=args.speculative_draft_layers
    )


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        block_size=args.block_size,
        max_running_sequences=args.max_running,
        max_batch_tokens=args.max_batch_tokens,
        prefill_chunk_tokens=args.prefill_chunk,
        max_prefill_tokens_with_decodes=args.max_prefill_tokens_with_decodes,
        max_model_len=args.max_model_len,
        prefix_cache_seed=f"{args.served_name}\0{args.model_dir}\0{args.dtype}\0{args.quantization}\0{args.kv_cache_dtype}",
        attention=args.attention,
        kv_cache_dtype=args.kv_cache_dtype,
        speculative=speculative_config(args),
        decode_step=args.decode_step,
    )


def _add_servicer(server, args, loop, info, metrics, tls):
    if args.role == "decode":
        from tandem.worker.kv_transport.staging import StagingPool, StagingRing
        from tandem.worker.serve.decode import DecodeServicer, add_to_server

        staging = None
        if info.shm_capable:
            sweep_dead_segments()  # a restart: the rings of the worker it replaces, if that one was killed
            staging = StagingPool([StagingRing.create_shm(64 << 20) for _ in range(4)])
        decode = DecodeServicer(loop, info, staging)
        add_to_server(server, decode)
        return decode
    if args.role == "prefill":
        from tandem.worker.serve.prefill import PrefillServicer

        compression = wire_compression(args.kv_compression, args.kv_cache_dtype)  # an 8-bit cache travels raw
        prefill = PrefillServicer(loop, info, compression, metrics, tls=tls)
        prefill_pb2_grpc.add_PrefillServiceServicer_to_server(prefill, server)
        return prefill
    from tandem.worker.serve.colocated import ColocatedServicer

    colocated = ColocatedServicer(loop, info)
    colocated_pb2_grpc.add_ColocatedServiceServicer_to_server(colocated, server)
    return colocated

"""A worker's engine from its options: checked, its model loaded (one device or across ranks), warmed up."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from tandem.context_limit import beyond_model
from tandem.options import SPECULATIVE_TOKENS, WorkerOptions
from tandem.v1 import common_pb2
from tandem.worker.engine.layers.attention import check_backend
from tandem.worker.engine.loading import engine_for_model, load_model
from tandem.worker.engine.memory import KvCachePlan, plan_kv_cache
from tandem.worker.engine.models.protocol import CausalLM
from tandem.worker.engine.runner.decode_graphs import check_decode_step
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.engine.speculative.proposer import SpeculativeConfig
from tandem.worker.hf.config import ModelConfig
from tandem.worker.serve.wire import offered_transports

log = logging.getLogger("tandem.worker")


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

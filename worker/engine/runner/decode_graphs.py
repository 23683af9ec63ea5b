"""The static-shape decode step: pure-decode steps padded to bucketed shapes, compiled whole, and on CUDA
replayed as one CUDA graph per bucket.

`engine.decodeStep` picks it: `eager` (off: every step takes the engine's general path), `compiled` (the
step is one `torch.compile`d function of its padded inputs: CPU or CUDA), `cudaGraphs` (compiled, then
captured per bucket; each replay copies the step's inputs into the bucket's static buffers). A step runs
here only when it is pure decode (`decode_plan.is_pure_decode`) and no layer hook is set; anything else
takes the general path unchanged. Padding rows write to a scratch block past the block manager's pool
(the cache holds one page more than the manager hands out), so they never touch a sequence's KV.

The batch pads to 2, 4, 8, ... `max_running_sequences` rows and the page table to 2, 4, 8, ... blocks up to
the served context (from 1 when not compiled). The function is compiled once with dynamic shapes (no bucket
has a size 1, which would specialise into a graph of its own), and `warm_up` runs every bucket before the
worker reports ready; with CUDA graphs it captures those a first request can take (the smallest batch, each
width: a capture per bucket is what made start slow) and the rest when a step first needs them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from tandem.spec_engine import DecodeStep
from tandem.worker.engine.core.scheduler import SchedulerOutput
from tandem.worker.engine.layers.kv_int8 import write_slots
from tandem.worker.engine.layers.static_decode import StaticDecodeBatch
from tandem.worker.engine.models.protocol import CausalLM
from tandem.worker.engine.runner.decode_plan import (
    DecodeInputs,
    blocks_for,
    bucket_for,
    buckets,
    first_request_shapes,
    is_pure_decode,
    padded_decode_inputs,
)
from tandem.worker.engine.runner.step_inputs import HostStaging

log = logging.getLogger(__name__)

DECODE_STEPS = tuple(d.value for d in DecodeStep)  # eager (off), compiled, cudaGraphs
CUDA_GRAPHS_NEED_CUDA = "engine.decodeStep cudaGraphs needs a CUDA device; use compiled (or eager) elsewhere"


def check_decode_step(decode_step: str, device: torch.device) -> None:
    """Refuse a decode step this device cannot run (CUDA graphs off CUDA is an error, not a silent
    fallback)."""
    if decode_step not in DECODE_STEPS:
        raise ValueError(f"decodeStep must be one of {', '.join(DECODE_STEPS)}, got {decode_step!r}")
    if decode_step == "cudaGraphs" and device.type != "cuda":
        raise ValueError(CUDA_GRAPHS_NEED_CUDA)


class DecodeStepRunner:
    """Runs pure-decode steps through one static-shape function per bucket (compiled; CUDA graphs
    optional)."""

    def __init__(
        self,
        model: CausalLM,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        block_size: int,
        max_seqs: int,
        max_model_len: int,
        scratch_block: int,
        staging: HostStaging,
        compile: bool = True,
        cuda_graphs: bool = False,
        attention: str = "sdpa",  # sdpa gathers each row's pages; triton reads them in place (others: sdpa)
    ):
        self.model, self.k, self.v = model, k_caches, v_caches
        self.block_size, self.scratch_block, self.staging = block_size, scratch_block, staging
        self.attention = "triton" if attention == "triton" else "sdpa"
        self.device = k_caches[0].device
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError(CUDA_GRAPHS_NEED_CUDA)
        smallest = 2 if compile else 1  # one compiled graph for every bucket: dynamic sizes, none of them 1
        self.batch_sizes = buckets(max_seqs, smallest)
        self.widths = buckets(blocks_for(max_model_len, block_size), smallest)
        self.compiled, self.cuda_graphs = compile, cuda_graphs
        self._fn = torch.compile(self._forward) if compile else self._forward  # dims marked dynamic per call
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._static: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}
        self._logits: torch.Tensor | None = None  # [max batch, V]: every graph writes its rows here
        self.steps = 0  # steps this runner ran (metrics, tests)
        self.warm_up_seconds: float | None = None

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """Every (padded batch, table width) bucket, largest first (CUDA graphs share one memory pool); the
        first has a batch unlike its width where one does, so the compiled graph does not take them to be
        equal."""
        shapes = [(b, w) for b in reversed(self.batch_sizes) for w in reversed(self.widths)]
        first = next((s for s in shapes if s[0] != s[1]), shapes[0])
        return [first, *(s for s in shapes if s != first)]

    # --- the step ------------------------------------------------------------------------------
    def _forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        context_lens: torch.Tensor,
        table: torch.Tensor,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """(logits [B, V] float32, each layer's new keys and values): the pass reads the cache, never writes
        it."""
        batch = StaticDecodeBatch(slot_mapping, table, context_lens, self.block_size, self.attention)
        hidden = self.model(input_ids, positions, self.k, self.v, batch)
        return self.model.logits(hidden), batch.new_kv

    def _step(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The compiled pass, then each layer's new keys and values written to their slots (eager: in
        place)."""
        logits, new_kv = self._fn(*inputs)
        slots = inputs[2]
        for (k, v), k_cache, v_cache in zip(new_kv, self.k, self.v, strict=True):
            write_slots(k_cache, slots, k)
            write_slots(v_cache, slots, v)
        return logits

    def inputs(self, sched: SchedulerOutput) -> DecodeInputs | None:
        """The step's padded inputs, or None when it is not a pure-decode step this runner takes."""
        seqs = sched.seqs
        if not is_pure_decode(sched.num_new_tokens, sched.drafts, [s.num_uncomputed for s in seqs]):
            return None
        positions = [s.num_computed for s in seqs]
        shape = (
            bucket_for(len(seqs), self.batch_sizes),
            bucket_for(blocks_for(max(positions) + 1, self.block_size), self.widths),
        )
        tokens = [s.token_ids[p] for s, p in zip(seqs, positions, strict=True)]
        tables: Sequence[Sequence[int]] = [s.block_table for s in seqs]
        return padded_decode_inputs(tokens, positions, tables, shape, self.block_size, self.scratch_block)

    def run(self, sched: SchedulerOutput) -> torch.Tensor | None:
        """The step's logits [S, V] (one row per sequence, in order), or None: the engine's general path runs
        it."""
        inputs = self.inputs(sched)
        if inputs is None:
            return None
        self.steps += 1
        return self.execute(inputs)

    def execute(self, inputs: DecodeInputs) -> torch.Tensor:
        put = self.staging.to_device
        host = (inputs.input_ids, inputs.positions, inputs.slot_mapping, inputs.context_lens, inputs.table)
        names = ("decode_ids", "decode_positions", "decode_slots", "decode_context", "decode_table")
        if not self.cuda_graphs:
            return self._step(*self._dynamic([put(name, t) for name, t in zip(names, host, strict=True)]))[
                : inputs.num_seqs
            ]
        shape = inputs.shape
        graph = self._graphs.get(shape)
        if (
            graph is None
        ):  # warm_up captures a first request's buckets; the others are captured when first needed
            log.info("capturing decode bucket %s on its first use", shape)
            self._capture(padded_decode_inputs([], [], [], shape, self.block_size, self.scratch_block))
            graph = self._graphs[shape]
        for static, name, t in zip(self._static[shape], names, host, strict=True):
            static.copy_(put(name, t), non_blocking=True)
        graph.replay()
        assert self._logits is not None
        return self._logits[: inputs.num_seqs]

    def _dynamic(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Mark the padded batch (and the table's width) dynamic, so one compiled graph serves every bucket;
        the cache, the weights and the model's sizes stay static."""
        if self.compiled:
            for t in inputs:
                torch._dynamo.maybe_mark_dynamic(t, 0)
            torch._dynamo.maybe_mark_dynamic(inputs[-1], 1)
        return inputs

    # --- before serving ------------------------------------------------------------------------
    @property
    def start_shapes(self) -> list[tuple[int, int]]:
        """The buckets `warm_up` runs before the worker is ready: compiled only, every one (one dynamic graph,
        cheap per bucket); with CUDA graphs, those a first request can take (the smallest batch, every width),
        each captured once, and the larger batches' buckets captured when a step first needs them."""
        if not self.cuda_graphs:
            return self.shapes
        return first_request_shapes(self.shapes, self.batch_sizes[0])

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Compile (and on CUDA capture) the start buckets on padding-only inputs; returns the seconds it
        took."""
        start = time.monotonic()
        for shape in self.start_shapes:
            inputs = padded_decode_inputs([], [], [], shape, self.block_size, self.scratch_block)
            if self.cuda_graphs:
                self._capture(inputs)
            else:
                self.execute(inputs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.warm_up_seconds = time.monotonic() - start
        return self.warm_up_seconds

    def _capture(self, inputs: DecodeInputs) -> None:
        """Run the bucket on its static buffers (compiling it), then capture it; the graphs share one pool."""
        shape = inputs.shape
        host = (inputs.input_ids, inputs.positions, inputs.slot_mapping, inputs.context_lens, inputs.table)
        static = self._static[shape] = tuple(self._dynamic([t.to(self.device) for t in host]))
        if self._logits is None:
            vocab = self.model.config.vocab_size
            self._logits = torch.empty(self.batch_sizes[-1], vocab, dtype=torch.float32, device=self.device)
            self._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # compile, then one clean run (library workspaces) before capture
                self._step(*static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._logits[: shape[0]].copy_(self._step(*static))
        self._graphs[shape] = graph

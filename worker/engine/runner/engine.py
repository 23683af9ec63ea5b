"""The engine: one explicit step (schedule, execute, update) over a paged KV cache and a torch model.

The same engine runs in every pool. A prefill worker adds requests with `max_tokens=1` and a layer hook
that pushes each layer's KV as soon as it is written; a decode worker reserves blocks for an incoming
transfer and admits the sequence straight into its running batch once the KV has landed. With
`speculative` set, decoding sequences also run draft tokens each step and keep the longest prefix the
model agrees with, plus the model's own next token (greedy output is unchanged, token for token; under
temperature, rejection sampling keeps each token's distribution). The draft method's proposer runs this
engine's own model, its first layers only, over this engine's cache (speculative/draft_model.py).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tandem.worker.api.params import InvalidRequest, PromptLogprobs, SamplingParams
from tandem.worker.engine.core.block_manager import BlockManager
from tandem.worker.engine.core.grammar import GrammarVocab, constrain_logits, constraint_for, top_logprobs
from tandem.worker.engine.core.sampling import apply_penalties, sample, sampling_probs
from tandem.worker.engine.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from tandem.worker.engine.core.sequence import Sequence
from tandem.worker.engine.layers.attention import BACKENDS, check_backend
from tandem.worker.engine.layers.kv_int8 import KV_INT8_NEEDS_SDPA, is_packed
from tandem.worker.engine.models.protocol import CausalLM
from tandem.worker.engine.runner.decode_graphs import DECODE_STEPS, DecodeStepRunner, check_decode_step
from tandem.worker.engine.runner.sample_rows import SampleRows, per_drawn, sample_rows
from tandem.worker.engine.runner.step_inputs import HostStaging, build_step_inputs
from tandem.worker.engine.runner.step_paths import STATIC_DECODE, forward_paths, sampling_paths
from tandem.worker.engine.speculative.proposer import Proposer, SpeculativeConfig, make_proposer
from tandem.worker.engine.speculative.rejection import verify_sampled
from tandem.worker.engine.speculative.speculator import Speculator, accepted_prefix
from tandem.worker.hf.config import served_context_length

log = logging.getLogger(__name__)


@dataclass
class EngineConfig:
    block_size: int = 16
    num_kv_blocks: int = 1024
    max_running_sequences: int = 64
    max_batch_tokens: int = 2048
    prefill_chunk_tokens: int = 512
    max_prefill_tokens_with_decodes: int | None = None  # stall-free batching cap (scheduler.py); None: off
    max_model_len: int | None = None  # defaults to the model's max positions
    enable_prefix_caching: bool = True
    prefix_cache_seed: str = ""  # the model's identity: roots every prefix hash chain
    attention: str = (
        "sdpa"  # sdpa (reference: gathers each context) | flex | triton (both read the cache in place)
    )
    speculative: SpeculativeConfig | None = None  # draft tokens verified per decode step (None: off)
    kv_cache_dtype: str = "auto"  # auto: the model's dtype | int8 (values and per-token-head scales, kv_int8)
    decode_step: str = (
        "eager"  # eager | compiled | cudaGraphs: pure-decode steps padded and compiled (decode_graphs)
    )

    def __post_init__(self) -> None:
        if self.attention not in BACKENDS:
            raise ValueError(f"attention must be one of {', '.join(BACKENDS)}, got {self.attention!r}")
        if is_packed(self.kv_cache_dtype) and self.attention == "flex":
            raise ValueError(KV_INT8_NEEDS_SDPA)
        if self.decode_step not in DECODE_STEPS:
            raise ValueError(
                f"decode_step must be one of {', '.join(DECODE_STEPS)}, got {self.decode_step!r}"
            )


@dataclass
class StepOutput:
    """A token produced this step for one request (`finish_reason` set on its last one)."""

    request_id: str
    token_id: int
    logprob: float
    finish_reason: str | None
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first
    prompt_logprobs: PromptLogprobs | None = None  # on the first token, when its params ask


# Called after each layer: (layer index, what ran this step).
EngineLayerHook = Callable[[int, SchedulerOutput], None]


class Engine:
    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig,
        eos_token_ids: tuple[int, ...] = (),
        grammar_vocab: GrammarVocab | None = None,  # what grammar-constrained requests need (None: refused)
    ):
        self.model, self.config = model, config
        self.grammar_vocab = grammar_vocab
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.max_model_len = served_context_length(model.config.max_position_embeddings, config.max_model_len)
        check_decode_step(config.decode_step, self.device)
        check_backend(config.attention, self.device)
        static_decode = (
            config.decode_step != "eager"
        )  # its padding rows write to one more page, past the pool
        self.kv = model.kv_cache(  # tensor parallel: this rank's KV heads, read and written across the ranks
            config.num_kv_blocks + int(static_decode),
            config.block_size,
            self.dtype,
            self.device,
            config.kv_cache_dtype,
        )
        self.blocks = BlockManager(
            config.num_kv_blocks,
            config.block_size,
            config.enable_prefix_caching,
            config.prefix_cache_seed.encode(),
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                config.max_running_sequences,
                config.max_batch_tokens,
                config.prefill_chunk_tokens,
                config.max_prefill_tokens_with_decodes,
            ),
            self.blocks,
        )
        self.eos_token_ids = (
            eos_token_ids  # stop strings are the router's: it sees the text, the engine sees ids
        )
        self.seqs: dict[str, Sequence] = {}
        self.layer_hook: EngineLayerHook | None = None
        self.last_schedule: SchedulerOutput | None = None  # for metrics
        self._ids = itertools.count()
        self.paths_run: set[str] = set()  # the step paths this engine has run (step_paths.py)
        self.ready = False  # set once warmed up: a path first run after it is a cold path a request waited on
        self.cold_after_ready: list[str] = []
        self.staging = HostStaging(self.device)
        spec = config.speculative
        self.speculator = Speculator(spec, self._proposer(spec)) if spec is not None else None
        self.decode_step: DecodeStepRunner | None = None
        if static_decode:
            self.decode_step = DecodeStepRunner(
                model,
                self.kv.k,
                self.kv.v,
                config.block_size,
                config.max_running_sequences,
                self.max_model_len,
                scratch_block=config.num_kv_blocks,
                staging=self.staging,
                cuda_graphs=config.decode_step == "cudaGraphs",
                attention=config.attention,
            )

    def _proposer(self, spec: SpeculativeConfig) -> Proposer:
        if spec.draft_layers is None:
            return make_proposer(spec)
        from tandem.worker.engine.speculative.draft_model import early_exit_proposer

        return early_exit_proposer(self, spec.draft_layers)  # the first layers of this engine's model

    # --- requests ------------------------------------------------------------------------------
    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise InvalidRequest("prompt is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise InvalidRequest(
                f"prompt has {len(prompt_ids)} tokens; the model's context is {self.max_model_len} tokens"
            )
        vocab = self.model.config.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise InvalidRequest(f"prompt token ids must be in [0, {vocab})")
        if self.blocks.blocks_needed(len(prompt_ids) + 1) > self.blocks.num_blocks:
            raise InvalidRequest(f"prompt of {len(prompt_ids)} tokens does not fit in the KV cache")
        if params.grammar:  # refuse a grammar llguidance cannot compile before any KV moves
            constraint_for(params, self.grammar_vocab, self.eos_token_ids)

    def add_request(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        self.validate(prompt_ids, params)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.seqs:
            raise InvalidRequest(f"duplicate request id {request_id!r}")
        seq = Sequence(request_id, list(prompt_ids), params)
        seq.constraint = constraint_for(params, self.grammar_vocab, self.eos_token_ids)
        self.seqs[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> bool:
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq, "abort")
        return True

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # --- the decode side of a KV transfer ------------------------------------------------------
    def reserve(self, prompt_ids: list[int], params: SamplingParams) -> tuple[list[int], int]:
        """Blocks for an incoming prompt's KV; returns (block table, tokens already cached by prefix)."""
        self.validate(prompt_ids, params)
        return self.blocks.allocate_prompt(prompt_ids, cache_salt=params.cache_salt)

    def release(self, block_table: list[int]) -> None:
        self.blocks.release(block_table)

    def admit_prefilled(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        block_table: list[int],
        first_token: int,
        first_logprob: float = 0.0,
        first_top_logprobs: list[tuple[int, float]] | None = None,
        share: bool = True,
    ) -> list[StepOutput]:
        """Start decoding a sequence whose prompt KV already sits in `block_table`; its first token (sampled
        where the prompt ran) also advances its grammar here, before this engine samples the second. With
        `share`, its full blocks join the prefix cache (only KV from an authenticated prefill worker may)."""
        seq = Sequence(
            request_id,
            list(prompt_ids),
            params,
            block_table=block_table,
            num_computed=len(prompt_ids),
            shared=share,
        )
        seq.constraint = constraint_for(params, self.grammar_vocab, self.eos_token_ids)
        self.seqs[request_id] = seq
        self.scheduler.add_running(seq)
        self.scheduler.publish_full_blocks(seq)
        return [self._append(seq, first_token, first_logprob, first_top_logprobs or [])]

    # --- one step ------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        drafts = (
            self.speculator.drafts(self.scheduler.running, self.max_model_len) if self.speculator else None
        )
        sched = self.last_schedule = self.scheduler.schedule(drafts)
        if not sched:
            return []
        logits = self._execute(sched)
        return self._update(sched, logits)

    @torch.inference_mode()
    def _execute(self, sched: SchedulerOutput) -> torch.Tensor | None:
        if self.decode_step is not None and self.layer_hook is None:
            logits = self.decode_step.run(sched)  # None unless the step is pure decode
            if logits is not None:
                self._ran(STATIC_DECODE)
                return logits
        self._ran(*forward_paths(sched.num_new_tokens, sched.drafts))
        inputs = build_step_inputs(sched, self.config.block_size, self.config.attention, self.staging)
        hook = None
        if self.layer_hook is not None:
            layer_hook = self.layer_hook

            def hook(layer: int) -> None:
                layer_hook(layer, sched)

        hidden = self.model(inputs.input_ids, inputs.positions, self.kv.k, self.kv.v, inputs.batch, hook)
        self._score_prompts(sched, hidden)
        if not inputs.num_sampled:
            return None
        return self.model.logits(hidden.index_select(0, inputs.sample_rows))  # stays on the device

    def _score_prompts(self, sched: SchedulerOutput, hidden: torch.Tensor) -> None:
        """Record, for the sequences whose params ask, the logprobs of the prompt tokens this step's rows
        predict (the row at position p scores the token at p + 1), with their rank and the likeliest there."""
        at = 0  # each sequence's first row: its own tokens, then its drafts (step_inputs' order)
        for seq, n, draft in zip(sched.seqs, sched.num_new_tokens, sched.drafts, strict=True):
            start, k = seq.num_computed, seq.params.prompt_logprobs
            positions = (
                []
                if k is None
                else [p for p in range(start, start + n - len(draft)) if p + 1 < len(seq.prompt_ids)]
            )
            if positions:
                rows = torch.tensor([at + p - start for p in positions], device=hidden.device)
                logp = torch.log_softmax(self.model.logits(hidden.index_select(0, rows)).float(), dim=-1)
                targets = torch.tensor([seq.prompt_ids[p + 1] for p in positions], device=hidden.device)
                picked = logp.gather(1, targets[:, None])
                ranks = (logp > picked).sum(-1) + 1
                tops = top_logprobs(logp, [k or 0] * len(positions))
                for p, lp, rank, top in zip(
                    positions, picked[:, 0].tolist(), ranks.tolist(), tops, strict=True
                ):
                    seq.prompt_scores[p + 1] = (lp, rank, top)
            at += n

    def _update(self, sched: SchedulerOutput, logits: torch.Tensor | None) -> list[StepOutput]:
        """Advance what this step computed, sample where sequences reached their last token, emit (and verify
        drafts)."""
        to_sample = self._advance_computed(sched)
        if not to_sample:
            return []
        assert logits is not None
        layout = sample_rows([len(d) for _, d in to_sample], [s.params.greedy for s, _ in to_sample])
        drawn = self._draw(to_sample, layout, logits)
        out: list[StepOutput] = []
        for i, (seq, draft) in enumerate(to_sample):
            if not draft:
                tokens, logprobs, tops = drawn[i]
                out.append(self._append(seq, tokens[0], logprobs[0], tops[0]))
                continue
            if i in drawn:  # greedy drafts: verified by comparison
                tokens, logprobs, _ = drawn[i]
            else:  # drafts under temperature: rejection sampling keeps the distribution
                tokens, logprobs = self._verify_sampled(seq, draft, logits[layout.rows_of(i)])
            out += self._verify(seq, draft, tokens, logprobs)
        return out

    def _advance_computed(self, sched: SchedulerOutput) -> list[tuple[Sequence, list[int]]]:
        """Count this step's tokens as computed; returns the sequences that sample now, each with its drafts
        (a sequence with drafts advances once they are verified: only the accepted ones stay in the cache)."""
        to_sample: list[tuple[Sequence, list[int]]] = []
        for seq, n, draft in zip(sched.seqs, sched.num_new_tokens, sched.drafts, strict=True):
            if draft:
                to_sample.append((seq, draft))
                continue
            self.scheduler.advance(seq, n)
            if seq.num_computed == seq.num_tokens:
                to_sample.append((seq, draft))
        return to_sample

    def _draw(
        self, to_sample: list[tuple[Sequence, list[int]]], layout: SampleRows, logits: torch.Tensor
    ) -> dict[int, tuple[list[int], list[float], list[list[tuple[int, float]]]]]:
        """The batched sampler over the drawn rows: for each drawn sequence, its tokens, logprobs and
        alternatives."""
        rows = layout.drawn_rows
        if not rows:
            return {}
        seqs = [to_sample[i][0] for i in layout.drawn for _ in range(layout.sizes[i])]
        self._ran(
            *sampling_paths(
                [s.params for s in seqs], [s.constraint is not None and s.constraint.active for s in seqs]
            )
        )
        picked = logits
        if len(rows) < layout.num_rows:
            picked = logits.index_select(0, torch.tensor(rows).to(logits.device, non_blocking=True))
        if any(s.params.penalized for s in seqs):
            # each row's output so far: a draft row's includes the drafts before it
            outputs = [
                s.output_ids + d[:j]
                for s, d in (to_sample[i] for i in layout.drawn)
                for j in range(len(d) + 1)
            ]
            picked = apply_penalties(picked, [s.params for s in seqs], [s.prompt_ids for s in seqs], outputs)
        picked = constrain_logits(picked, [s.constraint for s in seqs], self.eos_token_ids)
        tokens, logprobs = sample(picked, [s.params for s in seqs], [s.generator for s in seqs])
        tops = top_logprobs(picked, [s.params.top_logprobs if s.params.logprobs else 0 for s in seqs])
        by_token, by_logprob, by_top = (per_drawn(layout, v) for v in (tokens, logprobs, tops))
        return {i: (by_token[i], by_logprob[i], by_top[i]) for i in layout.drawn}

    def _ran(self, *paths: str) -> None:
        """Record the step paths this step takes; one first taken after the engine is ready is a cold path."""
        for path in paths:
            if path not in self.paths_run:
                self.paths_run.add(path)
                if self.ready:
                    self.cold_after_ready.append(path)
                    log.warning("step path %r ran for the first time after the worker was ready", path)

    def _verify(
        self, seq: Sequence, draft: list[int], target: list[int], logprobs: list[float]
    ) -> list[StepOutput]:
        """Emit the drafts the model agrees with and its own next token, stopping where the request ends."""
        assert self.speculator is not None
        accepted = accepted_prefix(draft, target)
        self.speculator.record(seq, len(draft), accepted)
        out: list[StepOutput] = []
        reason = None
        for token, logprob in zip(target[: accepted + 1], logprobs[: accepted + 1], strict=True):
            seq.append_output(token, logprob)
            reason = self._finish_reason(seq)
            out.append(StepOutput(seq.request_id, token, logprob, reason))
            if reason is not None:
                break
        # in the cache: the token before the drafts and the accepted drafts that were emitted
        self.scheduler.advance(seq, len(out))
        if reason is not None:
            self.scheduler.finish(seq, reason)
            self.seqs.pop(seq.request_id, None)
        else:
            self.scheduler.release_unused(seq)
        return out

    def _verify_sampled(
        self, seq: Sequence, draft: list[int], logits: torch.Tensor
    ) -> tuple[list[int], list[float]]:
        """The tokens a speculative-sampling verify emits, padded to one per row (only a prefix is
        emitted)."""
        n = len(logits)
        if seq.params.penalized:
            logits = apply_penalties(
                logits, [seq.params] * n, [seq.prompt_ids] * n, [seq.output_ids + draft[:j] for j in range(n)]
            )
        emitted = verify_sampled(sampling_probs(logits, [seq.params] * n), draft, seq.generator)
        logprobs = [0.0] * len(emitted)
        if seq.params.logprobs:
            rows = torch.log_softmax(logits[: len(emitted)], dim=-1)
            logprobs = rows.gather(1, torch.tensor(emitted, device=rows.device)[:, None])[:, 0].tolist()
        pad = len(draft) + 1 - len(emitted)  # after a rejection: `_verify` stops at the first mismatch
        return emitted + [-1] * pad, logprobs + [0.0] * pad

    def _append(
        self, seq: Sequence, token: int, logprob: float, top: list[tuple[int, float]] | None = None
    ) -> StepOutput:
        seq.append_output(token, logprob)
        reason = self._finish_reason(seq)
        if reason is not None:
            self.scheduler.finish(seq, reason)
            self.seqs.pop(seq.request_id, None)
        prompt = None
        if seq.params.prompt_logprobs is not None and len(seq.output_ids) == 1:
            prompt = [seq.prompt_scores[p] for p in range(1, len(seq.prompt_ids))]
        return StepOutput(seq.request_id, token, logprob, reason, top or [], prompt)

    def _finish_reason(self, seq: Sequence) -> str | None:
        p, token = seq.params, seq.output_ids[-1]
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    # --- introspection for load reports and tests ----------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def queued_prompt_tokens(self) -> int:
        waiting = sum(s.num_uncomputed for s in self.scheduler.waiting)
        return waiting + sum(s.num_uncomputed for s in self.scheduler.running if s.in_prefill)

"""`tandem generate`: a one-shot completion through the engine, for a quick check of any checkpoint."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn, TextIO

from tandem.worker.api.params import InvalidRequest, SamplingParams
from tandem.worker.engine.runner.engine import Engine, EngineConfig
from tandem.worker.hf.config import ModelLoadError
from tandem.worker.hf.tokenizer import ChatTemplateError, StreamDecoder, Tokenizer

PROG = "tandem generate"
BLOCK_SIZE = 16


class UsageError(Exception):
    """Bad command-line input: reported as one line on stderr with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage dump
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="One-shot completion through the tandem engine.")
    p.add_argument("--model", required=True, help="Hugging Face model directory")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument(
        "--chat", action="store_true", help="wrap the prompt as a user message in the chat template"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    return p


@dataclass
class Completion:
    """What `--json` prints."""

    prompt: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion: str
    finish_reason: str | None
    ttft_ms: float
    tpot_ms: float | None  # None when only one token was generated


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )


def prompt_ids(tokenizer: Tokenizer, prompt: str, chat: bool) -> tuple[str, list[int]]:
    """The text the model sees and its token ids (a chat prompt already carries its BOS)."""
    if not prompt:
        raise InvalidRequest("prompt is empty")
    if chat:
        messages = [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(messages), tokenizer.encode_chat(messages)
    return prompt, tokenizer.encode(prompt)


def kv_blocks_for(num_prompt: int, max_tokens: int) -> int:
    """Just enough KV blocks for one sequence, so a large model does not preallocate a huge cache."""
    return -(-(num_prompt + max_tokens + 1) // BLOCK_SIZE) + 1


def stream_tokens(
    engine: Engine, ids: list[int], params: SamplingParams
) -> Iterator[tuple[int, str | None, float]]:
    """(token id, finish reason, seconds since the request was added) for each generated token."""
    start = time.perf_counter()
    request_id = engine.add_request(ids, params)
    while engine.has_work():
        for out in engine.step():
            if out.request_id == request_id:
                yield out.token_id, out.finish_reason, time.perf_counter() - start


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def generate(args: argparse.Namespace, out: TextIO) -> Completion:
    from tandem.worker.engine.loading import build_engine

    if not Path(args.model).is_dir():
        raise ModelLoadError(f"{args.model}: model directory does not exist")
    params = sampling_params(args)
    tokenizer = Tokenizer.from_dir(args.model)
    text, ids = prompt_ids(tokenizer, args.prompt, args.chat)
    config = EngineConfig(block_size=BLOCK_SIZE, num_kv_blocks=kv_blocks_for(len(ids), params.max_tokens))
    engine, tokenizer = build_engine(args.model, config, args.dtype, args.device or default_device())
    decoder = StreamDecoder(tokenizer, ids)
    tokens: list[int] = []
    times: list[float] = []
    finish_reason: str | None = None
    for token, reason, elapsed in stream_tokens(engine, ids, params):
        tokens.append(token)
        times.append(elapsed)
        finish_reason = reason
        if not args.json:
            out.write(decoder.push(token))
            out.flush()
    if not args.json:
        out.write(decoder.flush() + "\n")
        out.flush()
    return Completion(
        prompt=text,
        prompt_token_ids=ids,
        completion_token_ids=tokens,
        completion=tokenizer.decode(tokens),
        finish_reason=finish_reason,
        ttft_ms=round(times[0] * 1e3, 3),
        tpot_ms=round((times[-1] - times[0]) / (len(times) - 1) * 1e3, 3) if len(times) > 1 else None,
    )


def main(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
        result = generate(args, sys.stdout)
    except (UsageError, InvalidRequest, ModelLoadError, ChatTemplateError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(asdict(result), ensure_ascii=False))
    return 0

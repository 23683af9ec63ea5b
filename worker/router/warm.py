"""The router's request path taken once before it serves, so that the first request pays no one-time cost
(the worker thread prompts are templated on, the imports behind it, the chat template's compile)."""

from __future__ import annotations

import logging
import time

import anyio.to_thread

from tandem.worker.hf.tokenizer import Tokenizer
from tandem.worker.router import openai_schema as oa
from tandem.worker.router.admission import chat_prompt_ids

log = logging.getLogger(__name__)

CANNED_CHAT = {"model": "warm-up", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def warm_request_path(tokenizer: Tokenizer) -> float:
    """Template, tokenize and turn into sampling parameters one canned chat request, on the thread a request
    runs them on; the seconds it took."""
    started = time.monotonic()
    req = oa.ChatCompletionRequest.model_validate(CANNED_CHAT)
    try:
        await anyio.to_thread.run_sync(chat_prompt_ids, req, tokenizer)
        await anyio.to_thread.run_sync(req.sampling_params, 1)
    except Exception as e:  # a model without a chat template: its requests say why, the router still serves
        log.info("request path not warmed up: %s", e)
        return time.monotonic() - started
    took = time.monotonic() - started
    log.info("request path warmed up in %.3f s", took)
    return took

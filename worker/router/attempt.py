"""One attempt of a request on the workers picked for it: both phases on one worker, or reserve, prefill
and relay across two; a worker failure before the first token raises Retry (dispatch.py tries elsewhere)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from tandem.v1 import (
    common_pb2,
    decode_pb2,
    prefill_pb2,
)
from tandem.worker.api.wire import (
    FINISH_NAMES,
    params_to_proto,
    prompt_logprobs_from_proto,
    top_logprobs_from_proto,
)
from tandem.worker.router.backend import TokenOut
from tandem.worker.router.disaggregation import observe_tpot
from tandem.worker.router.membership import Worker
from tandem.worker.router.worker_errors import (
    is_draining,
    kv_link_failed,
    note_unavailable,
    note_unreachable,
    raise_client_error,
)


class Retry(Exception):
    """This attempt failed before any token reached the client; try other workers."""


async def generate_on(worker, request_id, prompt_ids, params, timing, tried) -> AsyncIterator[TokenOut]:
    """Both phases on one worker: a colocated one, or a decode worker prefilling locally."""
    tried.add(worker.view.address)
    timing.decode_worker = timing.prefill_worker = worker.view.address
    worker.in_use += 1
    call = worker.stub.Generate(  # type: ignore[attr-defined]
        common_pb2.GenerateRequest(
            request_id=request_id, prompt_token_ids=prompt_ids, sampling=params_to_proto(params)
        )
    )
    worker.view.inflight_requests += 1
    worker.view.inflight_prompt_tokens += len(prompt_ids)  # until its first token: a prompt ahead of others
    queued = True
    try:
        async for token in relay(call, worker):
            if queued:
                worker.view.inflight_prompt_tokens -= len(prompt_ids)
                queued = False
            yield token
    finally:
        if queued:
            worker.view.inflight_prompt_tokens -= len(prompt_ids)
        worker.view.inflight_requests -= 1
        worker.in_use -= 1
        call.cancel()


async def reserve_prefill_relay(
    request_id, prompt_ids, params, timing, decode, prefill, lease_ms: int
) -> AsyncIterator[TokenOut]:
    """The split path: reserve the prompt's blocks on `decode` for `lease_ms`, open its token stream, have
    `prefill` run the prompt and push the KV there, then relay the tokens; the reservation is freed on any
    end but a finished stream."""
    transfer_id = uuid.uuid4().hex
    sampling = params_to_proto(params)
    prefill_info = prefill.info or common_pb2.WorkerInfo()
    try:
        reservation = await decode.stub.Reserve(  # type: ignore[attr-defined]
            decode_pb2.ReserveRequest(
                transfer_id=transfer_id,
                request_id=request_id,
                prompt_token_ids=prompt_ids,
                sampling=sampling,
                lease_ms=lease_ms,
                transports=prefill_info.transports,
                prefill_host_id=prefill_info.host_id,
                prefill_cuda_device_uuid=prefill_info.cuda_device_uuid,
            ),
            timeout=10,
        )
    except aio.AioRpcError as e:
        raise_client_error(e)
        note_unavailable(decode, e)
        raise Retry(f"reserve on {decode.view.address}: {e.code().name} {e.details()}") from None
    except asyncio.CancelledError:  # the client left while the blocks were being reserved: free them now
        await abort_decode(decode, transfer_id, request_id, "the request ended during its reservation")
        raise
    stream = decode.stub.StreamTokens(decode_pb2.StreamTokensRequest(request_id=request_id))  # type: ignore[attr-defined]
    decode.view.inflight_requests += 1
    prefill.view.inflight_prompt_tokens += len(prompt_ids)
    prefill_call = prefill.stub.Prefill(  # type: ignore[attr-defined]
        prefill_pb2.PrefillRequest(
            request_id=request_id,
            transfer_id=transfer_id,
            prompt_token_ids=prompt_ids,
            sampling=sampling,
            decode_address=decode.view.address,
            reservation=reservation,
        ),
        timeout=max(30.0, lease_ms / 1000),
    )
    ended = False  # the decode worker finished the stream or already knows the request is gone
    try:
        try:
            reply = await prefill_call
            timing.kv_bytes = reply.kv_bytes
            timing.extra.update(
                prefill_compute_s=reply.timings.compute_s,
                kv_transfer_tail_s=reply.timings.transfer_tail_s,
            )
        except aio.AioRpcError as e:
            prefill.view.inflight_prompt_tokens -= len(prompt_ids)
            ended = True
            await abort_decode(decode, transfer_id, request_id, "prefill failed")
            raise_client_error(e)
            if kv_link_failed(e):
                await note_unreachable(decode, e)
            else:
                note_unavailable(prefill, e)
            raise Retry(f"prefill on {prefill.view.address}: {e.code().name} {e.details()}") from None
        prefill.view.inflight_prompt_tokens -= len(prompt_ids)
        async for token in relay(stream, decode):
            yield token
        ended = True
    finally:
        decode.view.inflight_requests -= 1
        stream.cancel()
        prefill_call.cancel()
        if (
            not ended
        ):  # the client left or the stream broke: free the decode reservation now, not at lease expiry
            await abort_decode(decode, transfer_id, request_id, "the request ended before its answer")


_ABORTS: set[asyncio.Task] = (
    set()
)  # aborts still in flight, held so they finish even if their caller is cancelled


async def abort_decode(decode: Worker, transfer_id: str, request_id: str, reason: str) -> None:
    """Tell the decode worker to drop the reservation and the sequence. Runs to its end even when the
    request that asked is being cancelled; a worker that cannot be reached frees them at lease expiry."""

    async def abort() -> None:
        with contextlib.suppress(aio.AioRpcError):
            await decode.stub.Abort(  # type: ignore[attr-defined]
                decode_pb2.AbortRequest(transfer_id=transfer_id, request_id=request_id, reason=reason),
                timeout=2,
            )

    task = asyncio.ensure_future(abort())
    _ABORTS.add(task)
    task.add_done_callback(_ABORTS.discard)
    await asyncio.shield(task)


NORMAL_ENDS = ("stop", "length")  # the only ends a client may see as a finished answer


async def relay(call, worker: Worker) -> AsyncIterator[TokenOut]:
    """Token events of one worker stream as TokenOut; worker failures become Retry. The gaps between a
    stream's tokens feed the worker's recent TPOT. A stream that ends without a token for any reason but
    stop or length (a worker-side abort, an error) is a failure, never a finished answer."""
    last_token_at = None
    try:
        async for event in call:
            if event.has_token:
                now = time.monotonic()
                if last_token_at is not None:
                    worker.view.recent_tpot_s = observe_tpot(worker.view.recent_tpot_s, now - last_token_at)
                last_token_at = now
                reason = FINISH_NAMES.get(event.finish_reason) if event.finish_reason else None
                prompt = prompt_logprobs_from_proto(event.prompt_logprobs)
                yield TokenOut(
                    event.token_id, event.logprob, reason, top_logprobs_from_proto(event.top_logprobs), prompt
                )
                if reason:
                    return
            elif event.finish_reason:
                reason = FINISH_NAMES.get(event.finish_reason, "error")
                if reason in NORMAL_ENDS and not event.error:
                    return
                raise Retry(
                    f"{worker.view.address}: the stream ended with {reason}: {event.error or 'no token'}"
                )
    except aio.AioRpcError as e:
        raise_client_error(e)
        if is_draining(e):
            worker.view.draining = True
        elif e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
            worker.mark_failed()
        raise Retry(f"{worker.view.address}: {e.code().name} {e.details()}") from None

"""How the router reads a worker's gRPC error: a bad request (the client's fault), a worker that drains, one
that is full, one that failed, or a KV link that broke between a prefill and a decode worker."""

from __future__ import annotations

import time

import grpc
from grpc import aio

from tandem import names
from tandem.worker.router.backend import BackendError
from tandem.worker.router.membership import Worker, poll


def raise_client_error(e: aio.AioRpcError) -> None:
    """A request the worker refused as invalid is the client's: a 400 with the worker's reason, no retry."""
    if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
        raise BackendError(e.details() or "invalid request", status=400) from None


def is_draining(e: aio.AioRpcError) -> bool:
    """The worker refused because it drains (it says so in trailing metadata), not because it failed."""
    return any(
        key == names.DRAINING_METADATA_KEY and value == "1" for key, value in (e.trailing_metadata() or ())
    )


KV_TRANSFER_FAILED = (
    "KV transfer failed"  # how a prefill worker reports that its push to the decode worker broke
)


def kv_link_failed(e: aio.AioRpcError) -> bool:
    """The prefill worker ran the prompt but could not reach the decode worker: the decode side (or the
    link to it) is what failed, and a healthy prefill worker stays in rotation."""
    details = e.details() or ""
    full = "RESOURCE_EXHAUSTED" in details  # the decode worker was at its limit: full, not failed
    return e.code() == grpc.StatusCode.UNAVAILABLE and details.startswith(KV_TRANSFER_FAILED) and not full


def note_unavailable(worker: Worker, e: aio.AioRpcError) -> None:
    """Out of rotation: a draining worker at once, an unreachable one for the failure window."""
    if is_draining(e):
        worker.view.draining = True  # out of rotation now; its next load report says the same
    elif e.code() == grpc.StatusCode.UNAVAILABLE:
        worker.mark_failed()


LINK_SUSPECT_S = 10.0  # a second KV link failure to one decode worker this soon after the first fails it


async def note_unreachable(decode: Worker, e: aio.AioRpcError) -> None:
    """A prefill worker could not push to this decode worker. Out of rotation if the router cannot reach it
    either (or it drains), or if a push to it already broke in the last LINK_SUSPECT_S (the link stays
    broken); one push that broke once (a connect that timed out under load) does not take a live worker
    out."""
    now = time.monotonic()
    if now < decode.link_suspect_until:
        note_unavailable(decode, e)
        return
    decode.link_suspect_until = now + LINK_SUSPECT_S
    await poll(decode)  # the router asks it itself: a dead one leaves rotation, a draining one says so

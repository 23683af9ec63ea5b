"""How the router's failures become HTTP answers: one mapping from an exception to an OpenAI-shaped error
(status, message, Retry-After on every "not now"), and the app's handlers for what no route catches."""

from __future__ import annotations

import logging
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tandem.worker.api.params import InvalidRequest
from tandem.worker.hf.tokenizer import ChatTemplateError
from tandem.worker.router import openai_schema as oa
from tandem.worker.router.backend import BackendError

log = logging.getLogger(__name__)
Req = TypeVar("Req", bound=oa.SamplingRequest)


def error_of(exc: BaseException) -> oa.ApiError:
    """The HTTP error a failure maps to."""
    if isinstance(exc, oa.ApiError):
        return exc
    if isinstance(exc, InvalidRequest | ChatTemplateError):
        return oa.ApiError(400, str(exc))
    if isinstance(exc, BackendError):
        return oa.ApiError(exc.status, str(exc), retry_after_s=exc.retry_after_s)
    return oa.ApiError(500, f"internal error: {type(exc).__name__}")


BUSY_RETRY_AFTER_S = 1  # a 429 or 503 that names no delay of its own


def error_response(err: oa.ApiError) -> JSONResponse:
    retry_after = err.retry_after_s
    if retry_after is None and err.status in (429, 503):  # every "not now" answer says when to come back
        retry_after = BUSY_RETRY_AFTER_S
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(
        oa.error_body(err.status, err.message, err.param, err.code), err.status, headers=headers
    )


def parse_request(model: type[Req], body: bytes) -> Req:
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        message, param = oa.describe_validation_error(e)
        raise oa.ApiError(400, message, param=param) from None


def add_error_handlers(app: FastAPI) -> None:
    """Unknown paths (404), wrong methods (405) and unexpected errors answer in the OpenAI error shape too."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = error_response(oa.ApiError(exc.status_code, str(exc.detail)))
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(Exception)
    async def unexpected_error(_: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=exc)
        return error_response(oa.ApiError(500, f"internal error: {type(exc).__name__}"))

"""The OpenAI error shape: the exception a request is answered with, its body, and a one-line reason for a
request body that fails validation."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error"}
FIELD_HINTS = {"prompt": "must be a string, a list of token ids, or a one-element list of either"}


class ApiError(Exception):
    """A request answered with an OpenAI error body and this HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after_s = retry_after_s


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def describe_validation_error(error: ValidationError) -> tuple[str, str | None]:
    """A one-line message and the offending top-level field for a pydantic validation failure.

    A field typed as a union (`stop: str | list[str]`) fails once per branch; the branch whose type
    matched says what is wrong (a length, a range), so its error wins over "should be a valid string".
    """
    by_field: dict[str, list[Any]] = {}
    for e in error.errors(include_url=False):
        if e["type"] == "json_invalid":
            return f"request body is not valid JSON: {e['msg']}", None
        if e["type"] == "extra_forbidden":  # a field this server does not know is refused, never ignored
            e = {**e, "msg": "unknown field: this server does not implement it"}
        loc = [str(x) for x in e["loc"]]
        by_field.setdefault(loc[0] if loc else "body", []).append(e)
    parts = []
    for field, errors in by_field.items():
        e = next((x for x in errors if not x["type"].endswith("_type")), errors[0])
        where = ".".join(str(x) for x in e["loc"] if not _is_type_tag(x))
        hint = FIELD_HINTS.get(field) if e["type"] != "missing" else None
        parts.append(f"{where or 'body'}: {hint or e['msg']}")
    return "; ".join(parts) or "invalid request", next(iter(by_field), None)


def _is_type_tag(loc_part: Any) -> bool:
    """Union branch names pydantic puts in an error location (`str`, `list[int]`, `constrained-str`)."""
    return isinstance(loc_part, str) and (
        "[" in loc_part or "-" in loc_part or loc_part in ("str", "int", "float", "bool")
    )

"""The base of every spec type (camelCase in YAML, snake_case in Python, unknown fields refused), and the
helpers that declare the CRD's CEL rules beside the fields they constrain (tandem.crdgen)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Spec(BaseModel):
    # A field's docstring is its description in the CRD (tandem.crdgen) and in `kubectl explain`.
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", use_attribute_docstrings=True
    )


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """A CEL rule the API server checks (one of a schema's x-kubernetes-validations), declared beside what it
    constrains; `field_path` (relative, `.minReplicas`) is the field the refusal names."""
    return {"rule": rule, "message": message} | ({"fieldPath": field_path} if field_path else {})


def rules(*checks: dict[str, str], **schema: Any) -> dict[str, Any]:
    """A json_schema_extra: the CEL `checks` and any other schema keys (Kubernetes' spelling)."""
    return ({"x-kubernetes-validations": list(checks)} if checks else {}) | schema

"""`spec.gateway`: routing from Gateway API Gateways through an upstream InferencePool."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from tandem.spec_base import Spec


class GatewayParentRef(Spec):
    """A Gateway (gateway.networking.k8s.io) the service's HTTPRoute attaches to."""

    name: str = Field(min_length=1)
    """The Gateway's name."""
    namespace: str | None = None
    """The Gateway's namespace (default: the InferenceService's)."""
    section_name: str | None = None
    """A listener of the Gateway, by name (default: every listener that allows the route)."""


class FailureMode(StrEnum):
    fail_open = "FailOpen"
    fail_close = "FailClose"


class EndpointPickerRef(Spec):
    """The Gateway API Inference Extension's endpoint picker Service for the service's InferencePool."""

    name: str = Field(min_length=1)
    """The picker's Service, in the InferenceService's namespace."""
    port: int = Field(9002, ge=1, le=65535)
    """The picker's gRPC ext-proc port."""
    failure_mode: FailureMode = FailureMode.fail_close
    """What the Gateway does when the picker does not answer: FailOpen routes to any router pod, FailClose
    refuses."""


class GatewaySpec(Spec):
    """Routing from Gateways: an upstream InferencePool over the router pods and an HTTPRoute for the served
    model name."""

    parent_refs: list[GatewayParentRef] = Field(min_length=1, max_length=32)
    """The Gateways the HTTPRoute attaches to (one Gateway can front many InferenceServices)."""
    endpoint_picker_ref: EndpointPickerRef
    """The Inference Extension's endpoint picker Service for this InferencePool (deployed with the extension's
    chart)."""

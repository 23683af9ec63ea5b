"""`spec.gateway`: routing from Gateway API Gateways through an upstream InferencePool."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from tandem.spec_base import Spec


class GatewayParentRef(Spec):
    """A Gateway (gateway.networking.k8s.io) the service's HTTPRoute attaches to."""

    name: str = Field(min_length=1)
    namespace: str | None = None
    section_name: str | None = None


class FailureMode(StrEnum):
    fail_open = "FailOpen"
    fail_close = "FailClose"


class EndpointPickerRef(Spec):
    """The Gateway API Inference Extension's endpoint picker Service for the service's InferencePool."""

    name: str = Field(min_length=1)
    port: int = Field(9002, ge=1, le=65535)
    failure_mode: FailureMode = FailureMode.fail_close


class GatewaySpec(Spec):
    """Routing from Gateways: an upstream InferencePool over the router pods and an HTTPRoute for the served
    model name."""

    parent_refs: list[GatewayParentRef] = Field(min_length=1)
    endpoint_picker_ref: EndpointPickerRef

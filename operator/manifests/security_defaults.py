"""Cluster-wide security defaults (the chart's `defaultSecurity`) for InferenceServices that leave a part
of `spec.security` unset: a platform team turns on mutual TLS or API keys once for every tenant."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping

from tandem.spec import InferenceServiceSpec
from tandem.spec_security import SecuritySpec

ENV = "TANDEM_DEFAULT_SECURITY"  # JSON, the shape of spec.security
# JSON, a NetworkPolicyPeer: the operator's own pods (the chart sets it), admitted to every metrics port so
# the autoscaler's direct scrape is not blocked by the services' NetworkPolicies.
OPERATOR_PEER_ENV = "TANDEM_OPERATOR_PEER"


def parse(text: str) -> SecuritySpec | None:
    """The defaults in `text` (JSON of spec.security); None when empty. Raises ValueError when invalid."""
    if not text.strip():
        return None
    return SecuritySpec.model_validate(json.loads(text))


def from_env(environ: Mapping[str, str] = os.environ) -> SecuritySpec | None:
    return parse(environ.get(ENV, ""))


@functools.cache
def process_defaults() -> SecuritySpec | None:
    return from_env()


def with_defaults(spec: InferenceServiceSpec, defaults: SecuritySpec | None) -> InferenceServiceSpec:
    """`spec` with each security part it does not set (not even to null) taken from `defaults` (pure)."""
    if defaults is None:
        return spec
    own = spec.security.model_fields_set
    updates = {f: getattr(defaults, f) for f in defaults.model_fields_set if f not in own}
    if not updates:
        return spec
    return spec.model_copy(update={"security": spec.security.model_copy(update=updates)})


@functools.cache
def operator_peer() -> dict | None:
    """The operator's pods as a NetworkPolicyPeer, from the chart; None when run outside a cluster."""
    text = os.environ.get(OPERATOR_PEER_ENV, "").strip()
    if not text:
        return None
    peer = json.loads(text)
    if not isinstance(peer, dict) or not peer:
        raise ValueError(f"{OPERATOR_PEER_ENV} must be a JSON NetworkPolicyPeer object")
    return peer

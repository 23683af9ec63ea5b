"""The InferenceService: its spec's root (the mode and every section), the rules across sections, and the
parsing of a whole object, shared by the operator, the local backend and the workers.

The same YAML a user `kubectl apply`s is parsed here; camelCase in YAML, snake_case in Python.
Integers in milliseconds, never floats, as the Kubernetes API conventions ask.
Each section's types live in a module of their own (tandem/spec_<section>.py) and are imported from there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_snake

from tandem.spec_autoscaling import AutoscalingSpec, SloSpec
from tandem.spec_base import Spec as _Spec
from tandem.spec_base import cel
from tandem.spec_engine import EngineSpec
from tandem.spec_gateway import GatewaySpec
from tandem.spec_model import ModelSpec
from tandem.spec_router import DisaggregationMode, RouterSpec
from tandem.spec_security import SecuritySpec
from tandem.spec_workers import POOL_DEFAULT, KvTransferSpec, PoolSpec

API_GROUP = "serving.tandem.dev"
API_VERSION = "v1alpha1"
KIND = "InferenceService"


class Mode(StrEnum):
    disaggregated = "disaggregated"
    colocated = "colocated"
    auto = "auto"


AUTOSCALING_FLIP_NEEDS_ROLE_FLIP = (
    "spec.autoscaling.flip.enabled needs roleFlip: true (workers that hold certificates for both roles) and "
    "mode disaggregated or auto"
)
AUTO_NEEDS_AUTOSCALING = (
    "spec.mode auto needs autoscaling.enabled and roleFlip: true: the autoscaler chooses the shape "
    "(colocated workers or a prefill/decode split) and changes it by flipping warm workers, which hold "
    "certificates for every worker role"
)


def _spec_rules(schema: dict[str, Any]) -> None:
    """The CRD's rules across sections of the spec, each naming its field (fieldPath) in the types' words."""
    autoscaled = "has(self.autoscaling) && has(self.autoscaling.enabled) && self.autoscaling.enabled"
    flips = (
        "has(self.autoscaling) && has(self.autoscaling.flip) && has(self.autoscaling.flip.enabled) && "
        "self.autoscaling.flip.enabled"
    )
    schema["x-kubernetes-validations"] = [
        cel(
            f"{autoscaled} || !has(self.decode) || !has(self.decode.minReplicas) || self.decode.minReplicas "
            "> 0",
            f"spec.decode.{MIN_ZERO_NEEDS_AUTOSCALING}",
            ".decode.minReplicas",
        ),
        cel(
            f"{autoscaled} || {_COLOCATED} || !has(self.prefill) || !has(self.prefill.minReplicas) || "
            "self.prefill.minReplicas > 0",
            f"spec.prefill.{MIN_ZERO_NEEDS_AUTOSCALING}",
            ".prefill.minReplicas",
        ),
        cel(
            f"!({flips}) || has(self.roleFlip) && self.roleFlip && (!has(self.mode) || self.mode != "
            "'colocated')",
            AUTOSCALING_FLIP_NEEDS_ROLE_FLIP,
            ".autoscaling.flip.enabled",
        ),
        cel(
            f"!has(self.mode) || self.mode != 'auto' || {autoscaled} && has(self.roleFlip) && self.roleFlip",
            AUTO_NEEDS_AUTOSCALING,
            ".mode",
        ),
        *(rule.crd_rule(path) for rule in IGNORED_BY_MODE for path in rule.fields),
    ]


class InferenceServiceSpec(_Spec):
    """What to serve and how: the model, its prefill and decode pools, the router, SLOs and autoscaling."""

    model_config = ConfigDict(json_schema_extra=_spec_rules)

    model: ModelSpec
    """The model to serve."""
    mode: Mode = Mode.disaggregated
    """colocated runs prefill and decode in one pool (sized by spec.decode), the baseline; auto lets the
    autoscaler choose between colocated workers and the split as the load and the SLO call for (it needs
    autoscaling.enabled and roleFlip)."""
    image: str = Field(default="tandem-worker:0.1.0", min_length=1, pattern=r"^\S+$")
    """The tandem image every worker and router container runs."""
    router: RouterSpec = Field(default_factory=RouterSpec)
    """The OpenAI-compatible router Deployment in front of the pools."""
    prefill: PoolSpec = Field(default_factory=PoolSpec, json_schema_extra={"default": POOL_DEFAULT})
    """The prefill pool (prompt processing; sets TTFT). In colocated mode spec.decode sizes the one pool, and
    a prefill setting other than its default is refused."""
    decode: PoolSpec = Field(default_factory=PoolSpec, json_schema_extra={"default": POOL_DEFAULT})
    """The decode pool (token generation; sets TPOT). In colocated mode it sizes the one pool."""
    slo: SloSpec = Field(default_factory=SloSpec)
    """Latency objectives: the router reports attainment against them and the autoscaler sizes each pool for
    them."""
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    """The built-in SLO autoscaler. While enabled it owns each pool's replica count, within minReplicas and
    maxReplicas."""
    role_flip: bool = False
    """Workers may change role at runtime (the autoscaler, or the serving.tandem.dev/role label): each holds a
    certificate naming every worker role (prefill, decode, colocated)."""
    kv_transfer: KvTransferSpec = Field(default_factory=KvTransferSpec)
    """How prefill workers hand the KV cache to decode workers."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """The inference engine inside each worker."""
    security: SecuritySpec = Field(default_factory=SecuritySpec)
    """Who may call the service and how its hops are protected."""
    gateway: GatewaySpec | None = None
    """Routing from Gateway API Gateways: the operator renders an InferencePool
    (inference.networking.k8s.io/v1, named <name>-router) selecting the router pods, and an HTTPRoute
    (<name>-router) that sends requests whose X-Gateway-Model-Name header is model.servedName (set from the
    body's model by the Inference Extension's body-based routing) to it. Needs the Gateway API and Inference
    Extension CRDs. Unset: no Gateway objects."""

    @model_validator(mode="after")
    def _flips_need_workers_that_flip(self) -> InferenceServiceSpec:
        if self.autoscaling.flip.enabled and (not self.role_flip or self.mode is Mode.colocated):
            raise ValueError(AUTOSCALING_FLIP_NEEDS_ROLE_FLIP)
        return self

    @model_validator(mode="after")
    def _auto_needs_the_autoscaler_and_flips(self) -> InferenceServiceSpec:
        if self.mode is Mode.auto and not (self.autoscaling.enabled and self.role_flip):
            raise ValueError(AUTO_NEEDS_AUTOSCALING)
        return self

    @model_validator(mode="after")
    def _zero_needs_autoscaling(self) -> InferenceServiceSpec:
        pools = (
            {"decode": self.decode}
            if self.mode is Mode.colocated
            else {"prefill": self.prefill, "decode": self.decode}
        )
        for pool, p in pools.items():
            if not self.autoscaling.enabled and p.min_replicas == 0:
                raise ValueError(f"spec.{pool}.{MIN_ZERO_NEEDS_AUTOSCALING}")
        return self

    @model_validator(mode="after")
    def _nothing_the_mode_ignores(self) -> InferenceServiceSpec:
        for rule in IGNORED_BY_MODE:
            if rule.applies(self):
                for path in rule.fields:
                    if _at(self, path) != _at(_DEFAULTS, path):
                        raise ValueError(rule.message(path))
        return self


MIN_ZERO_NEEDS_AUTOSCALING = (
    "minReplicas 0 needs autoscaling.enabled: only the autoscaler wakes a pool from zero"
)


@dataclass(frozen=True)
class Ignored:
    """Settings a mode never reads: refused unless left at their default, so a spec says only what runs.
    `when` is the mode in words and `cel` the same test over the CRD's `self` (the spec); `fields` the
    settings, as the YAML spells their paths below spec."""

    when: str
    applies: Callable[[InferenceServiceSpec], bool]
    cel: str
    fields: tuple[str, ...]
    why: str

    def message(self, path: str) -> str:
        return f"spec.{path} is ignored in {self.when}: {self.why}"

    def crd_rule(self, path: str) -> dict[str, str]:
        """The CRD's rule for one of the settings: outside the mode, unset, or at its default."""
        parts = path.split(".")
        unset = [f"!has(self.{'.'.join(parts[: i + 1])})" for i in range(len(parts))]
        default = _at(_DEFAULTS, path)
        if isinstance(default, dict | list):
            unset.append(f"size(self.{path}) == 0")
        elif default is not None:
            unset.append(f"self.{path} == {_cel_literal(default)}")
        return cel(f"!({self.cel}) || {' || '.join(unset)}", self.message(path), f".{path}")


_POOL_FIELDS = (
    "replicas",
    "minReplicas",
    "maxReplicas",
    "resources.gpus",
    "resources.cpu",
    "resources.memory",
    "nodeSelector",
    "tolerations",
    "affinity",
    "env",
    "podTemplate",
)
_CONDITIONAL_ONLY = (
    "localPrefillMaxTokens",
    "prefillQueueTokens",
    "localPrefillMaxTpotFraction",
    "mixedDecodeRatio",
)
_COLOCATED = "has(self.mode) && self.mode == 'colocated'"

IGNORED_BY_MODE = (
    Ignored(
        "mode colocated",
        lambda s: s.mode is Mode.colocated,
        _COLOCATED,
        tuple(f"prefill.{f}" for f in _POOL_FIELDS),
        "one pool serves both phases, sized by spec.decode",
    ),
    Ignored(
        "mode colocated",
        lambda s: s.mode is Mode.colocated,
        _COLOCATED,
        tuple(f"router.disaggregation.{f}" for f in ("mode", *_CONDITIONAL_ONLY)),
        "every prompt is prefilled where it decodes",
    ),
    Ignored(
        "mode colocated",
        lambda s: s.mode is Mode.colocated,
        _COLOCATED,
        ("kvTransfer.transport", "kvTransfer.compression", "kvTransfer.leaseMs"),
        "no KV moves between workers",
    ),
    Ignored(
        "mode colocated",
        lambda s: s.mode is Mode.colocated,
        _COLOCATED,
        ("roleFlip",),
        "only a disaggregated service's workers change role",
    ),
    Ignored(
        "router.disaggregation.mode always or never",
        lambda s: (
            s.mode is not Mode.colocated
            and s.router.disaggregation.mode is not DisaggregationMode.conditional
        ),
        "(!has(self.mode) || self.mode != 'colocated') && !(has(self.router) && "
        "has(self.router.disaggregation) && has(self.router.disaggregation.mode) && "
        "self.router.disaggregation.mode == 'conditional')",
        tuple(f"router.disaggregation.{f}" for f in _CONDITIONAL_ONLY),
        "only mode conditional reads it",
    ),
)


def _cel_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # a StrEnum too
        return f"'{value}'"
    return repr(value)


def _at(spec: BaseModel, path: str) -> Any:
    """The value at a YAML path below spec (`prefill.resources.gpus`)."""
    node: Any = spec
    for alias in path.split("."):
        node = getattr(node, to_snake(alias))
    return node


_DEFAULTS = InferenceServiceSpec.model_construct()


class InferenceService(BaseModel):
    """A whole object as read from YAML: name, namespace and the spec."""

    name: str
    namespace: str = "default"
    spec: InferenceServiceSpec


def parse_object(obj: dict[str, Any]) -> InferenceService:
    """Validate a YAML/JSON InferenceService object; raises ValueError with the field path on bad input."""
    if obj.get("kind") != KIND or not str(obj.get("apiVersion", "")).startswith(API_GROUP + "/"):
        raise ValueError(
            f"expected kind {KIND} in {API_GROUP}, got {obj.get('kind')!r} {obj.get('apiVersion')!r}"
        )
    meta = obj.get("metadata") or {}
    if not meta.get("name"):
        raise ValueError("metadata.name is required")
    return InferenceService(
        name=meta["name"],
        namespace=meta.get("namespace", "default"),
        spec=InferenceServiceSpec.model_validate(obj.get("spec") or {}),
    )


def load_file(path: str | Path) -> InferenceService:
    """Read the first InferenceService document from a YAML file."""
    for doc in yaml.safe_load_all(Path(path).read_text()):
        if doc and doc.get("kind") == KIND:
            return parse_object(doc)
    raise ValueError(f"{path}: no {KIND} document found")
